//! `cargo xtask malformed`: regenerates the malformed-input corpus
//! (`tests/malformed/`, run by `tests/tests/malformed.rs`) from committed
//! inputs only, so that a rerun writes the same bytes: the smallest fat
//! fixture as committed for the golden tests
//! (`tests/golden/inputs/libvadd_compressed.so`), archives written by
//! kpack-host's `ArchiveWriter`, and bundles, CCOB headers and TOCs built here.
//! `cases.txt` and `README.md` are written by hand.
//!
//! ELF headers are read and patched with `object`'s types and TOCs with
//! `rmpv`, not with kpack's own parsers: the corpus is made to break those.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use kpack_format::archive::Scheme;
use kpack_host::ArchiveWriter;
use object::elf::{FileHeader64, SectionHeader64, SHT_NOBITS};
use object::read::elf::{FileHeader as _, SectionTable};
use object::LittleEndian as LE;
use rmpv::Value;
use xshell::{cmd, Shell};

/// The corpus, relative to the workspace root.
pub const CORPUS_DIR: &str = "tests/malformed";
/// The fat binary the ELF and metadata cases are made from.
const FAT_INPUT: &str = "tests/golden/inputs/libvadd_compressed.so";

/// Writes files below the corpus directory.
struct Corpus {
    root: PathBuf,
}

impl Corpus {
    fn put(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().context("no parent")?)?;
        fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))
    }
}

pub fn run(sh: &Shell, root: &Path) -> Result<()> {
    let corpus = Corpus {
        root: root.join(CORPUS_DIR),
    };
    let fat = fs::read(root.join(FAT_INPUT)).with_context(|| format!("reading {FAT_INPUT}"))?;
    bundles(&corpus)?;
    ccobs(&corpus)?;
    archives(&corpus)?;
    elf_files(&corpus, &fat)?;
    let kpack = crate::debug_kpack(sh)?;
    metadata(&corpus, sh, &kpack, &root.join(FAT_INPUT))?;
    trees(&corpus, &fat)?;
    configs(&corpus)?;
    println!("regenerated {CORPUS_DIR} (check `git status {CORPUS_DIR}`)");
    Ok(())
}

