//! ELF host binaries, read through `object`'s header types over borrowed
//! bytes (no readelf, no objcopy): the file header, program and section
//! headers, named sections, dynamic relocations (RELA and RELR) and what a
//! 64-bit pointer field of the loaded image resolves to.
//!
//! Only 64-bit little-endian ELF is read (the hosts HIP runs on). `object`
//! is built with its `unaligned` feature, so header tables may sit at any
//! file offset (the reference's tools write section header tables that are
//! not 8-byte aligned; readelf, eu-elflint and ld.so accept them).

use object::elf;
use object::read::elf::{
    FileHeader as _, ProgramHeader as _, Rela as _, SectionHeader as _, Sym as _,
};
use object::read::StringTable;

pub use object::LittleEndian;
/// The byte order of every file kpack reads.
pub const LE: LittleEndian = LittleEndian;

pub type FileHeader = elf::FileHeader64<LittleEndian>;
pub(crate) type ProgramHeader = elf::ProgramHeader64<LittleEndian>;
pub(crate) type SectionHeader = elf::SectionHeader64<LittleEndian>;
pub(crate) type Rela = elf::Rela64<LittleEndian>;
pub(crate) type Sym = elf::Sym64<LittleEndian>;
pub(crate) type Dyn = elf::Dyn64<LittleEndian>;

/// The section holding the offload bundles of a fat binary.
pub const FATBIN_SECTION: &str = ".hip_fatbin";
/// The section holding the `__CudaFatBinaryWrapper` array.
pub(crate) const WRAPPER_SECTION: &str = ".hipFatBinSegment";
/// The section holding the HIPK metadata of an offloaded binary.
pub(crate) const METADATA_SECTION: &str = ".rocm_kpack_ref";

/// Size of an ELF64 file header.
pub const EHDR_SIZE: usize = std::mem::size_of::<FileHeader>();
/// Size of an ELF64 program header.
pub const PHDR_SIZE: usize = std::mem::size_of::<ProgramHeader>();
/// Size of an ELF64 section header.
pub const SHDR_SIZE: usize = std::mem::size_of::<SectionHeader>();
/// Size of an ELF64 RELA entry.
pub(crate) const RELA_SIZE: usize = std::mem::size_of::<Rela>();
/// Size of an ELF64 symbol.
pub(crate) const SYM_SIZE: usize = std::mem::size_of::<Sym>();
/// Size of an ELF64 dynamic entry.
pub(crate) const DYN_SIZE: usize = std::mem::size_of::<Dyn>();

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    #[error("not an ELF file")]
    NotElf,
    #[error("unsupported ELF: {0} (kpack handles 64-bit little-endian ELF)")]
    Unsupported(&'static str),
    #[error("malformed ELF: {0}")]
    Malformed(String),
    #[error("section {name}: {problem}")]
    BadSection { name: String, problem: String },
}

fn malformed(e: object::Error) -> ElfError {
    ElfError::Malformed(e.to_string())
}

/// The type of an ELF file (`e_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ElfType {
    /// `ET_REL`: a relocatable object (link input).
    Relocatable,
    /// `ET_EXEC`: a position-dependent executable.
    Executable,
    /// `ET_DYN`: a shared library or a PIE executable.
    Shared,
    Other(u16),
}

/// One section header, decoded, with its bytes in the file (none for
/// NOBITS).
#[derive(Debug, Clone)]
pub struct Section<'a> {
    pub index: usize,
    pub name: String,
    pub sh_type: u32,
    pub flags: u64,
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
    pub data: &'a [u8],
}

impl Section<'_> {
    pub fn is_nobits(&self) -> bool {
        self.sh_type == elf::SHT_NOBITS
    }
}

/// A parsed ELF file over borrowed bytes: its header tables as `object`'s
/// types, bounds-checked against the file.
#[derive(Clone, Copy)]
pub struct ElfView<'a> {
    data: &'a [u8],
    header: &'a FileHeader,
    phdrs: &'a [ProgramHeader],
    shdrs: &'a [SectionHeader],
    names: StringTable<'a>,
}

