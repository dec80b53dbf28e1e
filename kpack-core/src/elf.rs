//! ELF access for fat and offloaded host binaries: headers and named
//! sections, read natively over borrowed bytes (no readelf, no objcopy).
//!
//! Only 64-bit little-endian ELF is supported (x86-64 and AArch64 hosts,
//! the platforms HIP runs on).

use object::elf;
use object::read::elf::{FileHeader as _, SectionHeader as _, SectionTable};
use object::LittleEndian as LE;

/// The section holding the offload bundles of a fat binary.
pub const FATBIN_SECTION: &str = ".hip_fatbin";
/// The section holding the `__CudaFatBinaryWrapper` array.
pub const WRAPPER_SECTION: &str = ".hipFatBinSegment";
/// The section holding the HIPK metadata of an offloaded binary.
pub const METADATA_SECTION: &str = ".rocm_kpack_ref";

type Header = elf::FileHeader64<LE>;

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

/// One section header, with its bytes in the file (none for NOBITS).
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

/// A parsed ELF file over borrowed bytes.
pub struct ElfView<'a> {
    data: &'a [u8],
    header: &'a Header,
    sections: SectionTable<'a, Header>,
}

impl<'a> ElfView<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Self, ElfError> {
        if !data.starts_with(b"\x7fELF") {
            return Err(ElfError::NotElf);
        }
        match data.get(4) {
            Some(&elf::ELFCLASS64) => {}
            Some(&elf::ELFCLASS32) => return Err(ElfError::Unsupported("32-bit ELF")),
            _ => return Err(ElfError::Malformed("bad ELF class byte".into())),
        }
        if data.get(5) != Some(&elf::ELFDATA2LSB) {
            return Err(ElfError::Unsupported("big-endian ELF"));
        }
        let header = Header::parse(data).map_err(malformed)?;
        let sections = header.sections(LE, data).map_err(malformed)?;
        Ok(ElfView {
            data,
            header,
            sections,
        })
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    pub fn elf_type(&self) -> ElfType {
        match self.header.e_type.get(LE) {
            elf::ET_REL => ElfType::Relocatable,
            elf::ET_EXEC => ElfType::Executable,
            elf::ET_DYN => ElfType::Shared,
            t => ElfType::Other(t),
        }
    }

    pub fn machine(&self) -> u16 {
        self.header.e_machine.get(LE)
    }

    /// All sections, in header order (index 0, the null section, included).
    pub fn sections(&self) -> Result<Vec<Section<'a>>, ElfError> {
        self.sections
            .iter()
            .enumerate()
            .map(|(i, sh)| self.describe(i, sh))
            .collect()
    }

    fn section_at(&self, index: usize) -> Result<Section<'a>, ElfError> {
        let sh = self
            .sections
            .section(object::SectionIndex(index))
            .map_err(malformed)?;
        self.describe(index, sh)
    }

    fn describe(
        &self,
        index: usize,
        sh: &'a elf::SectionHeader64<LE>,
    ) -> Result<Section<'a>, ElfError> {
        let name = self.sections.section_name(LE, sh).map_err(malformed)?;
        let name = String::from_utf8_lossy(name).into_owned();
        let data = sh.data(LE, self.data).map_err(|e| ElfError::BadSection {
            name: name.clone(),
            problem: format!("its bytes lie outside the file ({e})"),
        })?;
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

    /// The first section with this name.
    pub fn section(&self, name: &str) -> Result<Option<Section<'a>>, ElfError> {
        match self.sections.section_by_name(LE, name.as_bytes()) {
            Some((index, _)) => self.section_at(index.0).map(Some),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}

/// Size of an ELF64 program header.
pub const PHDR_SIZE: usize = 56;
/// Size of an ELF64 section header.
pub const SHDR_SIZE: usize = 64;
/// Size of an ELF64 file header.
pub const EHDR_SIZE: usize = 64;
/// `SHT_RELR` (packed relative relocations).
pub const SHT_RELR: u32 = 19;

fn rd_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn rd_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The fields of the ELF64 file header that kpack reads or rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    pub e_type: u16,
    pub e_machine: u16,
    pub e_phoff: u64,
    pub e_shoff: u64,
    pub e_phentsize: u16,
    pub e_phnum: u16,
    pub e_shentsize: u16,
    pub e_shnum: u16,
    pub e_shstrndx: u16,
}

impl FileHeader {
    pub fn parse(b: &[u8]) -> Result<Self, ElfError> {
        if b.len() < EHDR_SIZE {
            return Err(ElfError::Malformed("file header truncated".into()));
        }
        Ok(FileHeader {
            e_type: rd_u16(b, 16),
            e_machine: rd_u16(b, 18),
            e_phoff: rd_u64(b, 32),
            e_shoff: rd_u64(b, 40),
            e_phentsize: rd_u16(b, 54),
            e_phnum: rd_u16(b, 56),
            e_shentsize: rd_u16(b, 58),
            e_shnum: rd_u16(b, 60),
            e_shstrndx: rd_u16(b, 62),
        })
    }