fn le64(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

/// An uncompressed bundle from raw (triple, data) entries, data right
/// after the table (no alignment).
fn bundle(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    let table: usize = 32 + entries.iter().map(|(t, _)| 24 + t.len()).sum::<usize>();
    let mut out = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
    out.extend(le64(entries.len() as u64));
    let mut pos = table as u64;
    for (t, d) in entries {
        out.extend(le64(pos));
        out.extend(le64(d.len() as u64));
        out.extend(le64(t.len() as u64));
        out.extend_from_slice(t);
        pos += d.len() as u64;
    }
    for (_, d) in entries {
        out.extend_from_slice(d);
    }
    out
}

const HOST: &[u8] = b"host-x86_64-unknown-linux--";
const GFX1100: &[u8] = b"hipv4-amdgcn-amd-amdhsa--gfx1100";
const GFX942: &[u8] = b"hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-";

fn good_bundle() -> Vec<u8> {
    bundle(&[
        (HOST, b""),
        (GFX1100, b"\x7fELF code object for gfx1100"),
        (GFX942, b"\x7fELF code object for gfx942"),
    ])
}

/// A CCOB header (v1: 20 bytes, v2: 24, v3: 32) and payload.
fn ccob(version: u16, method: u16, total: u64, size: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = b"CCOB".to_vec();
    out.extend(version.to_le_bytes());
    out.extend(method.to_le_bytes());
    match version {
        1 => {
            out.extend((size as u32).to_le_bytes());
            out.extend(le64(0));
        }
        2 => {
            out.extend((total as u32).to_le_bytes());
            out.extend((size as u32).to_le_bytes());
            out.extend(le64(0));
        }
        _ => {
            out.extend(le64(total));
            out.extend(le64(size));
            out.extend(le64(0));
        }
    }
    out.extend_from_slice(payload);
    out
}

/// A v2 zstd CCOB of `inner`, with correct sizes.
fn ccob_of(inner: &[u8]) -> Result<Vec<u8>> {
    let payload = zstd::bulk::compress(inner, 3)?;
    Ok(ccob(
        2,
        1,
        24 + payload.len() as u64,
        inner.len() as u64,
        &payload,
    ))
}

fn bundles(c: &Corpus) -> Result<()> {
    let good = good_bundle();
    c.put("bundle/truncated-count.bin", &good[..28])?;
    let mut b = good.clone();
    b[24..32].copy_from_slice(&le64(u64::MAX / 2));
    c.put("bundle/too-many-entries.bin", &b)?;
    c.put("bundle/entry-past-end.bin", &good[..good.len() - 5])?;
    let mut b = bundle(&[(GFX1100, b"abc")]);
    b[32..40].copy_from_slice(&le64(u64::MAX - 1)); // offset + size overflows
    c.put("bundle/entry-offset-overflow.bin", &b)?;
    c.put(
        "bundle/triple-not-ascii.bin",
        &bundle(&[(b"hipv4-amdgcn-amd-amdhsa--gfx11\xff0", b"x")]),
    )?;
    c.put(
        "bundle/duplicate-target.bin",
        &bundle(&[(GFX1100, b"one"), (GFX1100, b"two")]),
    )?;
    let mut b = good.clone();
    b.extend_from_slice(b"\0\0\0\0__CLANG_OFFLOAD_BUNDLX__");
    c.put("bundle/bad-magic-after-first.bin", &b)?;
    let mut b = bundle(&[(GFX1100, b"x")]);
    b[48..56].copy_from_slice(&le64(1 << 40)); // triple length
    c.put("bundle/triple-length-huge.bin", &b)?;
    c.put(
        "bundle/target-escapes-dir.bin",
        &bundle(&[
            (HOST, b""),
            (b"hipv4-amdgcn-amd-amdhsa--../../../evil", b"PWNED"),
        ]),
    )?;
    c.put(
        "bundle/target-absolute-path.bin",
        &bundle(&[(b"hipv4-amdgcn-amd-amdhsa--/tmp/kpack-evil", b"PWNED")]),
    )?;
    c.put(
        "bundle/no-target.bin",
        &bundle(&[(b"hipv4-amdgcn-amd-amdhsa-gfx1100", b"x")]),
    )
}

fn ccobs(c: &Corpus) -> Result<()> {
    let good = good_bundle();
    let z = ccob_of(&good)?;
    c.put("ccob/truncated-header.bin", &z[..14])?;
    let with = |at: usize, bytes: &[u8]| {
        let mut b = z.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        b
    };
    c.put("ccob/unknown-version.bin", &with(4, &9u16.to_le_bytes()))?;
    c.put("ccob/unknown-method.bin", &with(6, &7u16.to_le_bytes()))?;
    c.put(
        "ccob/total-smaller-than-header.bin",
        &with(8, &10u32.to_le_bytes()),
    )?;
    c.put(
        "ccob/total-past-end.bin",
        &with(8, &((z.len() + 100) as u32).to_le_bytes()),
    )?;
    c.put(
        "ccob/size-mismatch.bin",
        &with(12, &((good.len() + 1) as u32).to_le_bytes()),
    )?;
    let mut b = z.clone();
    let n = b.len();
    for x in &mut b[30..n - 4] {
        *x ^= 0x5a;
    }
    c.put("ccob/corrupt-zstd.bin", &b)?;
    c.put(
        "ccob/corrupt-zlib.bin",
        &ccob(2, 0, 24 + 8, 100, b"\x78\x9c\xff\xff\xff\xff\xff\xff"),
    )?;
    let junk = b"this is not an offload bundle at all".repeat(3);
    c.put("ccob/payload-not-a-bundle.bin", &ccob_of(&junk)?)?;
    c.put("ccob/payload-all-zero.bin", &ccob_of(&[0u8; 64])?)?;
    c.put(
        "ccob/v3-too-large.bin",
        &ccob(3, 1, 32 + 4, 1 << 40, b"abcd"),
    )?;
    c.put(
        "ccob/inner-bundle-truncated.bin",
        &ccob_of(&good[..good.len() - 3])?,
    )
}

/// `KPAK` header + blob + TOC bytes, with the TOC offset right.
fn kpak(version: u32, blob: &[u8], toc: &[u8]) -> Vec<u8> {
    let mut out = b"KPAK".to_vec();
    out.extend(version.to_le_bytes());
    out.extend(le64(64 + blob.len() as u64));
    out.resize(64, 0);
    out.extend_from_slice(blob);
    out.extend_from_slice(toc);
    out
}

fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("writing to a Vec");
    out
}