impl<'a> ElfView<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Self, ElfError> {
        if !data.starts_with(&elf::ELFMAG) {
            return Err(ElfError::NotElf);
        }
        // e_ident[EI_CLASS] and e_ident[EI_DATA], checked before parsing
        // to say exactly what is unsupported.
        match data.get(4) {
            Some(&elf::ELFCLASS64) => {}
            Some(&elf::ELFCLASS32) => return Err(ElfError::Unsupported("32-bit ELF")),
            _ => return Err(ElfError::Malformed("bad ELF class byte".into())),
        }
        if data.get(5) != Some(&elf::ELFDATA2LSB) {
            return Err(ElfError::Unsupported("big-endian ELF"));
        }
        let header = FileHeader::parse(data).map_err(malformed)?;
        let phdrs = header.program_headers(LE, data).map_err(|_| {
            ElfError::Malformed("program header table lies outside the file".into())
        })?;
        let shdrs = header.section_headers(LE, data).map_err(malformed)?;
        let names = header.section_strings(LE, data, shdrs).map_err(malformed)?;
        Ok(ElfView {
            data,
            header,
            phdrs,
            shdrs,
            names,
        })
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    pub fn header(&self) -> &'a FileHeader {
        self.header
    }

    /// Every program header, in table order.
    pub fn phdrs(&self) -> &'a [ProgramHeader] {
        self.phdrs
    }

    /// Every section header, in table order (index 0, the null section,
    /// included).
    pub(crate) fn shdrs(&self) -> &'a [SectionHeader] {
        self.shdrs
    }

    pub fn e_type(&self) -> u16 {
        self.header.e_type(LE)
    }

    pub fn elf_type(&self) -> ElfType {
        match self.e_type() {
            elf::ET_REL => ElfType::Relocatable,
            elf::ET_EXEC => ElfType::Executable,
            elf::ET_DYN => ElfType::Shared,
            t => ElfType::Other(t),
        }
    }

    pub fn machine(&self) -> u16 {
        self.header.e_machine(LE)
    }

    /// The name of section `index` (lossy for non-UTF-8 names).
    pub fn section_name(&self, index: usize) -> Result<String, ElfError> {
        let sh = self
            .shdrs
            .get(index)
            .ok_or_else(|| ElfError::Malformed(format!("no section {index}")))?;
        let name = sh.name(LE, self.names).map_err(malformed)?;
        Ok(String::from_utf8_lossy(name).into_owned())
    }

    /// Index of the first section with this name.
    pub fn section_index(&self, name: &str) -> Option<usize> {
        self.shdrs
            .iter()
            .position(|sh| sh.name(LE, self.names).ok() == Some(name.as_bytes()))
    }

    /// Check that every section's name reads and its bytes lie inside the
    /// file (tools that rewrite or verify the file need all of them).
    pub(crate) fn check_sections(&self) -> Result<(), ElfError> {
        (0..self.shdrs.len()).try_for_each(|i| self.describe(i).map(drop))
    }

    /// All sections, decoded, in header order.
    pub fn sections(&self) -> Result<Vec<Section<'a>>, ElfError> {
        (0..self.shdrs.len()).map(|i| self.describe(i)).collect()
    }

    /// The first section with this name.
    pub fn section(&self, name: &str) -> Result<Option<Section<'a>>, ElfError> {
        self.section_index(name)
            .map(|i| self.describe(i))
            .transpose()
    }

    fn describe(&self, index: usize) -> Result<Section<'a>, ElfError> {
        let sh = &self.shdrs[index];
        let name = self.section_name(index)?;
        // An SHT_NULL header is inactive: its other fields mean nothing.
        let data = match sh.sh_type(LE) {
            elf::SHT_NULL => &[][..],
            _ => sh.data(LE, self.data).map_err(|e| ElfError::BadSection {
                name: name.clone(),
                problem: format!("its bytes lie outside the file ({e})"),
            })?,
        };
        Ok(Section {
            index,
            name,
            sh_type: sh.sh_type(LE),
            flags: sh.sh_flags(LE),
            addr: sh.sh_addr(LE),
            offset: sh.sh_offset(LE),
            size: sh.sh_size(LE),
            data,
        })
    }

    /// File offset of a virtual address, through the PT_LOAD whose
    /// file-backed part holds `len` bytes there.
    pub(crate) fn addr_to_offset(&self, addr: u64, len: u64) -> Option<u64> {
        self.phdrs
            .iter()
            .filter(|p| p.p_type(LE) == elf::PT_LOAD)
            .find(|p| {
                let start = p.p_vaddr(LE);
                addr >= start && addr.saturating_add(len) <= start.saturating_add(p.p_filesz(LE))
            })
            .map(|p| addr - p.p_vaddr(LE) + p.p_offset(LE))
    }

    /// Every entry of every allocated `SHT_RELA` section.
    pub fn relas(&self) -> Result<Vec<RelaEntry>, ElfError> {
        Ok(Relocations::read(self)?.relas(self).collect())
    }

    /// The addresses relocated by every `SHT_RELR` section (packed relative
    /// relocations: the value stays in the file and the base is added).
    pub fn relr(&self) -> Result<Vec<u64>, ElfError> {
        Ok(Relocations::read(self)?.relr(self).collect())
    }

    /// The indices of the allocated `SHT_RELA` sections, their bounds
    /// checked.
    fn rela_tables(&self) -> Result<Vec<usize>, ElfError> {
        let mut out = Vec::new();
        for (i, sh) in self.shdrs.iter().enumerate() {
            if sh.sh_type(LE) != elf::SHT_RELA || sh.sh_flags(LE) & u64::from(elf::SHF_ALLOC) == 0 {
                continue;
            }
            let bad = || ElfError::BadSection {
                name: self.section_name(i).unwrap_or_default(),
                problem: "bad relocation table bounds".into(),
            };
            if sh.sh_size(LE) % RELA_SIZE as u64 != 0 {
                return Err(bad());
            }
            let _: &[Rela] = sh.data_as_array(LE, self.data).map_err(|_| bad())?;
            out.push(i);
        }
        Ok(out)
    }

    /// The indices of the `SHT_RELR` sections, their bounds and addresses
    /// checked.
    fn relr_tables(&self) -> Result<Vec<usize>, ElfError> {
        let mut out = Vec::new();
        for (i, sh) in self.shdrs.iter().enumerate() {
            if sh.sh_type(LE) != elf::SHT_RELR {
                continue;
            }
            let bad = |problem: &str| ElfError::BadSection {
                name: self.section_name(i).unwrap_or_default(),
                problem: problem.into(),
            };
            if sh.sh_size(LE) % 8 != 0 {
                return Err(bad("bad RELR table bounds"));
            }
            let words = sh
                .data(LE, self.data)
                .map_err(|_| bad("bad RELR table bounds"))?;
            if !relr_fits(words) {
                return Err(bad("RELR entries run past the end of the address space"));
            }
            sh.relr(LE, self.data)
                .map_err(|_| bad("bad RELR table bounds"))?;
            out.push(i);
        }
        Ok(out)
    }

    /// The word a packed (RELR) relocation at `addr` relocates, as it is
    /// in the file (the address it points at, before the base is added).
    pub(crate) fn relr_value(&self, addr: u64) -> Option<u64> {
        self.addr_to_offset(addr, 8)
            .and_then(|o| crate::bytes::u64_at(self.data, o))
    }

    /// `st_value` of a `.dynsym` symbol.
    pub(crate) fn dynsym_value(&self, sym: u32) -> Result<u64, ElfError> {
        let i = self.section_index(".dynsym").ok_or_else(|| {
            ElfError::Malformed("relocation against a symbol, but no .dynsym".into())
        })?;
        let syms: &[Sym] = self.shdrs[i]
            .data_as_array(LE, self.data)
            .map_err(|_| ElfError::Malformed(".dynsym outside the file".into()))?;
        syms.get(sym as usize)
            .map(|s| s.st_value(LE))
            .ok_or_else(|| {
                ElfError::Malformed(format!("relocation symbol {sym} is outside .dynsym"))
            })
    }

    /// Resolve the pointer field at virtual address `addr` (file offset
    /// `off`), relocated as `at` says ([`Relocations::find`]): its value at
    /// load time, relative to the load base.
    pub(crate) fn pointer_with(
        &self,
        at: RelocAt,
        addr: u64,
        off: u64,
    ) -> Result<Pointer, ElfError> {
        if let RelocAt::Rela(ri, r) = at {
            return self.rela_pointer(r, ri, addr);
        }
        let value = crate::bytes::u64_at(self.data, off).ok_or_else(|| {
            ElfError::Malformed(format!("pointer at {addr:#x} lies outside the file"))
        })?;
        let kind = match at {
            RelocAt::Relr => PointerKind::Relr,
            _ => PointerKind::Absolute,
        };
        Ok(Pointer {
            value,
            kind,
            rela: None,
        })
    }

    fn rela_pointer(&self, r: RelaEntry, ri: usize, addr: u64) -> Result<Pointer, ElfError> {
        let kinds = RelocKinds::for_machine(self.machine());
        let (value, kind) = match kinds {
            Some(k) if r.r_type == k.relative => (r.r_addend as u64, PointerKind::RelaRelative),
            Some(k) if r.r_type == k.abs64 => {
                let s = if r.r_sym == 0 {
                    0
                } else {
                    self.dynsym_value(r.r_sym)?
                };
                (s.wrapping_add(r.r_addend as u64), PointerKind::RelaAbsolute)
            }
            _ => {
                return Err(ElfError::Malformed(format!(
                    "pointer at {addr:#x} has a relocation of unsupported type {}",
                    r.r_type
                )))
            }
        };
        Ok(Pointer {
            value,
            kind,
            rela: Some(ri),
        })
    }
}