    /// Write the fields back into a file header's bytes (others untouched).
    pub fn write(&self, b: &mut [u8]) {
        b[16..18].copy_from_slice(&self.e_type.to_le_bytes());
        b[18..20].copy_from_slice(&self.e_machine.to_le_bytes());
        b[32..40].copy_from_slice(&self.e_phoff.to_le_bytes());
        b[40..48].copy_from_slice(&self.e_shoff.to_le_bytes());
        b[54..56].copy_from_slice(&self.e_phentsize.to_le_bytes());
        b[56..58].copy_from_slice(&self.e_phnum.to_le_bytes());
        b[58..60].copy_from_slice(&self.e_shentsize.to_le_bytes());
        b[60..62].copy_from_slice(&self.e_shnum.to_le_bytes());
        b[62..64].copy_from_slice(&self.e_shstrndx.to_le_bytes());
    }
}

/// An ELF64 program header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramHeader {
    pub p_type: u32,
    pub p_flags: u32,
    pub p_offset: u64,
    pub p_vaddr: u64,
    pub p_paddr: u64,
    pub p_filesz: u64,
    pub p_memsz: u64,
    pub p_align: u64,
}

impl ProgramHeader {
    pub fn parse(b: &[u8]) -> Self {
        ProgramHeader {
            p_type: rd_u32(b, 0),
            p_flags: rd_u32(b, 4),
            p_offset: rd_u64(b, 8),
            p_vaddr: rd_u64(b, 16),
            p_paddr: rd_u64(b, 24),
            p_filesz: rd_u64(b, 32),
            p_memsz: rd_u64(b, 40),
            p_align: rd_u64(b, 48),
        }
    }

    pub fn to_bytes(&self) -> [u8; PHDR_SIZE] {
        let mut b = [0u8; PHDR_SIZE];
        b[0..4].copy_from_slice(&self.p_type.to_le_bytes());
        b[4..8].copy_from_slice(&self.p_flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.p_offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.p_vaddr.to_le_bytes());
        b[24..32].copy_from_slice(&self.p_paddr.to_le_bytes());
        b[32..40].copy_from_slice(&self.p_filesz.to_le_bytes());
        b[40..48].copy_from_slice(&self.p_memsz.to_le_bytes());
        b[48..56].copy_from_slice(&self.p_align.to_le_bytes());
        b
    }

    pub fn is_load(&self) -> bool {
        self.p_type == elf::PT_LOAD
    }

    /// Does the file-backed part of this segment hold `[off, off+len)`?
    pub fn file_contains(&self, off: u64, len: u64) -> bool {
        off >= self.p_offset
            && off.saturating_add(len) <= self.p_offset.saturating_add(self.p_filesz)
    }

    /// Does the memory image of this segment hold `[addr, addr+len)`?
    pub fn mem_contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.p_vaddr
            && addr.saturating_add(len) <= self.p_vaddr.saturating_add(self.p_memsz)
    }
}

/// An ELF64 section header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionHeader {
    pub sh_name: u32,
    pub sh_type: u32,
    pub sh_flags: u64,
    pub sh_addr: u64,
    pub sh_offset: u64,
    pub sh_size: u64,
    pub sh_link: u32,
    pub sh_info: u32,
    pub sh_addralign: u64,
    pub sh_entsize: u64,
}

impl SectionHeader {
    pub fn parse(b: &[u8]) -> Self {
        SectionHeader {
            sh_name: rd_u32(b, 0),
            sh_type: rd_u32(b, 4),
            sh_flags: rd_u64(b, 8),
            sh_addr: rd_u64(b, 16),
            sh_offset: rd_u64(b, 24),
            sh_size: rd_u64(b, 32),
            sh_link: rd_u32(b, 40),
            sh_info: rd_u32(b, 44),
            sh_addralign: rd_u64(b, 48),
            sh_entsize: rd_u64(b, 56),
        }
    }

    pub fn to_bytes(&self) -> [u8; SHDR_SIZE] {
        let mut b = [0u8; SHDR_SIZE];
        b[0..4].copy_from_slice(&self.sh_name.to_le_bytes());
        b[4..8].copy_from_slice(&self.sh_type.to_le_bytes());
        b[8..16].copy_from_slice(&self.sh_flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.sh_addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.sh_offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.sh_size.to_le_bytes());
        b[40..44].copy_from_slice(&self.sh_link.to_le_bytes());
        b[44..48].copy_from_slice(&self.sh_info.to_le_bytes());
        b[48..56].copy_from_slice(&self.sh_addralign.to_le_bytes());
        b[56..64].copy_from_slice(&self.sh_entsize.to_le_bytes());
        b
    }