/// A map with string keys, in order.
fn str_map<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

/// A valid archive: (blob, TOC value) of two kernels of two keys.
fn valid(scheme: Scheme) -> Result<(Vec<u8>, Value)> {
    let mut w = ArchiveWriter::new("g", "gfx1100", vec!["gfx1100".into()]).scheme(scheme);
    w.add(
        "lib/liba.so#0",
        "gfx1100",
        &b"kernel a for gfx1100, kernel a, kernel a"[..],
        None,
    )?;
    w.add(
        "lib/libb.so#0",
        "gfx1100",
        &b"kernel b for gfx1100 (the second one)"[..],
        None,
    )?;
    let bytes = w.to_vec()?;
    let toc = u64::from_le_bytes(bytes[8..16].try_into()?) as usize;
    let value = rmpv::decode::read_value(&mut &bytes[toc..])?;
    Ok((bytes[64..toc].to_vec(), value))
}

/// The entries of a map value.
fn entries(v: &mut Value) -> &mut Vec<(Value, Value)> {
    match v {
        Value::Map(m) => m,
        other => panic!("a TOC map expected, not {other}"),
    }
}

/// Replace (or add, or with `None` remove) a top-level TOC field.
fn set(toc: &Value, key: &str, v: Option<Value>) -> Value {
    let mut toc = toc.clone();
    let m = entries(&mut toc);
    let at = m.iter().position(|(k, _)| k.as_str() == Some(key));
    match (at, v) {
        (Some(i), Some(v)) => m[i].1 = v,
        (Some(i), None) => {
            m.remove(i);
        }
        (None, Some(v)) => m.push((key.into(), v)),
        (None, None) => {}
    }
    toc
}

/// The `toc` field's map (key -> target -> entry).
fn kernels(toc: &mut Value) -> &mut Vec<(Value, Value)> {
    let t = entries(toc)
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("toc"))
        .expect("a TOC has a toc field");
    entries(&mut t.1)
}

/// The TOC with the entry of its first kernel's `key` set to `v`.
fn with_entry(toc: &Value, key: &str, v: Value) -> Value {
    let mut toc = toc.clone();
    let targets = entries(&mut kernels(&mut toc)[0].1);
    let entry = entries(&mut targets[0].1);
    match entry.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
        Some(e) => e.1 = v,
        None => entry.push((key.into(), v)),
    }
    toc
}

/// A version-1 archive of `blob` and the TOC `toc`.
fn archive(blob: &[u8], toc: &Value) -> Vec<u8> {
    kpak(1, blob, &encode(toc))
}