/// One relocation with an explicit addend, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelaEntry {
    /// File offset of this entry (to rewrite it in place).
    pub entry_offset: u64,
    pub r_offset: u64,
    pub r_type: u32,
    pub r_sym: u32,
    pub r_addend: i64,
}

impl RelaEntry {
    fn decode(r: &Rela, entry_offset: u64) -> RelaEntry {
        RelaEntry {
            entry_offset,
            r_offset: r.r_offset(LE),
            r_type: r.r_type(LE, false),
            r_sym: r.r_sym(LE, false),
            r_addend: r.r_addend(LE),
        }
    }

    /// The entry in the file's form.
    pub fn to_rela(&self) -> Rela {
        let mut r = Rela {
            r_offset: object::U64::new(LE, self.r_offset),
            r_info: object::U64::new(LE, 0),
            r_addend: object::I64::new(LE, self.r_addend),
        };
        r.set_r_info(LE, false, self.r_sym, self.r_type);
        r
    }
}

/// The dynamic relocations of a file: which sections hold them, their
/// bounds checked once. Entries are decoded from the file's bytes as they
/// are walked, never copied: a large binary has millions of them.
#[derive(Debug, Clone, Default)]
pub struct Relocations {
    /// Allocated `SHT_RELA` sections.
    rela: Vec<usize>,
    /// `SHT_RELR` sections.
    relr: Vec<usize>,
}

