//! The tests' independent view of device code: a `.hip_fatbin` splitter
//! written from the bundle formats (deliberately not kpack's parser, so
//! that the ground-truth tests do not check kpack against itself) and
//! LLVM's `clang-offload-bundler`, the ground truth for what a bundle holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
const CCOB_MAGIC: &[u8] = b"CCOB";

/// Where Debian's LLVM 19 tools live (clang-offload-bundler, llvm-objcopy...).
pub const LLVM_BIN: &str = "/usr/lib/llvm-19/bin";

/// LLVM 19's tools directory (`KPACK_LLVM_BIN`, else [`LLVM_BIN`]).
pub fn llvm_bin() -> PathBuf {
    std::env::var_os("KPACK_LLVM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(LLVM_BIN))
}

/// The top-level bundles of a `.hip_fatbin` section, skipping zero
/// padding: a plain bundle ends at the furthest of its entry table and its
/// entries' data; a compressed (CCOB v2/v3) bundle carries its total size.
pub fn split_bundles(data: &[u8]) -> Result<Vec<&[u8]>> {
    let mut bundles = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let rest = &data[pos..];
        if rest[0] == 0 {
            pos += 1;
            continue;
        }
        let len = if rest.starts_with(BUNDLE_MAGIC) {
            uncompressed_len(rest)
        } else if rest.starts_with(CCOB_MAGIC) {
            compressed_len(rest)
        } else {
            bail!("no bundle at offset {pos:#x} of .hip_fatbin")
        }
        .with_context(|| format!("bundle at offset {pos:#x}"))?;
        bundles.push(&rest[..len]);
        pos += len;
    }
    Ok(bundles)
}

/// Length of an uncompressed bundle: the end of its entry table or of its
/// furthest entry, whichever is later.
fn uncompressed_len(bundle: &[u8]) -> Result<usize> {
    let count = read_u64(bundle, 24)?;
    let mut pos = 32;
    let mut end = 0;
    for _ in 0..count {
        let offset = read_u64(bundle, pos)?;
        let size = read_u64(bundle, pos + 8)?;
        let triple_len = read_u64(bundle, pos + 16)?;
        pos = add(pos + 24, triple_len)?;
        end = end.max(add(usize::try_from(offset)?, size)?);
    }
    let end = end.max(pos);
    ensure!(end <= bundle.len(), "bundle runs past the section");
    Ok(end)
}

/// Length of a compressed bundle (header + payload).
fn compressed_len(bundle: &[u8]) -> Result<usize> {
    let version = u16::from_le_bytes(field(bundle, 4)?);
    let total = match version {
        2 => u64::from(u32::from_le_bytes(field(bundle, 8)?)),
        3 => read_u64(bundle, 8)?,
        _ => bail!("CCOB version {version} has no total size"),
    };
    let total = usize::try_from(total)?;
    ensure!(
        total <= bundle.len(),
        "compressed bundle runs past the section"
    );
    Ok(total)
}

fn add(a: usize, b: u64) -> Result<usize> {
    a.checked_add(usize::try_from(b)?).context("size overflows")
}

fn read_u64(data: &[u8], at: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(field(data, at)?))
}

fn field<const N: usize>(data: &[u8], at: usize) -> Result<[u8; N]> {
    data.get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .context("truncated bundle header")
}