/// `archive/`: broken copies of two valid archives (zstd per kernel, and
/// uncompressed), and an empty file.
fn archives(c: &Corpus) -> Result<()> {
    let (zblob, ztoc) = valid(Scheme::ZstdPerKernel)?;
    let (nblob, ntoc) = valid(Scheme::None)?;
    header_archives(c, &zblob, &ztoc)?;
    toc_field_archives(c, &zblob, &ztoc)?;
    frames(c, &zblob, &ztoc)?;
    entry_archives(c, &zblob, &ztoc)?;
    noop_archives(c, &nblob, &ntoc)?;
    // The same key twice in the TOC map, with the same target.
    let mut dup = ztoc.clone();
    let keys = kernels(&mut dup);
    let first = keys[0].clone();
    keys.push(first);
    c.put("archive/duplicate-kernel.kpack", &archive(&zblob, &dup))?;
    // A TOC nested deeper than the decoder allows.
    let mut deep = vec![0x91u8; 100];
    deep.push(0xc0);
    c.put("archive/toc-too-deep.kpack", &kpak(1, &zblob, &deep))?;
    c.put("archive/empty.kpack", b"")
}

/// Archives whose header, or the TOC's place and framing, is broken.
fn header_archives(c: &Corpus, zblob: &[u8], ztoc: &Value) -> Result<()> {
    let good_z = archive(zblob, ztoc);
    c.put(
        "archive/bad-magic.kpack",
        &[b"KPAX".as_slice(), &good_z[4..]].concat(),
    )?;
    c.put("archive/truncated-header.kpack", &good_z[..40])?;
    c.put("archive/version-2.kpack", &kpak(2, zblob, &encode(ztoc)))?;
    let mut b = good_z.clone();
    b[8..16].copy_from_slice(&le64(good_z.len() as u64 + 1));
    c.put("archive/toc-offset-past-end.kpack", &b)?;
    let mut b = good_z.clone();
    b[8..16].copy_from_slice(&le64(16));
    c.put("archive/toc-offset-in-header.kpack", &b)?;
    c.put(
        "archive/toc-not-msgpack.kpack",
        &kpak(1, zblob, &[0xc1, 0x00]),
    )?;
    c.put(
        "archive/toc-trailing-bytes.kpack",
        &[good_z.clone(), vec![0x01, 0x02]].concat(),
    )?;
    c.put("archive/toc-truncated.kpack", &good_z[..good_z.len() - 3])?;
    c.put(
        "archive/toc-not-a-map.kpack",
        &archive(zblob, &Value::from(7u64)),
    )
}

/// Archives with a top-level TOC field missing or wrong.
fn toc_field_archives(c: &Corpus, zblob: &[u8], ztoc: &Value) -> Result<()> {
    let toc_cases = [
        ("toc-missing-group", set(ztoc, "group_name", None)),
        (
            "toc-arches-not-array",
            set(ztoc, "gfx_arches", Some(Value::from(3u64))),
        ),
        (
            "toc-unknown-scheme",
            set(ztoc, "compression_scheme", Some(Value::from("lz4"))),
        ),
        (
            "toc-format-version-2",
            set(ztoc, "format_version", Some(Value::from(2u64))),
        ),
        (
            "zstd-blob-outside",
            set(ztoc, "zstd_size", Some(Value::from(1u64 << 20))),
        ),
    ];
    for (name, toc) in &toc_cases {
        c.put(&format!("archive/{name}.kpack"), &archive(zblob, toc))?;
    }
    Ok(())
}

/// Zstd archives whose first kernel's entry has a wrong field.
fn entry_archives(c: &Corpus, zblob: &[u8], ztoc: &Value) -> Result<()> {
    let entry_cases = [
        ("ordinal-out-of-range", "ordinal", Value::from(5u64)),
        ("ordinal-over-u32", "ordinal", Value::from(1u64 << 33)),
        (
            "original-size-negative",
            "original_size",
            Value::from(-5i64),
        ),
        ("original-size-wrong", "original_size", Value::from(3u64)),
        (
            "original-size-huge",
            "original_size",
            Value::from(1u64 << 40),
        ),
    ];
    for (name, key, v) in entry_cases {
        c.put(
            &format!("archive/{name}.kpack"),
            &archive(zblob, &with_entry(ztoc, key, v)),
        )?;
    }
    Ok(())
}

