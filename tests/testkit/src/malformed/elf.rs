//! `elf/` and `metadata/`: fat and offloaded binaries with broken headers,
//! sections, bundles, wrappers or metadata, patched with `object`'s types.

use std::fs;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use object::elf::{FileHeader64, SectionHeader64, SHT_NOBITS};
use object::read::elf::{FileHeader as _, SectionTable};
use object::LittleEndian as LE;
use rmpv::Value;
use xshell::{cmd, Shell};

use super::archive::{encode, str_map};
use super::{le64, Corpus};

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
pub(super) fn elf_files(c: &Corpus, fat: &[u8]) -> Result<()> {
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
pub(super) fn metadata(c: &Corpus, sh: &Shell, kpack: &Path, fat: &Path) -> Result<()> {
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