/// Run a program; its stdout, or an error with its stderr.
fn output(cmd: &mut Command) -> Result<String> {
    let o = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        o.status.success(),
        "{cmd:?} failed ({}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The device entries of one bundle (plain, or compressed with zstd: the
/// first inner bundle) as its entry table gives them: (triple, bytes), in
/// table order, host entries left out. LLVM 19's `clang-offload-bundler`
/// cannot name processors it does not know (it lists and looks up
/// `...--gfx1250-strict` as `...--gfx1250-strict-`): for those, this is
/// the oracle's ground truth.
pub fn entries(bundle: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
    let plain;
    let bundle = if bundle.starts_with(CCOB_MAGIC) {
        plain = decompress_ccob(bundle)?;
        &plain[..]
    } else {
        bundle
    };
    entry_table(bundle)?
        .into_iter()
        .map(|(triple, range)| Ok((triple, bundle[range].to_vec())))
        .collect()
}

/// The device entries of one plain bundle: (triple, byte range in the
/// bundle), in table order, host entries left out.
pub fn entry_table(bundle: &[u8]) -> Result<Vec<(String, std::ops::Range<usize>)>> {
    ensure!(bundle.starts_with(BUNDLE_MAGIC), "not an offload bundle");
    let count = read_u64(bundle, 24)?;
    let mut pos = 32;
    let mut out = Vec::new();
    for _ in 0..count {
        let offset = usize::try_from(read_u64(bundle, pos)?)?;
        let size = read_u64(bundle, pos + 8)?;
        let triple_len = read_u64(bundle, pos + 16)?;
        let start = pos + 24;
        pos = add(start, triple_len)?;
        let triple = bundle.get(start..pos).context("truncated entry table")?;
        let triple = String::from_utf8(triple.to_vec()).context("triple is not UTF-8")?;
        let end = add(offset, size)?;
        ensure!(end <= bundle.len(), "entry data runs past the bundle");
        if !triple.starts_with("host-") {
            out.push((triple, offset..end));
        }
    }
    Ok(out)
}

/// The device triples of one bundle, from its entry table ([`entries`]).
pub fn entry_triples(bundle: &[u8]) -> Result<Vec<String>> {
    Ok(entries(bundle)?.into_iter().map(|(t, _)| t).collect())
}

/// An uncompressed bundle of these (triple, bytes) entries, laid out as
/// clang-offload-bundler lays it out (entry table, then the data), but
/// with the triples exactly as given: the tests' way to make bundles for
/// targets LLVM 19 cannot write (`gfx1250-strict`, `amdgcnspirv`).
pub fn write_bundle(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut header = BUNDLE_MAGIC.to_vec();
    header.extend((entries.len() as u64).to_le_bytes());
    let table_len: usize = entries.iter().map(|(t, _)| 24 + t.len()).sum();
    let mut offset = header.len() + table_len;
    let mut payload: Vec<u8> = Vec::new();
    for (triple, data) in entries {
        header.extend((offset as u64).to_le_bytes());
        header.extend((data.len() as u64).to_le_bytes());
        header.extend((triple.len() as u64).to_le_bytes());
        header.extend(triple.as_bytes());
        payload.extend(*data);
        offset += data.len();
    }
    header.extend(payload);
    header
}

/// The uncompressed bundle in a CCOB v2/v3 bundle compressed with zstd.
fn decompress_ccob(bundle: &[u8]) -> Result<Vec<u8>> {
    let version = u16::from_le_bytes(field(bundle, 4)?);
    let method = u16::from_le_bytes(field(bundle, 6)?);
    ensure!(
        method == 1,
        "CCOB compression method {method}: only zstd here"
    );
    let header = match version {
        2 => 24,
        3 => 32,
        _ => bail!("CCOB version {version}"),
    };
    let total = compressed_len(bundle)?;
    let payload = bundle.get(header..total).context("truncated CCOB")?;
    zstd::stream::decode_all(payload).context("CCOB payload")
}

/// The offload triples of the device entries of one bundle file, as
/// `clang-offload-bundler --list` gives them (host entries left out).
pub fn bundler_triples(bundle: &Path) -> Result<Vec<String>> {
    let listing = output(
        Command::new(llvm_bin().join("clang-offload-bundler"))
            .args(["--list", "--type=o"])
            .arg(format!("--input={}", bundle.display())),
    )?;
    Ok(listing
        .lines()
        .map(str::trim)
        .filter(|t| !t.is_empty() && !t.starts_with("host-"))
        .map(str::to_owned)
        .collect())
}

/// The target ID of an offload triple (`hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+`
/// gives `gfx90a:xnack+`).
pub fn target_of(triple: &str) -> &str {
    triple.rsplit_once("--").map_or("", |x| x.1)
}

/// What `clang-offload-bundler --unbundle` extracts from one bundle file:
/// (target ID, bytes) for every device entry; `scratch` holds its outputs.
pub fn bundler_unbundle(bundle: &Path, scratch: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for triple in bundler_triples(bundle)? {
        let bytes = bundler_unbundle_one(bundle, &triple, scratch)?;
        out.push((target_of(&triple).to_owned(), bytes));
    }
    Ok(out)
}

/// The raw bytes of a section of an ELF file, cut out with `objcopy`
/// (empty if there is no such section).
pub fn objcopy_section(binary: &Path, section: &str, scratch: &Path) -> Result<Vec<u8>> {
    let out = scratch.join(format!("section{}.bin", section.replace('.', "_")));
    // LLVM's objcopy reads ELF of every machine (GNU objcopy here only
    // x86's).
    output(
        Command::new(llvm_bin().join("llvm-objcopy"))
            .args(["-O", "binary", "--only-section", section])
            .arg(binary)
            .arg(&out),
    )?;
    std::fs::read(&out).with_context(|| format!("reading {}", out.display()))
}

/// The bytes of a section of a PE image (its `VirtualSize` bytes), cut out
/// with `llvm-objcopy --dump-section`.
pub fn dump_section(binary: &Path, section: &str, scratch: &Path) -> Result<Vec<u8>> {
    let out = scratch.join(format!("dump{}.bin", section.replace('.', "_")));
    let mut arg = std::ffi::OsString::from(format!("{section}="));
    arg.push(&out);
    output(
        Command::new(llvm_bin().join("llvm-objcopy"))
            .arg("--dump-section")
            .arg(arg)
            .arg(binary)
            .arg(scratch.join("dump.out")),
    )?;
    std::fs::read(&out).with_context(|| format!("reading {}", out.display()))
}

/// Every code object of a fat binary, from the bundles of its
/// `.hip_fatbin`: (bundle index, target ID) -> bytes. The bytes are what
/// clang-offload-bundler extracts (checked against the entry table); for
/// the entries it cannot look up (a processor LLVM 19 does not know, see
/// [`entries`]), what the entry table says.
pub fn code_objects(binary: &Path) -> Result<BTreeMap<(usize, String), Vec<u8>>> {
    let scratch = tempfile::tempdir()?;
    let head = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let fatbin = if head.starts_with(b"MZ") {
        dump_section(binary, ".hip_fat", scratch.path())?
    } else {
        objcopy_section(binary, ".hip_fatbin", scratch.path())?
    };
    let mut out = BTreeMap::new();
    for (i, bundle) in split_bundles(&fatbin)?.iter().enumerate() {
        let file = scratch.path().join(format!("bundle{i}.bin"));
        std::fs::write(&file, bundle)?;
        let sub = scratch.path().join(format!("b{i}"));
        std::fs::create_dir(&sub)?;
        let listed = bundler_triples(&file)?;
        let mut found = BTreeMap::new();
        for (triple, bytes) in entries(bundle)? {
            let target = target_of(&triple).to_owned();
            let bytes = match bundler_unbundle_one(&file, &triple, &sub) {
                Ok(from_bundler) => {
                    ensure!(
                        from_bundler == bytes,
                        "{}: bundle {i}: the bundler's {target} differs from the entry table's",
                        binary.display()
                    );
                    from_bundler
                }
                // LLVM 19 looks an unknown processor up by a name it made
                // up (a trailing `-`): only the entry table has it.
                Err(e) if format!("{e:#}").contains(&format!("bundles for {triple}-")) => bytes,
                Err(e) => return Err(e),
            };
            ensure!(
                found.insert(target.clone(), bytes).is_none(),
                "{}: bundle {i} holds {target} twice",
                binary.display()
            );
        }
        ensure!(
            found.len() == listed.len(),
            "{}: bundle {i}: the bundler lists {} device entries, the entry table {}",
            binary.display(),
            listed.len(),
            found.len()
        );
        out.extend(found.into_iter().map(|(t, b)| ((i, t), b)));
    }
    Ok(out)
}

/// The bytes of the entry `triple` as `clang-offload-bundler --unbundle`
/// extracts them.
fn bundler_unbundle_one(bundle: &Path, triple: &str, scratch: &Path) -> Result<Vec<u8>> {
    let dest = scratch.join(format!(
        "bundler-{}.co",
        target_of(triple).replace(':', "_")
    ));
    output(
        Command::new(llvm_bin().join("clang-offload-bundler"))
            .args(["--unbundle", "--type=o"])
            .arg(format!("--input={}", bundle.display()))
            .arg(format!("--targets={triple}"))
            .arg(format!("--output={}", dest.display())),
    )?;
    std::fs::read(&dest).with_context(|| format!("reading {}", dest.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(triples: &[(&str, &[u8])]) -> Vec<u8> {
        write_bundle(triples)
    }

    #[test]
    fn splits_bundles_and_skips_padding() {
        let a = bundle(&[
            ("host-x86_64-unknown-linux--", b""),
            ("hipv4-amdgcn-amd-amdhsa--gfx942", b"code"),
        ]);
        let mut ccob = b"CCOB\x02\x00\x01\x00".to_vec();
        ccob.extend(28u32.to_le_bytes());
        ccob.extend([0; 12]);
        ccob.extend(b"zstd");
        let mut section = a.clone();
        section.extend([0; 7]);
        section.extend(&ccob);
        section.extend([0; 3]);
        let bundles = split_bundles(&section).unwrap();
        assert_eq!(bundles, vec![&a[..], &ccob[..]]);
    }

    #[test]
    fn rejects_truncated_bundles() {
        let a = bundle(&[("hipv4-amdgcn-amd-amdhsa--gfx942", b"code")]);
        assert!(split_bundles(&a[..a.len() - 1]).is_err());
        assert!(split_bundles(b"junk").is_err());
    }

    #[test]
    fn entry_triples_of_plain_and_compressed_bundles() {
        let a = bundle(&[
            ("host-x86_64-unknown-linux--", b""),
            ("hipv4-amdgcn-amd-amdhsa--gfx1250-strict", b"code"),
            ("hip-spirv64-amd-amdhsa--amdgcnspirv", b"spirv"),
        ]);
        let want = [
            "hipv4-amdgcn-amd-amdhsa--gfx1250-strict",
            "hip-spirv64-amd-amdhsa--amdgcnspirv",
        ];
        assert_eq!(entry_triples(&a).unwrap(), want);
        assert_eq!(entries(&a).unwrap()[1].1, b"spirv");
        let z = zstd::bulk::compress(&a, 3).unwrap();
        let mut ccob = b"CCOB\x02\x00\x01\x00".to_vec();
        ccob.extend((24 + z.len() as u32).to_le_bytes());
        ccob.extend((a.len() as u32).to_le_bytes());
        ccob.extend([0; 8]);
        ccob.extend(&z);
        assert_eq!(entry_triples(&ccob).unwrap(), want);
        assert!(entry_triples(&a[..40]).is_err());
    }

    #[test]
    fn target_of_a_triple() {
        assert_eq!(
            target_of("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+"),
            "gfx90a:xnack+"
        );
        assert_eq!(target_of("junk"), "");
    }
}