/// Uncompressed archives whose blobs or sizes do not match.
fn noop_archives(c: &Corpus, nblob: &[u8], ntoc: &Value) -> Result<()> {
    let blob = |offset: u64, size: u64| {
        str_map([("offset", Value::from(offset)), ("size", Value::from(size))])
    };
    c.put(
        "archive/blob-outside.kpack",
        &archive(
            nblob,
            &set(
                ntoc,
                "blobs",
                Some(Value::Array(vec![blob(64, 1 << 30), blob(64, 1)])),
            ),
        ),
    )?;
    c.put(
        "archive/noop-size-mismatch.kpack",
        &archive(nblob, &with_entry(ntoc, "original_size", Value::from(2u64))),
    )
}

/// Archives whose zstd frames (in the blob) are damaged.
fn frames(c: &Corpus, zblob: &[u8], ztoc: &Value) -> Result<()> {
    let with_blob = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = zblob.to_vec();
        edit(&mut b);
        archive(&b, ztoc)
    };
    c.put(
        "archive/too-many-frames.kpack",
        &with_blob(&|b| b[0..4].copy_from_slice(&2_000_000u32.to_le_bytes())),
    )?;
    c.put(
        "archive/frame-past-blob.kpack",
        &with_blob(&|b| b[4..8].copy_from_slice(&100_000u32.to_le_bytes())),
    )?;
    c.put(
        "archive/frame-corrupt.kpack",
        &with_blob(&|b| {
            let l = b.len();
            for x in &mut b[20..l - 40] {
                *x ^= 0xa5;
            }
        }),
    )
}

/// An ELF file's section headers, for patching copies of it.
struct Elf<'a> {
    data: &'a [u8],
    shoff: usize,
    sections: SectionTable<'a, FileHeader64<LE>>,
}

const SHDR_SIZE: usize = std::mem::size_of::<SectionHeader64<LE>>();