/// How one address is relocated ([`Relocations::find`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RelocAt {
    /// The first RELA entry at it, and its index in [`Relocations::relas`].
    Rela(usize, RelaEntry),
    /// A packed relative relocation (and no RELA entry).
    Relr,
    None,
}

impl Relocations {
    pub fn read(elf: &ElfView) -> Result<Relocations, ElfError> {
        Ok(Relocations {
            rela: elf.rela_tables()?,
            relr: elf.relr_tables()?,
        })
    }

    /// Every RELA entry, in section and table order.
    pub fn relas<'e>(&'e self, elf: &'e ElfView<'e>) -> impl Iterator<Item = RelaEntry> + 'e {
        self.rela.iter().flat_map(move |&i| {
            let sh = &elf.shdrs()[i];
            let entries: &[Rela] = sh.data_as_array(LE, elf.bytes()).unwrap_or(&[]);
            let base = sh.sh_offset(LE);
            entries
                .iter()
                .enumerate()
                .map(move |(k, r)| RelaEntry::decode(r, base + (k * RELA_SIZE) as u64))
        })
    }

    /// RELA entry `index` (as [`Relocations::relas`] counts).
    pub fn rela(&self, elf: &ElfView, index: usize) -> Option<RelaEntry> {
        let mut index = index;
        for &i in &self.rela {
            let sh = &elf.shdrs()[i];
            let entries: &[Rela] = sh.data_as_array(LE, elf.bytes()).unwrap_or(&[]);
            if index < entries.len() {
                let at = sh.sh_offset(LE) + (index * RELA_SIZE) as u64;
                return Some(RelaEntry::decode(&entries[index], at));
            }
            index -= entries.len();
        }
        None
    }

    /// Every address a packed relative relocation relocates.
    pub fn relr<'e>(&'e self, elf: &'e ElfView<'e>) -> impl Iterator<Item = u64> + 'e {
        self.relr.iter().flat_map(move |&i| {
            let relr = elf.shdrs()[i].relr(LE, elf.bytes()).ok().flatten();
            relr.into_iter().flatten()
        })
    }

    /// How each of `addrs` is relocated, in one pass over the tables.
    pub(crate) fn find(&self, elf: &ElfView, addrs: &[u64]) -> Vec<RelocAt> {
        let mut out = vec![RelocAt::None; addrs.len()];
        let mut wanted: std::collections::HashMap<u64, Vec<usize>> = Default::default();
        for (k, &a) in addrs.iter().enumerate() {
            wanted.entry(a).or_default().push(k);
        }
        for (ri, r) in self.relas(elf).enumerate() {
            for &k in wanted.get(&r.r_offset).into_iter().flatten() {
                if out[k] == RelocAt::None {
                    out[k] = RelocAt::Rela(ri, r);
                }
            }
        }
        for a in self.relr(elf) {
            for &k in wanted.get(&a).into_iter().flatten() {
                if out[k] == RelocAt::None {
                    out[k] = RelocAt::Relr;
                }
            }
        }
        out
    }

    /// The address of every relocation, RELA then RELR.
    pub(crate) fn addresses<'e>(&'e self, elf: &'e ElfView<'e>) -> impl Iterator<Item = u64> + 'e {
        self.relas(elf).map(|r| r.r_offset).chain(self.relr(elf))
    }
}

