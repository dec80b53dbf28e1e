//! ELF access for fat and offloaded host binaries: headers and named
//! sections, read natively over borrowed bytes (no readelf, no objcopy).
//!
//! Only 64-bit little-endian ELF is supported (x86-64 and AArch64 hosts,
//! the platforms HIP runs on).

use object::elf;
use object::read::elf::{FileHeader, SectionHeader, SectionTable};
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
