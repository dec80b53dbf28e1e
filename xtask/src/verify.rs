//! Checks a built fixture against its [`Fixture`] entry, independently of
//! kpack-core: the ELF type, `.hip_fatbin` and its bundles (targets listed by
//! LLVM's clang-offload-bundler), the wrappers, `.relr.dyn`, and the host
//! code (executables run, libraries' host check is called through dlcheck).

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use object::elf::{ET_DYN, ET_EXEC};
use object::read::elf::{ElfFile64, FileHeader};
use object::{Endianness, Object, ObjectSection};
use xshell::{cmd, Shell};

use crate::fixtures::{Fixture, Kind, LLVM_BIN};

const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
const CCOB_MAGIC: &[u8] = b"CCOB";
/// Size of one `__CudaFatBinaryWrapper` in `.hipFatBinSegment`.
const WRAPPER_SIZE: u64 = 24;

pub fn check(sh: &Shell, path: &Path, fixture: &Fixture, dlcheck: &Path) -> Result<()> {
    let data = sh.read_binary_file(path)?;
    let elf = ElfFile64::<Endianness>::parse(&*data).context("not a 64-bit ELF file")?;

    let e_type = elf.elf_header().e_type(elf.endian());
    let interp = elf.section_by_name(".interp").is_some();
    let kind = match (e_type, interp) {
        (ET_DYN, false) => Kind::Shared,
        (ET_DYN, true) => Kind::Pie,
        (ET_EXEC, _) => Kind::Exec,
        _ => bail!("unexpected ELF type {e_type}"),
    };
    ensure!(
        kind == fixture.kind,
        "kind {kind:?}, expected {:?}",
        fixture.kind
    );

    let fatbin = match elf.section_by_name(".hip_fatbin") {
        Some(section) => section.data()?,
        None => &[],
    };
    let bundles = split_bundles(fatbin)?;
    ensure!(
        bundles.len() == fixture.bundles,
        "{} bundles, expected {}",
        bundles.len(),
        fixture.bundles
    );
    let compressed = bundles.iter().filter(|b| b.starts_with(CCOB_MAGIC)).count();
    ensure!(
        compressed == fixture.compressed_bundles,
        "{compressed} compressed bundles, expected {}",
        fixture.compressed_bundles
    );
    let mut expected: Vec<&str> = fixture.targets.to_vec();
    expected.sort_unstable();
    let scratch = path.with_extension("bundle.tmp");
    for (index, bundle) in bundles.iter().enumerate() {
        sh.write_file(&scratch, bundle)?;
        let targets = list_targets(sh, &scratch);
        sh.remove_path(&scratch)?;
        let mut targets = targets.with_context(|| format!("bundle {index}"))?;
        targets.sort_unstable();
        ensure!(
            targets == expected,
            "bundle {index} has targets {targets:?}, expected {expected:?}"
        );
    }

    let wrappers = elf
        .section_by_name(".hipFatBinSegment")
        .map_or(0, |s| s.size() / WRAPPER_SIZE);
    ensure!(
        wrappers == fixture.wrappers as u64,
        "{wrappers} wrappers, expected {}",
        fixture.wrappers
    );

    let relr = elf.section_by_name(".relr.dyn").is_some();
    ensure!(
        relr == fixture.relr,
        "has .relr.dyn: {relr}, expected {}",
        fixture.relr
    );

    match (fixture.kind, fixture.host_check) {
        (Kind::Pie | Kind::Exec, _) => cmd!(sh, "{path}").quiet().run()?,
        (Kind::Shared, Some(check)) => {
            let symbol = check.symbol;
            let out = cmd!(sh, "{dlcheck} {path} {symbol}").quiet().read()?;
            let value: i32 = out.trim().parse().context("dlcheck output")?;
            ensure!(
                value == check.value,
                "{symbol}() returned {value}, expected {}",
                check.value
            );
        }
        (Kind::Shared, None) => {}
    }
    Ok(())
}

/// Device target IDs of one bundle, as clang-offload-bundler lists them.
fn list_targets(sh: &Shell, bundle: &Path) -> Result<Vec<String>> {
    let bundler = format!("{LLVM_BIN}/clang-offload-bundler");
    let listing = cmd!(sh, "{bundler} --list --type=o --input={bundle}")
        .quiet()
        .read()?;
    Ok(listing
        .lines()
        .filter(|triple| !triple.starts_with("host-"))
        .map(|triple| triple.rsplit("--").next().unwrap_or(triple).to_owned())
        .collect())
}

/// The top-level bundles of a `.hip_fatbin` section, skipping zero padding.
fn split_bundles(data: &[u8]) -> Result<Vec<&[u8]>> {
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
        _ => bail!("CCOB version {version} not expected from clang 19"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(triples: &[(&str, &[u8])]) -> Vec<u8> {
        let mut header = BUNDLE_MAGIC.to_vec();
        header.extend((triples.len() as u64).to_le_bytes());
        let table_len: usize = triples.iter().map(|(t, _)| 24 + t.len()).sum();
        let mut offset = header.len() + table_len;
        let mut payload: Vec<u8> = Vec::new();
        for (triple, data) in triples {
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
}