/// The relocation types that matter for a wrapper's pointer, per machine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RelocKinds {
    /// `base + addend`.
    pub relative: u32,
    /// `symbol + addend` (64-bit absolute).
    pub abs64: u32,
}

impl RelocKinds {
    /// The host machines kpack rewrites binaries of (64-bit little-endian
    /// ELF): x86-64, AArch64 and ppc64le.
    pub(crate) fn for_machine(machine: u16) -> Option<Self> {
        let (relative, abs64) = match machine {
            elf::EM_X86_64 => (elf::R_X86_64_RELATIVE, elf::R_X86_64_64),
            elf::EM_AARCH64 => (elf::R_AARCH64_RELATIVE, elf::R_AARCH64_ABS64),
            elf::EM_PPC64 => (elf::R_PPC64_RELATIVE, elf::R_PPC64_ADDR64),
            _ => return None,
        };
        Some(RelocKinds { relative, abs64 })
    }
}

/// The name of an ELF machine (`e_machine`), for messages.
pub(crate) fn machine_name(machine: u16) -> String {
    let name = match machine {
        elf::EM_386 => "EM_386 (x86)",
        elf::EM_X86_64 => "EM_X86_64 (x86-64)",
        elf::EM_AARCH64 => "EM_AARCH64 (AArch64)",
        elf::EM_ARM => "EM_ARM (32-bit Arm)",
        elf::EM_PPC => "EM_PPC (32-bit PowerPC)",
        elf::EM_PPC64 => "EM_PPC64 (PowerPC 64)",
        elf::EM_S390 => "EM_S390 (IBM Z)",
        elf::EM_RISCV => "EM_RISCV (RISC-V)",
        elf::EM_LOONGARCH => "EM_LOONGARCH (LoongArch)",
        elf::EM_MIPS => "EM_MIPS (MIPS)",
        elf::EM_SPARCV9 => "EM_SPARCV9 (SPARC V9)",
        elf::EM_AMDGPU => "EM_AMDGPU (an AMDGPU code object, not a host binary)",
        _ => return format!("{machine}"),
    };
    format!("{name} ({machine})").replace(") (", ", ")
}

