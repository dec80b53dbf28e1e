//! What a file is, and the device-code parts of a host binary.
//!
//! [`classify`] is the one place that decides what kind of file kpack is
//! looking at (fat binary, offloaded binary, host-only binary, debug-only
//! file, link input, bundle, archive, anything else); offload, split,
//! pack-tree, recombine, verify, `ls` and `extract` all ask it.
//! [`HostBinary::wrappers`] is the one reader of the wrapper table
//! (`.hipFatBinSegment`), with each wrapper's pointer resolved to its
//! load-time value.
//!
//! A host binary is ELF today; the interface is what every caller needs
//! whatever the container (sections by role, wrappers with resolved
//! pointers), so that PE/COFF can stand behind it too.

use crate::bytes;
use crate::elf::{
    ElfError, ElfType, ElfView, Pointer, Relocations, Section, FATBIN_SECTION, METADATA_SECTION,
    WRAPPER_SECTION,
};
use crate::hipk::{Wrapper, HIPK_MAGIC, WRAPPER_SIZE};

/// The magic of a static archive (`ar`).
pub const STATIC_ARCHIVE_MAGIC: &[u8] = b"!<arch>\n";

/// What a file is (see [`classify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    /// A host binary (executable or shared object) that carries its device
    /// code: a `.hip_fatbin` section with bytes in the file.
    Fat,
    /// A host binary whose device code was offloaded: `.hip_fatbin` NOBITS
    /// (or gone), HIPK metadata present, every wrapper HIPK.
    Offloaded,
    /// A host binary without device code (no `.hip_fatbin`).
    HostOnly,
    /// A debug-info file (`objcopy --only-keep-debug`, TheRock's `*_dbg`
    /// artifacts), of a fat or an offloaded binary: `.hip_fatbin`, the
    /// wrapper table and any metadata section are NOBITS headers without
    /// bytes. Nothing to offload.
    DebugOnly,
    /// A relocatable object (`ET_REL`): a link input, not a run-time
    /// binary.
    Relocatable {
        /// Whether it carries a `.hip_fatbin` section.
        device_code: bool,
    },
    /// A static archive: a link input.
    StaticArchive,
    /// A host binary whose device-code parts contradict each other (e.g.
    /// `.hip_fatbin` NOBITS but HIPF wrappers): offloading or verifying it
    /// reports this problem.
    Inconsistent(String),
    /// An AMDGPU code object (`.hsaco`, a kernel database's `.co`): device
    /// code on its own, not a host binary.
    CodeObject,
    /// A raw offload bundle file (plain or compressed).
    Bundle,
    /// A `.kpack` archive.
    Archive,
    /// Anything else, including files that start like ELF but do not parse.
    Other,
}

impl Class {
    /// Relocatable objects and static archives.
    pub fn is_link_input(&self) -> bool {
        matches!(self, Class::Relocatable { .. } | Class::StaticArchive)
    }

    /// Host code: a binary or link input for the CPU, with device code or
    /// without.
    pub fn is_host_code(&self) -> bool {
        matches!(
            self,
            Class::Fat
                | Class::Offloaded
                | Class::HostOnly
                | Class::DebugOnly
                | Class::Relocatable { .. }
                | Class::StaticArchive
                | Class::Inconsistent(_)
        )
    }
}

/// Could a file that starts with `head` (its first 8 bytes or fewer) be a
/// host binary or a link input? A cheap test before mapping the file.
pub fn could_be_binary(head: &[u8]) -> bool {
    head.starts_with(&object::elf::ELFMAG) || head.starts_with(STATIC_ARCHIVE_MAGIC)
}

/// What `bytes` (a whole file) is.
pub fn classify(bytes: &[u8]) -> Class {
    if bytes.starts_with(crate::archive::MAGIC) {
        return Class::Archive;
    }
    if bytes.starts_with(STATIC_ARCHIVE_MAGIC) {
        return Class::StaticArchive;
    }
    if bytes.starts_with(crate::bundle::BUNDLE_MAGIC)
        || bytes.starts_with(crate::bundle::CCOB_MAGIC)
    {
        return Class::Bundle;
    }
    match HostBinary::parse(bytes) {
        Ok(b) => b.class(),
        Err(_) => Class::Other,
    }
}

/// A parsed host binary and its device-code parts.
pub struct HostBinary<'a> {
    elf: ElfView<'a>,
}