impl<'a> Elf<'a> {
    fn parse(data: &'a [u8]) -> Result<Elf<'a>> {
        let header = FileHeader64::<LE>::parse(data)?;
        Ok(Elf {
            data,
            shoff: header.e_shoff.get(LE) as usize,
            sections: header.sections(LE, data)?,
        })
    }

    /// The index and header of a section.
    fn section(&self, name: &str) -> Result<(usize, SectionHeader64<LE>)> {
        let (i, s) = self
            .sections
            .section_by_name(LE, name.as_bytes())
            .with_context(|| format!("no {name} section"))?;
        Ok((i.0, *s))
    }

    /// A copy of the file with the header of section `name` changed.
    fn patched(&self, name: &str, edit: &dyn Fn(&mut SectionHeader64<LE>)) -> Result<Vec<u8>> {
        let (i, mut s) = self.section(name)?;
        edit(&mut s);
        let mut b = self.data.to_vec();
        let at = self.shoff + i * SHDR_SIZE;
        b[at..at + SHDR_SIZE].copy_from_slice(object::pod::bytes_of(&s));
        Ok(b)
    }

    /// A section's file range.
    fn range(&self, name: &str) -> Result<(usize, usize)> {
        let (_, s) = self.section(name)?;
        Ok((s.sh_offset.get(LE) as usize, s.sh_size.get(LE) as usize))
    }
}

/// Fat binaries (from the smallest fat fixture: one CCOB bundle) with
/// broken ELF headers, section tables, `.hip_fatbin` contents and wrappers.
fn elf_files(c: &Corpus, fat: &[u8]) -> Result<()> {
    let elf = Elf::parse(fat)?;
    let with = |at: usize, bytes: &[u8]| {
        let mut b = fat.to_vec();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        b
    };
    c.put("elf/truncated-header.so", &fat[..40])?;
    c.put("elf/elf32.so", &with(4, &[1]))?; // ELFCLASS32
    c.put(
        "elf/shoff-past-end.so",
        &with(40, &le64(fat.len() as u64 + 4096)),
    )?;
    c.put(
        "elf/phoff-past-end.so",
        &with(32, &le64(fat.len() as u64 - 8)),
    )?;
    c.put(
        "elf/fatbin-past-end.so",
        &elf.patched(".hip_fatbin", &|s| s.sh_size.set(LE, 1 << 32))?,
    )?;
    c.put(
        "elf/wrappers-odd-size.so",
        &elf.patched(".hipFatBinSegment", &|s| s.sh_size.set(LE, 25))?,
    )?;
    // No .hip_fatbin: rename it in .shstrtab.
    let (_, fatbin) = elf.section(".hip_fatbin")?;
    let (strtab, _) = elf.range(".shstrtab")?;
    let at = strtab + fatbin.sh_name.get(LE) as usize;
    ensure!(&fat[at..at + 11] == b".hip_fatbin", "unexpected .shstrtab");
    c.put("elf/no-fatbin.so", &with(at + 10, b"X"))?;
    // Wrapper magic.
    let (wrappers, _) = elf.range(".hipFatBinSegment")?;
    c.put("elf/wrapper-bad-magic.so", &with(wrappers, b"ABCD"))?;
    // Corrupt the CCOB inside .hip_fatbin.
    let (o, _) = elf.range(".hip_fatbin")?;
    c.put("elf/fatbin-bad-ccob.so", &with(o + 4, &9u16.to_le_bytes()))?;
    c.put("elf/fatbin-junk.so", &with(o, b"JUNK"))?;
    // .hip_fatbin NOBITS, wrappers still HIPF.
    c.put(
        "elf/half-offloaded.so",
        &elf.patched(".hip_fatbin", &|s| s.sh_type.set(LE, SHT_NOBITS))?,
    )?;
    // An ELF file we do not rewrite: unsupported machine.
    c.put(
        "elf/unsupported-machine.so",
        &with(18, &0x28u16.to_le_bytes()), // EM_ARM
    )
}

/// Offloaded binaries (`kpack offload` of the fat input) with broken
/// metadata or wrappers.
fn metadata(c: &Corpus, sh: &Shell, kpack: &Path, fat: &Path) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let host = tmp.path().join("lib/libvadd_compressed.so");
    let archives = tmp.path().join(".kpack");
    cmd!(
        sh,
        "{kpack} offload {fat} -o {host} --archive-dir {archives}"
    )
    .quiet()
    .ignore_stdout()
    .run()?;
    let off = fs::read(&host)?;
    let elf = Elf::parse(&off)?;
    let (mo, ml) = elf.range(".rocm_kpack_ref")?;
    let with_meta = |meta: &Value| -> Result<Vec<u8>> {
        let meta = encode(meta);
        ensure!(meta.len() <= ml, "metadata too long for the section");
        let mut b = off.clone();
        b[mo..mo + ml].fill(0);
        b[mo..mo + meta.len()].copy_from_slice(&meta);
        Ok(b)
    };
    let mut raw = off.clone();
    raw[mo..mo + ml].fill(0);
    raw[mo] = 0xc1;
    c.put("metadata/not-msgpack.so", &raw)?;
    let paths = |v: Vec<Value>| ("kpack_search_paths", Value::Array(v));
    let cases = [
        ("not-a-map", Value::from(1u64)),
        ("no-kernel-name", str_map([paths(vec!["x".into()])])),
        (
            "no-search-paths",
            str_map([paths(vec![]), ("kernel_name", "k".into())]),
        ),
        (
            "kernel-name-not-str",
            str_map([paths(vec!["x".into()]), ("kernel_name", 5u64.into())]),
        ),
        (
            "search-path-not-str",
            str_map([paths(vec![Value::Nil]), ("kernel_name", "k".into())]),
        ),
    ];
    for (name, meta) in &cases {
        c.put(&format!("metadata/{name}.so"), &with_meta(meta)?)?;
    }
    // A HIPK wrapper whose pointer misses the metadata.
    let (at, _) = elf.range(".hipFatBinSegment")?;
    let mut b = off.clone();
    b[at..at + 4].copy_from_slice(b"HIPF");
    c.put("metadata/wrapper-back-to-hipf.so", &b)
}