    /// Bytes of the section in the file (none for NOBITS).
    pub fn file_size(&self) -> u64 {
        if self.sh_type == elf::SHT_NOBITS {
            0
        } else {
            self.sh_size
        }
    }
}

/// All headers of an ELF64 little-endian file, as plain values, checked
/// against the file size.
#[derive(Debug, Clone)]
pub struct Headers {
    pub file: FileHeader,
    pub phdrs: Vec<ProgramHeader>,
    pub shdrs: Vec<SectionHeader>,
    /// Section names, by index.
    pub names: Vec<String>,
}

impl Headers {
    pub fn parse(b: &[u8]) -> Result<Self, ElfError> {
        // Validates class, endianness and table bounds.
        let view = ElfView::parse(b)?;
        let file = FileHeader::parse(b)?;
        let ph_end = (file.e_phnum as u64)
            .checked_mul(PHDR_SIZE as u64)
            .and_then(|n| n.checked_add(file.e_phoff))
            .filter(|&e| e <= b.len() as u64);
        if file.e_phnum > 0 && (file.e_phentsize as usize != PHDR_SIZE || ph_end.is_none()) {
            return Err(ElfError::Malformed(
                "program header table lies outside the file".into(),
            ));
        }
        let phdrs = (0..file.e_phnum as usize)
            .map(|i| ProgramHeader::parse(&b[file.e_phoff as usize + i * PHDR_SIZE..]))
            .collect();
        let sections = view.sections()?;
        let mut shdrs = Vec::with_capacity(sections.len());
        let mut names = Vec::with_capacity(sections.len());
        let shoff = file.e_shoff as usize;
        for s in sections {
            shdrs.push(SectionHeader::parse(&b[shoff + s.index * SHDR_SIZE..]));
            names.push(s.name);
        }
        Ok(Headers {
            file,
            phdrs,
            shdrs,
            names,
        })
    }

    /// Index of the first section with this name.
    pub fn section_index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// File offset of a virtual address, through the PT_LOAD whose
    /// file-backed part holds `len` bytes there.
    pub fn addr_to_offset(&self, addr: u64, len: u64) -> Option<u64> {
        self.phdrs
            .iter()
            .filter(|p| p.is_load())
            .find(|p| {
                addr >= p.p_vaddr
                    && addr.saturating_add(len) <= p.p_vaddr.saturating_add(p.p_filesz)
            })
            .map(|p| addr - p.p_vaddr + p.p_offset)
    }
}

/// One relocation with an explicit addend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rela {
    /// File offset of this entry (to rewrite it in place).
    pub entry_offset: u64,
    pub r_offset: u64,
    pub r_type: u32,
    pub r_sym: u32,
    pub r_addend: i64,
}

impl Rela {
    pub const SIZE: usize = 24;

    pub fn to_bytes(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[0..8].copy_from_slice(&self.r_offset.to_le_bytes());
        let info = ((self.r_sym as u64) << 32) | self.r_type as u64;
        b[8..16].copy_from_slice(&info.to_le_bytes());
        b[16..24].copy_from_slice(&self.r_addend.to_le_bytes());
        b
    }
}

/// The relocation types that matter for a wrapper's pointer, per machine.
#[derive(Debug, Clone, Copy)]
pub struct RelocKinds {
    /// `base + addend`.
    pub relative: u32,
    /// `symbol + addend` (64-bit absolute).
    pub abs64: u32,
}

impl RelocKinds {
    pub fn for_machine(machine: u16) -> Option<Self> {
        match machine {
            elf::EM_X86_64 => Some(RelocKinds {
                relative: elf::R_X86_64_RELATIVE,
                abs64: elf::R_X86_64_64,
            }),
            elf::EM_AARCH64 => Some(RelocKinds {
                relative: elf::R_AARCH64_RELATIVE,
                abs64: elf::R_AARCH64_ABS64,
            }),
            _ => None,
        }
    }
}

/// Every entry of every allocated `SHT_RELA` section.
pub fn read_relas(b: &[u8], h: &Headers) -> Result<Vec<Rela>, ElfError> {
    let mut out = Vec::new();
    for (i, s) in h.shdrs.iter().enumerate() {
        if s.sh_type != elf::SHT_RELA || s.sh_flags & elf::SHF_ALLOC as u64 == 0 {
            continue;
        }
        let end = s
            .sh_offset
            .checked_add(s.sh_size)
            .filter(|&e| e <= b.len() as u64);
        if end.is_none() || s.sh_size % Rela::SIZE as u64 != 0 {
            return Err(ElfError::BadSection {
                name: h.names[i].clone(),
                problem: "bad relocation table bounds".into(),
            });
        }
        for k in 0..(s.sh_size / Rela::SIZE as u64) {
            let at = (s.sh_offset + k * Rela::SIZE as u64) as usize;
            let info = rd_u64(b, at + 8);
            out.push(Rela {
                entry_offset: at as u64,
                r_offset: rd_u64(b, at),
                r_type: (info & 0xffff_ffff) as u32,
                r_sym: (info >> 32) as u32,
                r_addend: rd_u64(b, at + 16) as i64,
            });
        }
    }
    Ok(out)
}