impl<'a> HostBinary<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ElfError> {
        Ok(HostBinary {
            elf: ElfView::parse(bytes)?,
        })
    }

    /// The ELF view (the only container so far).
    pub fn elf(&self) -> &ElfView<'a> {
        &self.elf
    }

    pub fn elf_type(&self) -> ElfType {
        self.elf.elf_type()
    }

    /// The section holding the bundles (`.hip_fatbin`), NOBITS or not.
    pub fn fatbin(&self) -> Result<Option<Section<'a>>, ElfError> {
        self.elf.section(FATBIN_SECTION)
    }

    /// The section holding the HIPK metadata (`.rocm_kpack_ref`).
    pub fn metadata(&self) -> Result<Option<Section<'a>>, ElfError> {
        self.elf.section(METADATA_SECTION)
    }

    /// The wrapper table; empty when the section is missing or has no bytes
    /// in the file (NOBITS).
    pub fn wrappers(&self) -> Result<WrapperTable, ElfError> {
        let Some(sec) = self.elf.section(WRAPPER_SECTION)? else {
            return Ok(WrapperTable::default());
        };
        if sec.is_nobits() {
            return Ok(WrapperTable::default());
        }
        if sec.data.len() % WRAPPER_SIZE != 0 {
            return Err(ElfError::BadSection {
                name: WRAPPER_SECTION.into(),
                problem: format!(
                    "size {} is not a multiple of {WRAPPER_SIZE}",
                    sec.data.len()
                ),
            });
        }
        let relocs = Relocations::read(&self.elf)?;
        let slots = (0..sec.data.len() / WRAPPER_SIZE)
            .map(|index| self.slot(&sec, &relocs, index))
            .collect();
        Ok(WrapperTable { slots, relocs })
    }

    fn slot(&self, sec: &Section, relocs: &Relocations, index: usize) -> WrapperSlot {
        let at = (index * WRAPPER_SIZE) as u64;
        let raw = bytes::array_at(sec.data, at).expect("inside the section");
        let (offset, addr) = (sec.offset + at, sec.addr + at);
        WrapperSlot {
            index,
            offset,
            addr,
            wrapper: Wrapper::parse(&raw),
            pointer: self.elf.pointer_at(relocs, addr + 8, offset + 8),
        }
    }

    /// See [`classify`].
    pub fn class(&self) -> Class {
        if self.elf.machine() == object::elf::EM_AMDGPU {
            return Class::CodeObject;
        }
        if self.elf.elf_type() == ElfType::Relocatable {
            return Class::Relocatable {
                device_code: self.elf.section_index(FATBIN_SECTION).is_some(),
            };
        }
        let fatbin = match self.fatbin() {
            Ok(f) => f,
            Err(e) => return Class::Inconsistent(e.to_string()),
        };
        let fat = fatbin.as_ref().is_some_and(|s| !s.is_nobits());
        let wrappers = match self.wrappers() {
            Ok(w) => w,
            // Offloading it reports what is wrong with the wrappers.
            Err(_) if fat => return Class::Fat,
            Err(e) => return Class::Inconsistent(e.to_string()),
        };
        // A debug-info file keeps the section headers, NOBITS.
        let has_metadata = matches!(self.metadata(), Ok(Some(m)) if !m.is_nobits());
        match fatbin {
            Some(_) if fat => Class::Fat,
            Some(_) if wrappers.all_hipk() => Class::Offloaded,
            Some(_) if wrappers.is_empty() && has_metadata => Class::Offloaded,
            Some(_) if wrappers.is_empty() => Class::DebugOnly,
            Some(_) => Class::Inconsistent(format!(
                "{FATBIN_SECTION} is already NOBITS but the wrappers are not all HIPK"
            )),
            None if wrappers.all_hipk() && has_metadata => Class::Offloaded,
            None => Class::HostOnly,
        }
    }
}

/// One `__CudaFatBinaryWrapper` of the wrapper table.
#[derive(Debug, Clone)]
pub struct WrapperSlot {
    pub index: usize,
    /// File offset of the wrapper.
    pub offset: u64,
    /// Virtual address of the wrapper.
    pub addr: u64,
    /// The wrapper as stored in the file.
    pub wrapper: Wrapper,
    /// Its `binary` pointer at load time (relative to the load base), or
    /// why it cannot be resolved.
    pub pointer: Result<Pointer, ElfError>,
}

impl WrapperSlot {
    /// The wrapper with `binary` set to its load-time value where it
    /// resolves (what the HIP runtime is handed).
    pub fn loaded(&self) -> Wrapper {
        let mut w = self.wrapper;
        if let Ok(p) = &self.pointer {
            w.binary = p.value;
        }
        w
    }
}

/// The wrapper table of a host binary, and the relocations its pointers
/// were resolved through.
#[derive(Debug, Clone, Default)]
pub struct WrapperTable {
    pub slots: Vec<WrapperSlot>,
    pub relocs: Relocations,
}

impl WrapperTable {
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// At least one wrapper, and every one HIPK.
    pub fn all_hipk(&self) -> bool {
        !self.slots.is_empty() && self.slots.iter().all(|s| s.wrapper.magic == HIPK_MAGIC)
    }

    /// The wrappers with their load-time pointers (see
    /// [`WrapperSlot::loaded`]).
    pub fn loaded(&self) -> Vec<Wrapper> {
        self.slots.iter().map(WrapperSlot::loaded).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_by_magic() {
        assert_eq!(classify(b"KPAK\x01\0\0\0"), Class::Archive);
        assert_eq!(classify(b"!<arch>\nxx"), Class::StaticArchive);
        assert_eq!(classify(b"__CLANG_OFFLOAD_BUNDLE__"), Class::Bundle);
        assert_eq!(classify(b"CCOB\x02\0"), Class::Bundle);
        assert_eq!(classify(b"\x7fELF\x02\x01\x01"), Class::Other);
        assert_eq!(classify(b""), Class::Other);
        assert!(Class::StaticArchive.is_link_input());
        assert!(!Class::Fat.is_link_input());
    }

    #[test]
    fn own_executable_is_host_only() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(classify(&exe), Class::HostOnly);
        let b = HostBinary::parse(&exe).unwrap();
        assert!(b.wrappers().unwrap().is_empty());
        assert!(b.fatbin().unwrap().is_none());
    }
}