/// How a pointer stored in the binary gets its load-time value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PointerKind {
    /// A RELA relative relocation: base + addend.
    RelaRelative,
    /// A RELA absolute relocation against a symbol: symbol + addend.
    RelaAbsolute,
    /// A packed relative relocation: base + the value in the file.
    Relr,
    /// No relocation: the value in the file is the pointer.
    Absolute,
    /// PE: a DIR64 base relocation rebases the value in the file (an
    /// absolute address at the preferred image base).
    BaseRelocDir64,
}

/// A 64-bit pointer field of a loaded image: its value relative to the load
/// base, how it gets it, and the index (in [`Relocations::relas`]) of its
/// relocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pointer {
    pub value: u64,
    pub kind: PointerKind,
    pub rela: Option<usize>,
}

/// Accessors for the fields of a program header as plain numbers.
pub trait PhdrExt {
    fn is_load(&self) -> bool;
    /// Does the file-backed part of this segment hold `[off, off+len)`?
    fn file_contains(&self, off: u64, len: u64) -> bool;
    /// Does the memory image of this segment hold `[addr, addr+len)`?
    fn mem_contains(&self, addr: u64, len: u64) -> bool;
}

impl PhdrExt for ProgramHeader {
    fn is_load(&self) -> bool {
        self.p_type(LE) == elf::PT_LOAD
    }

    fn file_contains(&self, off: u64, len: u64) -> bool {
        let start = self.p_offset(LE);
        off >= start && off.saturating_add(len) <= start.saturating_add(self.p_filesz(LE))
    }

    fn mem_contains(&self, addr: u64, len: u64) -> bool {
        let start = self.p_vaddr(LE);
        addr >= start && addr.saturating_add(len) <= start.saturating_add(self.p_memsz(LE))
    }
}

/// Whether the addresses a RELR table (64-bit words) encodes stay below
/// 2^64: an even word is an address, and each bitmap word after it covers
/// the 63 words that follow the last one covered.
fn relr_fits(words: &[u8]) -> bool {
    let mut last = Some(0u64);
    for w in words.chunks_exact(8) {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        last = match w & 1 {
            0 => Some(w),
            _ => last.and_then(|a| a.checked_add(63 * 8)),
        };
        if last.is_none() {
            return false;
        }
    }
    true
}

/// Bytes of a section in the file (none for NOBITS, nor for an inactive
/// SHT_NULL header).
pub fn file_size(sh: &SectionHeader) -> u64 {
    if matches!(sh.sh_type(LE), elf::SHT_NOBITS | elf::SHT_NULL) {
        0
    } else {
        sh.sh_size(LE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relr_tables_that_overflow_are_found() {
        let table = |words: &[u64]| {
            words
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<u8>>()
        };
        assert!(relr_fits(&table(&[0x1000, 0b101, u64::MAX])));
        let top = u64::MAX - 7 - 63 * 8;
        assert!(relr_fits(&table(&[top, u64::MAX])));
        assert!(!relr_fits(&table(&[top + 8, u64::MAX])));
        assert!(!relr_fits(&table(&[top, u64::MAX, 3])));
    }

    // By hand: idents cut after a few bytes, which object::write cannot make.
    #[test]
    fn rejects_non_elf_and_truncated() {
        assert!(matches!(ElfView::parse(b"hello"), Err(ElfError::NotElf)));
        assert!(matches!(
            ElfView::parse(b"\x7fELF\x02\x01\x01"),
            Err(ElfError::Malformed(_))
        ));
        assert!(matches!(
            ElfView::parse(b"\x7fELF\x01\x01\x01"),
            Err(ElfError::Unsupported(_))
        ));
        assert!(matches!(
            ElfView::parse(b"\x7fELF\x02\x02\x01"),
            Err(ElfError::Unsupported(_))
        ));
    }

    #[test]
    fn reads_own_executable() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let view = ElfView::parse(&exe).unwrap();
        let text = view.section(".text").unwrap().expect(".text");
        assert!(text.size > 0 && !text.is_nobits());
        assert!(view.section(FATBIN_SECTION).unwrap().is_none());
        assert!(view.sections().unwrap().len() > 5);
        assert!(!view.phdrs().is_empty());
    }

    #[test]
    fn machines() {
        assert!(RelocKinds::for_machine(elf::EM_PPC64).is_some());
        assert!(RelocKinds::for_machine(elf::EM_RISCV).is_none());
        assert_eq!(machine_name(elf::EM_RISCV), "EM_RISCV (RISC-V, 243)");
        assert_eq!(machine_name(9999), "9999");
    }

    /// The reference's tools write section header tables at offsets that
    /// are not 8-byte aligned; readelf and ld.so accept them, and so must
    /// kpack.
    // By hand: a section header table at an odd offset, which object::write cannot make.
    #[test]
    fn reads_unaligned_section_header_table() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let view = ElfView::parse(&exe).unwrap();
        let shoff = view.header().e_shoff(LE) as usize;
        let shnum = view.shdrs().len();
        let table = exe[shoff..shoff + shnum * SHDR_SIZE].to_vec();
        // Move the table to an odd offset at the end of the file.
        let mut moved = exe.clone();
        moved.push(0);
        let new_off = moved.len();
        assert_eq!(new_off % 8, 1);
        moved.extend_from_slice(&table);
        crate::bytes::put_u64(&mut moved, 0x28, new_off as u64);
        let view = ElfView::parse(&moved).unwrap();
        assert_eq!(view.shdrs().len(), shnum);
        assert!(view.section(".text").unwrap().is_some());
    }
}