/// The addresses relocated by every `SHT_RELR` section (packed relative
/// relocations: the value stays in the file and the base is added).
pub fn read_relr(b: &[u8], h: &Headers) -> Result<Vec<u64>, ElfError> {
    let mut out = Vec::new();
    for (i, s) in h.shdrs.iter().enumerate() {
        if s.sh_type != SHT_RELR {
            continue;
        }
        let end = s
            .sh_offset
            .checked_add(s.sh_size)
            .filter(|&e| e <= b.len() as u64);
        if end.is_none() || s.sh_size % 8 != 0 {
            return Err(ElfError::BadSection {
                name: h.names[i].clone(),
                problem: "bad RELR table bounds".into(),
            });
        }
        let mut base = 0u64;
        for k in 0..(s.sh_size / 8) {
            let word = rd_u64(b, (s.sh_offset + k * 8) as usize);
            if word & 1 == 0 {
                out.push(word);
                base = word.wrapping_add(8);
            } else {
                let mut bits = word >> 1;
                let mut addr = base;
                while bits != 0 {
                    if bits & 1 != 0 {
                        out.push(addr);
                    }
                    bits >>= 1;
                    addr = addr.wrapping_add(8);
                }
                base = base.wrapping_add(63 * 8);
            }
        }
    }
    Ok(out)
}

/// `st_value` of a `.dynsym` symbol.
pub fn dynsym_value(b: &[u8], h: &Headers, sym: u32) -> Result<u64, ElfError> {
    let i = h
        .section_index(".dynsym")
        .ok_or_else(|| ElfError::Malformed("relocation against a symbol, but no .dynsym".into()))?;
    let s = &h.shdrs[i];
    let at = (sym as u64)
        .checked_mul(24)
        .filter(|&o| o + 24 <= s.sh_size);
    let at = at.ok_or_else(|| {
        ElfError::Malformed(format!("relocation symbol {sym} is outside .dynsym"))
    })?;
    let at = (s.sh_offset + at + 8) as usize;
    b.get(at..at + 8)
        .map(|v| u64::from_le_bytes(v.try_into().expect("8 bytes")))
        .ok_or_else(|| ElfError::Malformed(".dynsym outside the file".into()))
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
}

/// A 64-bit pointer field of a loaded image: its value relative to the load
/// base, how it gets it, and the index (in `relas`) of its relocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pointer {
    pub value: u64,
    pub kind: PointerKind,
    pub rela: Option<usize>,
}

/// Resolve the pointer field at virtual address `addr` (file offset `off`).
pub fn pointer_at(
    b: &[u8],
    h: &Headers,
    relas: &[Rela],
    relr: &[u64],
    addr: u64,
    off: u64,
) -> Result<Pointer, ElfError> {
    let kinds = RelocKinds::for_machine(h.file.e_machine);
    if let Some(ri) = relas.iter().position(|r| r.r_offset == addr) {
        let r = relas[ri];
        match kinds {
            Some(k) if r.r_type == k.relative => {
                return Ok(Pointer {
                    value: r.r_addend as u64,
                    kind: PointerKind::RelaRelative,
                    rela: Some(ri),
                })
            }
            Some(k) if r.r_type == k.abs64 => {
                let s = if r.r_sym == 0 {
                    0
                } else {
                    dynsym_value(b, h, r.r_sym)?
                };
                return Ok(Pointer {
                    value: s.wrapping_add(r.r_addend as u64),
                    kind: PointerKind::RelaAbsolute,
                    rela: Some(ri),
                });
            }
            _ => {
                return Err(ElfError::Malformed(format!(
                    "pointer at {addr:#x} has a relocation of unsupported type {}",
                    r.r_type
                )))
            }
        }
    }
    let v = b
        .get(off as usize..off as usize + 8)
        .map(|v| u64::from_le_bytes(v.try_into().expect("8 bytes")))
        .ok_or_else(|| {
            ElfError::Malformed(format!("pointer at {addr:#x} lies outside the file"))
        })?;
    let kind = if relr.contains(&addr) {
        PointerKind::Relr
    } else {
        PointerKind::Absolute
    };
    Ok(Pointer {
        value: v,
        kind,
        rela: None,
    })
}