/// One case of [`trees`]: a directory below the corpus, made afresh. An
/// entry's content is text, `@junk`/`@fat` for the bad/good fat binary,
/// `->target` for a symlink, `/` for an empty directory.
fn tree(c: &Corpus, case: &str, files: &[(&str, &str)], fat: &[u8]) -> Result<()> {
    let dir = c.root.join(case);
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    let junk = fs::read(c.root.join("elf/fatbin-junk.so"))?;
    for (rel, content) in files {
        let p = dir.join(rel);
        fs::create_dir_all(p.parent().context("no parent")?)?;
        if let Some(t) = content.strip_prefix("->") {
            std::os::unix::fs::symlink(t, &p)?;
        } else if *content == "/" {
            fs::create_dir_all(&p)?;
        } else {
            let bytes = match *content {
                "@junk" => &junk[..],
                "@fat" => fat,
                text => text.as_bytes(),
            };
            fs::write(&p, bytes)?;
        }
    }
    Ok(())
}

/// Artifact trees: bad manifests, prefixes escaping the artifact, bad fat
/// binaries, incomplete or corrupt split outputs.
fn trees(c: &Corpus, fat: &[u8]) -> Result<()> {
    const A: &str = "foo_lib_gfx1100";
    let m = |rel: &str| format!("{A}/{rel}");
    let manifest = m("artifact_manifest.txt");
    let t = |case: &str, files: &[(&str, &str)]| tree(c, case, files, fat);
    t("split/no-manifest", &[(&m("stage/lib/x.txt"), "x")])?;
    t(
        "split/manifest-dotdot",
        &[(&manifest, "stage\n../outside\n"), (&m("stage/x"), "x")],
    )?;
    t("split/manifest-absolute", &[(&manifest, "/etc\n")])?;
    t(
        "split/manifest-nested",
        &[(&manifest, "stage\nstage/lib\n"), (&m("stage/lib/x"), "x")],
    )?;
    t("split/manifest-root", &[(&manifest, "./\n")])?;
    t("split/manifest-not-utf8", &[(&manifest, "")])?;
    c.put(
        &format!("split/manifest-not-utf8/{manifest}"),
        b"st\xffage\n",
    )?;
    t(
        "split/prefix-symlink-outside",
        &[(&manifest, "stage\n"), (&m("stage"), "->..")],
    )?;
    t(
        "split/prefix-is-a-file",
        &[(&manifest, "stage\n"), (&m("stage"), "not a directory")],
    )?;
    t(
        "split/bad-fat-binary",
        &[
            (&manifest, "stage\n"),
            (&m("stage/lib/libbad.so"), "@junk"),
            (&m("stage/lib/libgood.so"), "@fat"),
        ],
    )?;
    t(
        "split-batch/duplicate-prefix",
        &[
            ("foo_lib_gfx1100/artifact_manifest.txt", "stage\n"),
            ("foo_lib_gfx1100/stage/x", "x"),
            ("foo_lib_gfx1101/artifact_manifest.txt", "stage\n"),
            ("foo_lib_gfx1101/stage/x", "x"),
        ],
    )?;
    t(
        "split-batch/no-family",
        &[
            ("foolib/artifact_manifest.txt", "stage\n"),
            ("foolib/stage/x", "x"),
        ],
    )?;
    verify_trees(c, fat)?;
    t(
        "pack-tree/bad-fat-binary",
        &[("lib/libbad.so", "@junk"), ("share/doc/README", "x")],
    )?;
    t(
        "recombine-tree/no-shards",
        &[
            (
                "config.json",
                r#"{"primary_shard": "a", "architecture_groups": {"gfx110X": {"architectures": ["gfx1100"]}}}"#,
            ),
            ("shards/README", "no shard directories here"),
        ],
    )
}