/// What is wrong with the segment a section is mapped to by its file
/// offset, as eu-elflint (and other readers that map sections by offset)
/// sees it ([`offset_mapping_problems`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum MappingProblem {
    /// Its offset falls in no `PT_LOAD` (`PT_TLS` for a TLS section).
    Unloaded,
    /// The first segment whose file window holds its offset ends before it
    /// does: a NOBITS section's offset landing in another segment's
    /// zero-filled window.
    Uncontained,
    /// Not NOBITS, but its offset lies past the file bytes of that segment.
    OutsideFile,
}

impl MappingProblem {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            MappingProblem::Unloaded => "its file offset lies in no loaded segment",
            MappingProblem::Uncontained => {
                "its file offset lands in a segment that does not contain it (eu-elflint: not fully contained in segment)"
            }
            MappingProblem::OutsideFile => "it has bytes, but not in the file part of its segment",
        }
    }
}

/// The problems of every allocated section (index 0 and non-allocated ones
/// aside) with the segment its file offset maps it to, as eu-elflint maps
/// them: the first `PT_LOAD` (`PT_TLS` for a TLS section) in table order
/// whose file window holds the offset, the window being the segment's file
/// bytes, or for a NOBITS section its memory size. (A NOBITS section whose
/// offset lies among a segment's file bytes is not reported: eu-elflint
/// accepts it where those bytes are zero, as GNU ld writes them.)
pub(crate) fn offset_mapping_problems(
    phdrs: &[ProgramHeader],
    shdrs: &[SectionHeader],
) -> Vec<(usize, MappingProblem)> {
    let mut out = Vec::new();
    for (i, s) in shdrs.iter().enumerate().skip(1) {
        let flags = s.sh_flags(LE);
        if flags & u64::from(elf::SHF_ALLOC) == 0 {
            continue;
        }
        let tls = flags & u64::from(elf::SHF_TLS) != 0;
        let nobits = s.sh_type(LE) == elf::SHT_NOBITS;
        let (off, size) = (s.sh_offset(LE), s.sh_size(LE));
        let seg = phdrs.iter().find(|p| {
            let kind = p.p_type(LE) == if tls { elf::PT_TLS } else { elf::PT_LOAD };
            let (p_off, filesz, memsz) = (p.p_offset(LE), p.p_filesz(LE), p.p_memsz(LE));
            let rel = off.wrapping_sub(p_off);
            kind && p_off <= off
                && ((rel <= filesz && (rel < filesz || size == 0)) || (rel < memsz && nobits))
        });
        let Some(p) = seg else {
            out.push((i, MappingProblem::Unloaded));
            continue;
        };
        let (p_off, filesz, memsz) = (p.p_offset(LE), p.p_filesz(LE), p.p_memsz(LE));
        if p_off.saturating_add(memsz) < off.saturating_add(size) {
            out.push((i, MappingProblem::Uncontained));
        }
        let end = p_off + filesz;
        if !nobits && (off > end || (off == end && size != 0)) {
            out.push((i, MappingProblem::OutsideFile));
        }
    }
    out
}