/// Incomplete or corrupt split outputs, for `kpack verify`.
fn verify_trees(c: &Corpus, fat: &[u8]) -> Result<()> {
    let t = |case: &str, files: &[(&str, &str)]| tree(c, case, files, fat);
    t(
        "verify/generic-with-fat-binary",
        &[
            ("foo_lib_generic/artifact_manifest.txt", "stage\n"),
            ("foo_lib_generic/stage/lib/libfat.so", "@fat"),
        ],
    )?;
    t(
        "verify/missing-manifest",
        &[("foo_lib_generic/stage/x", "x")],
    )?;
    t(
        "verify/target-without-generic",
        &[
            ("foo_lib_gfx1100/artifact_manifest.txt", "stage\n"),
            (
                "foo_lib_gfx1100/stage/.kpack/foo_lib_gfx1100.kpack",
                "not an archive",
            ),
        ],
    )?;
    t(
        "verify/corrupt-archive",
        &[
            ("foo_lib_generic/artifact_manifest.txt", "stage\n"),
            ("foo_lib_generic/stage/README", "host files"),
            ("foo_lib_gfx1100/artifact_manifest.txt", "stage\n"),
        ],
    )?;
    let bad_archive = fs::read(c.root.join("archive/frame-corrupt.kpack"))?;
    c.put(
        "verify/corrupt-archive/foo_lib_gfx1100/stage/.kpack/foo_lib_gfx1100.kpack",
        &bad_archive,
    )
}

/// Bad packaging configs for `kpack recombine`.
fn configs(c: &Corpus) -> Result<()> {
    let group = r#""architecture_groups": {"g": {"architectures": ["gfx1100"]}}"#;
    let cases = [
        ("empty", String::new()),
        ("not-json", "{\"primary_shard\": ".into()),
        ("not-an-object", "[1, 2]".into()),
        (
            "unknown-field",
            format!(r#"{{"primary_shard": "a", {group}, "extra": 1}}"#),
        ),
        ("missing-primary", format!("{{{group}}}")),
        (
            "primary-not-string",
            format!(r#"{{"primary_shard": 3, {group}}}"#),
        ),
        (
            "groups-empty",
            r#"{"primary_shard": "a", "architecture_groups": {}}"#.into(),
        ),
        (
            "group-name-path",
            r#"{"primary_shard": "a", "architecture_groups": {"../x": {"architectures": ["gfx1100"]}}}"#.into(),
        ),
        (
            "group-name-generic",
            r#"{"primary_shard": "a", "architecture_groups": {"generic": {"architectures": ["gfx1100"]}}}"#.into(),
        ),
        (
            "architectures-empty",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": []}}}"#.into(),
        ),
        (
            "architecture-not-gfx",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["sm_90"]}}}"#.into(),
        ),
        (
            "architecture-bad-feature",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx90a:xnack"]}}}"#.into(),
        ),
        (
            "processor-in-two-groups",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}, "h": {"architectures": ["gfx1100"]}}}"#.into(),
        ),
        (
            "validation-unknown",
            format!(r#"{{"primary_shard": "a", {group}, "validation": {{"error_on_everything": true}}}}"#),
        ),
        (
            "validation-not-bool",
            format!(r#"{{"primary_shard": "a", {group}, "validation": {{"error_on_duplicate_device_code": "yes"}}}}"#),
        ),
    ];
    for (name, text) in &cases {
        c.put(&format!("config/{name}.json"), text.as_bytes())?;
    }
    Ok(())
}
