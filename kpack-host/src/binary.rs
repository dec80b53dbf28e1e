//! What a file is, and the device-code parts of a host binary.
//!
//! [`classify`] is the one place that decides what kind of file kpack is
//! looking at (fat binary, offloaded binary, host-only binary, debug-only
//! file, link input, bundle, archive, anything else); offload, split,
//! pack-tree, recombine, verify, `ls` and `extract` all ask it.
//! [`HostBinary::wrappers`] is the one reader of the wrapper table, with
//! each wrapper's pointer resolved to its load-time value.
//!
//! A host binary is ELF ([`crate::elf`]) or PE/COFF ([`crate::pe`]); the
//! interface is what every caller needs whatever the container: the
//! device-code sections by role ([`Role`]: `.hip_fatbin`/`.hip_fat`,
//! `.hipFatBinSegment`/`.hipFatB`, `.rocm_kpack_ref`/`.kpackrf`) and the
//! wrappers with resolved pointers. Addresses are relative to the load
//! base (ELF virtual addresses, PE RVAs).

use crate::bytes;
use crate::elf::{
    ElfError, ElfType, ElfView, Pointer, RelocAt, Relocations, FATBIN_SECTION, METADATA_SECTION,
    WRAPPER_SECTION,
};
use crate::hipk::{record_offsets, Wrapper, HIPK_MAGIC, WRAPPER_SIZE};
use crate::pe::{self, BaseReloc, PeError, PeKind, PeView};

/// The magic of a static archive (`ar`).
pub(crate) const STATIC_ARCHIVE_MAGIC: &[u8] = b"!<arch>\n";

/// What a file is (see [`classify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    /// A host binary (executable or shared object) that carries its device
    /// code: a `.hip_fatbin` section with bytes in the file.
    Fat,
    /// A host binary whose device code was offloaded: HIPK metadata
    /// present, every wrapper HIPK, `.hip_fatbin` NOBITS or gone (or, as
    /// the reference tools leave a small one, still with its bytes).
    Offloaded,
    /// A host binary without device code: no `.hip_fatbin`, or one that
    /// holds none (empty, only zeros, or NOBITS in a binary that is not
    /// offloaded: [`HostBinary::empty_fatbin`]). [`no_device_code`] says
    /// which.
    HostOnly,
    /// A debug-info file (`objcopy --only-keep-debug`, TheRock's `*_dbg`
    /// artifacts), of a fat or an offloaded binary: `.hip_fatbin`, the
    /// wrapper table and any metadata section are NOBITS headers without
    /// bytes. Nothing to offload.
    DebugOnly,
    /// A relocatable object (`ET_REL`): a link input, not a run-time
    /// binary.
    Relocatable {
        /// Whether it carries a `.hip_fatbin` or a `.llvm.offloading`
        /// section (clang's new offload driver).
        device_code: bool,
    },
    /// A static archive: a link input.
    StaticArchive,
    /// A host binary whose device-code parts contradict each other (e.g.
    /// `.hip_fatbin` NOBITS but HIPF wrappers): offloading or verifying it
    /// reports this problem.
    Inconsistent(Inconsistency),
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

/// How a host binary's device-code parts contradict each other
/// ([`Class::Inconsistent`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Inconsistency {
    /// A device-code section or the wrapper table cannot be read.
    #[error(transparent)]
    Unreadable(#[from] BinaryError),
    /// ELF: `.hip_fatbin` NOBITS, but not every wrapper HIPK.
    #[error("{FATBIN_SECTION} is already NOBITS but the wrappers are not all HIPK")]
    HalfOffloaded,
    /// PE: `.kpackrf` present, but not every wrapper HIPK.
    #[error(
        "{} is present but the wrappers are not all HIPK",
        pe::METADATA_SECTION
    )]
    MetadataWithHipf,
}

/// Could a file that starts with `head` (its first 8 bytes or fewer) be a
/// host binary or a link input? A cheap test before mapping the file.
pub fn could_be_binary(head: &[u8]) -> bool {
    head.starts_with(&object::elf::ELFMAG)
        || pe::is_pe(head)
        || head.starts_with(STATIC_ARCHIVE_MAGIC)
}

/// What `bytes` (a whole file) is.
pub fn classify(bytes: &[u8]) -> Class {
    classify_parsed(bytes).class
}

/// What `bytes` (a whole file) is, with the host binary parsed on the way:
/// what callers that go on to read the binary take, so that it is parsed
/// once.
pub fn classify_parsed(bytes: &[u8]) -> Classified<'_> {
    let binary = HostBinary::parse(bytes);
    let class = if bytes.starts_with(crate::archive::MAGIC) {
        Class::Archive
    } else if bytes.starts_with(STATIC_ARCHIVE_MAGIC) {
        Class::StaticArchive
    } else if bytes.starts_with(crate::bundle::BUNDLE_MAGIC)
        || bytes.starts_with(crate::bundle::CCOB_MAGIC)
    {
        Class::Bundle
    } else {
        binary.as_ref().map_or(Class::Other, HostBinary::class)
    };
    Classified {
        bytes,
        class,
        binary,
    }
}

/// A file's bytes classified ([`classify_parsed`]).
#[derive(Clone)]
pub struct Classified<'a> {
    pub bytes: &'a [u8],
    pub class: Class,
    /// The host binary, or why the bytes are not one (for an archive or a
    /// bundle: not an ELF file).
    pub binary: Result<HostBinary<'a>, BinaryError>,
}

/// What kpack says about a file it leaves as it is although it looks like
/// device code could be in it: a debug-info file, an offloaded binary, a
/// relocatable object with device code, a binary whose `.hip_fatbin` holds
/// none ([`HostBinary::empty_fatbin`]). The same words from offload,
/// split, pack-tree and split-wheels, each adding what it does with the
/// file. `None` for anything else (a fat binary, a host-only binary without
/// a `.hip_fatbin`, a static archive, a file that is no binary).
pub fn as_is_note(file: &Classified) -> Option<String> {
    Some(match &file.class {
        Class::DebugOnly => {
            "a debug-info file (NOBITS .hip_fatbin, no metadata): no device code".to_string()
        }
        Class::Offloaded => "already offloaded".to_string(),
        Class::Relocatable { device_code: true } => {
            "a link input (relocatable object) with device code".to_string()
        }
        Class::HostOnly => {
            let why = file.binary.as_ref().ok()?.empty_fatbin()?;
            format!("no device code ({why})")
        }
        _ => return None,
    })
}

/// Why the host binary `bytes` carries no device code, when it is one
/// that carries none ([`Class::HostOnly`]): `no .hip_fatbin section`, or
/// what is wrong with the one it has. Offload, split and split-wheels copy
/// such a binary unchanged with this as a note (docs/offload.md).
///
/// `None` also for a binary with a wrapper table but no `.hip_fatbin` at
/// all: its wrappers point at device code that is not there, which is
/// damage, not a host-only build.
pub fn no_device_code(bin: &HostBinary) -> Option<String> {
    if bin.class() != Class::HostOnly {
        return None;
    }
    if let Some(why) = bin.empty_fatbin() {
        return Some(why);
    }
    let has_wrappers = bin.wrappers().map_or(true, |t| !t.is_empty());
    (!has_wrappers).then(|| format!("no {} section", bin.section_name(Role::Fatbin)))
}

/// Why a host binary cannot be read: the container's own error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BinaryError {
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error(transparent)]
    Pe(#[from] PeError),
}

/// An address as its container names it: an ELF virtual address, a PE RVA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Address {
    Virtual(u64),
    Rva(u64),
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Virtual(a) => write!(f, "{a:#x}"),
            Address::Rva(a) => write!(f, "RVA {a:#x}"),
        }
    }
}

/// The device-code sections of a host binary, by what they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The offload bundles.
    Fatbin,
    /// The `__CudaFatBinaryWrapper` array.
    Wrappers,
    /// The HIPK metadata of an offloaded binary.
    Metadata,
}

/// What kind of host binary, per container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryKind {
    Elf(ElfType),
    Pe(PeKind),
}

impl BinaryKind {
    /// Lower-case name (`shared`, `executable`, `dll`, `exe`...).
    pub fn name(self) -> String {
        match self {
            BinaryKind::Elf(t) => format!("{t:?}").to_lowercase(),
            BinaryKind::Pe(k) => format!("{k:?}").to_lowercase(),
        }
    }
}

/// A device-code section, whatever the container.
#[derive(Debug, Clone)]
pub struct DeviceSection<'a> {
    pub name: String,
    /// Address relative to the load base (ELF `sh_addr`, PE RVA).
    pub addr: u64,
    /// File offset of its bytes.
    pub offset: u64,
    /// Size in memory.
    pub size: u64,
    /// Its bytes in the file (empty when it has none).
    pub data: &'a [u8],
    /// Whether it has bytes in the file (not ELF NOBITS, not a PE section
    /// without raw data).
    pub in_file: bool,
}

impl DeviceSection<'_> {
    /// No bytes in the file.
    pub(crate) fn is_nobits(&self) -> bool {
        !self.in_file
    }
}

/// A parsed host binary and its device-code parts.
#[derive(Clone, Copy)]
pub enum HostBinary<'a> {
    Elf(ElfView<'a>),
    Pe(PeView<'a>),
}

impl<'a> HostBinary<'a> {
    /// ELF or PE by the first bytes; anything else is "not an ELF file".
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BinaryError> {
        if pe::is_pe(bytes) {
            return Ok(HostBinary::Pe(PeView::parse(bytes)?));
        }
        Ok(HostBinary::Elf(ElfView::parse(bytes)?))
    }

    /// The ELF view, for an ELF file.
    pub fn elf(&self) -> Option<&ElfView<'a>> {
        match self {
            HostBinary::Elf(e) => Some(e),
            HostBinary::Pe(_) => None,
        }
    }

    /// The PE view, for a PE file.
    pub fn pe(&self) -> Option<&PeView<'a>> {
        match self {
            HostBinary::Pe(p) => Some(p),
            HostBinary::Elf(_) => None,
        }
    }

    pub fn kind(&self) -> BinaryKind {
        match self {
            HostBinary::Elf(e) => BinaryKind::Elf(e.elf_type()),
            HostBinary::Pe(p) => BinaryKind::Pe(p.kind()),
        }
    }

    /// The name of the section that plays `role` in this container.
    pub fn section_name(&self, role: Role) -> &'static str {
        match (self, role) {
            (HostBinary::Elf(_), Role::Fatbin) => FATBIN_SECTION,
            (HostBinary::Elf(_), Role::Wrappers) => WRAPPER_SECTION,
            (HostBinary::Elf(_), Role::Metadata) => METADATA_SECTION,
            (HostBinary::Pe(_), Role::Fatbin) => pe::FATBIN_SECTION,
            (HostBinary::Pe(_), Role::Wrappers) => pe::WRAPPER_SECTION,
            (HostBinary::Pe(_), Role::Metadata) => pe::METADATA_SECTION,
        }
    }

    /// Check that every section's name reads and its bytes lie inside the
    /// file.
    pub(crate) fn check_sections(&self) -> Result<(), BinaryError> {
        match self {
            HostBinary::Elf(e) => Ok(e.check_sections()?),
            HostBinary::Pe(p) => Ok(p.check_sections()?),
        }
    }

    /// The section playing `role`, if there is one.
    pub fn section(&self, role: Role) -> Result<Option<DeviceSection<'a>>, BinaryError> {
        let name = self.section_name(role);
        Ok(match self {
            HostBinary::Elf(e) => e.section(name)?.map(|s| DeviceSection {
                in_file: !s.is_nobits(),
                name: s.name,
                addr: s.addr,
                offset: s.offset,
                size: s.size,
                data: s.data,
            }),
            HostBinary::Pe(p) => p.section(name)?.map(|s| DeviceSection {
                in_file: s.raw_size > 0,
                size: s.mem_size(),
                name: s.name,
                addr: s.rva,
                offset: s.raw_offset,
                data: s.data,
            }),
        })
    }

    fn has_section(&self, role: Role) -> bool {
        let name = self.section_name(role);
        match self {
            HostBinary::Elf(e) => e.section_index(name).is_some(),
            HostBinary::Pe(p) => p.section_index(name).is_some(),
        }
    }

    /// The section holding the bundles (`.hip_fatbin`, `.hip_fat`), with
    /// bytes or not.
    pub fn fatbin(&self) -> Result<Option<DeviceSection<'a>>, BinaryError> {
        self.section(Role::Fatbin)
    }

    /// The section holding the HIPK metadata (`.rocm_kpack_ref`,
    /// `.kpackrf`).
    pub fn metadata(&self) -> Result<Option<DeviceSection<'a>>, BinaryError> {
        self.section(Role::Metadata)
    }

    /// The wrapper table; empty when the section is missing or has no bytes
    /// in the file.
    ///
    /// The records are found by layout ([`record_offsets`]: a table may be
    /// padded, as AddressSanitizer builds pad each record to 64 bytes, or
    /// mix padded and plain records), and the table must be consistent:
    /// every relocation that applies inside it (ELF dynamic or packed
    /// relocations, PE base relocations) applies to a record's pointer, so
    /// that a record zeroed in the file but still relocated is damage, not
    /// padding.
    pub fn wrappers(&self) -> Result<WrapperTable, BinaryError> {
        let Some(sec) = self.section(Role::Wrappers)? else {
            return Ok(WrapperTable::default());
        };
        if sec.is_nobits() {
            return Ok(WrapperTable::default());
        }
        let bad = |problem: String| -> BinaryError {
            let name = sec.name.clone();
            match self {
                HostBinary::Elf(_) => ElfError::BadSection { name, problem }.into(),
                HostBinary::Pe(_) => PeError::BadSection { name, problem }.into(),
            }
        };
        let Some(bytes) = usize::try_from(sec.size)
            .ok()
            .and_then(|n| sec.data.get(..n))
        else {
            return Err(bad(format!(
                "only {} of its {} bytes are in the file",
                sec.data.len(),
                sec.size
            )));
        };
        if sec.addr.checked_add(sec.size).is_none() {
            return Err(bad(format!(
                "its addresses ({:#x}, {} bytes) run past 2^64",
                sec.addr, sec.size
            )));
        }
        let offsets = record_offsets(bytes).map_err(|e| bad(e.to_string()))?;
        let mut table = match self {
            HostBinary::Elf(e) => WrapperTable {
                relocs: Relocations::read(e)?,
                ..WrapperTable::default()
            },
            HostBinary::Pe(p) => WrapperTable {
                base_relocs: p.base_relocations()?,
                ..WrapperTable::default()
            },
        };
        // ELF: the relocation of every record's pointer, in one pass.
        let found = match self {
            HostBinary::Elf(e) => {
                let addrs: Vec<u64> = offsets.iter().map(|&at| sec.addr + at as u64 + 8).collect();
                table.relocs.find(e, &addrs)
            }
            HostBinary::Pe(_) => vec![RelocAt::None; offsets.len()],
        };
        table.slots = offsets
            .iter()
            .zip(found)
            .enumerate()
            .map(|(index, (&at, reloc))| self.slot(&sec, &table, index, at as u64, reloc))
            .collect();
        table.padding = sec.size - (offsets.len() * WRAPPER_SIZE) as u64;
        if let Some(at) = table.stray_relocation(self, sec.addr, sec.size) {
            return Err(bad(format!(
                "a relocation applies at +{:#x}, between wrapper records (a record zeroed in the file?)",
                at - sec.addr
            )));
        }
        Ok(table)
    }

    fn slot(
        &self,
        sec: &DeviceSection,
        table: &WrapperTable,
        index: usize,
        at: u64,
        reloc: RelocAt,
    ) -> WrapperSlot {
        let raw = bytes::array_at(sec.data, at).expect("inside the section");
        let (offset, addr) = (sec.offset + at, sec.addr + at);
        let pointer = match self {
            HostBinary::Elf(e) => e
                .pointer_with(reloc, addr + 8, offset + 8)
                .map_err(Into::into),
            HostBinary::Pe(p) => p
                .pointer_at(&table.base_relocs, addr + 8)
                .map_err(Into::into),
        };
        WrapperSlot {
            index,
            offset,
            addr,
            wrapper: Wrapper::parse(&raw),
            pointer,
        }
    }

    /// What is wrong with a `.hip_fatbin` (`.hip_fat`) that holds no device
    /// code in a binary that is not offloaded (no HIPK metadata section):
    /// it is empty, it holds only zeros, or it has no bytes in the file
    /// while the wrapper table has (a debug-info file has neither; an
    /// offloaded binary has HIPK wrappers). `None` for any other binary.
    pub fn empty_fatbin(&self) -> Option<String> {
        let fatbin = self.fatbin().ok()??;
        if self.has_section(Role::Metadata) {
            return None;
        }
        let name = &fatbin.name;
        if fatbin.in_file {
            return if fatbin.size == 0 {
                Some(format!("an empty {name} section"))
            } else if fatbin.data.len() as u64 == fatbin.size && fatbin.data.iter().all(|&b| b == 0)
            {
                Some(format!("a {name} section of zeros only"))
            } else {
                None
            };
        }
        let wrappers = self.wrappers().ok()?;
        let debug_only = wrappers.is_empty() && self.elf().is_some();
        (!debug_only && !wrappers.all_hipk())
            .then(|| format!("a {name} section without bytes in the file"))
    }

    /// See [`classify`].
    pub fn class(&self) -> Class {
        match self {
            HostBinary::Elf(e) => self.elf_class(e),
            HostBinary::Pe(_) => self.pe_class(),
        }
    }

    fn elf_class(&self, elf: &ElfView) -> Class {
        if elf.machine() == object::elf::EM_AMDGPU {
            return Class::CodeObject;
        }
        if elf.elf_type() == ElfType::Relocatable {
            let offloading = kpack_format::offloading::SECTION;
            return Class::Relocatable {
                device_code: elf.section_index(FATBIN_SECTION).is_some()
                    || elf.section_index(offloading).is_some(),
            };
        }
        if self.empty_fatbin().is_some() {
            return Class::HostOnly;
        }
        let fatbin = match self.fatbin() {
            Ok(f) => f,
            Err(e) => return Class::Inconsistent(e.into()),
        };
        let fat = fatbin.as_ref().is_some_and(|s| !s.is_nobits());
        let wrappers = match self.wrappers() {
            Ok(w) => w,
            // Offloading it reports what is wrong with the wrappers.
            Err(_) if fat => return Class::Fat,
            Err(e) => return Class::Inconsistent(e.into()),
        };
        // A debug-info file keeps the section headers, NOBITS.
        let has_metadata = matches!(self.metadata(), Ok(Some(m)) if m.in_file);
        match fatbin {
            // The reference tools leave a `.hip_fatbin` with no whole page
            // in the file as it was (formats.md §4.3): HIPK wrappers and the
            // metadata make the binary offloaded all the same (the runtime
            // loads through the archives); the verifier warns about the
            // leftover bytes.
            Some(_) if fat && wrappers.all_hipk() && has_metadata => Class::Offloaded,
            Some(_) if fat => Class::Fat,
            Some(_) if wrappers.all_hipk() => Class::Offloaded,
            Some(_) if wrappers.is_empty() && has_metadata => Class::Offloaded,
            Some(_) if wrappers.is_empty() => Class::DebugOnly,
            Some(_) => Class::Inconsistent(Inconsistency::HalfOffloaded),
            None if wrappers.all_hipk() && has_metadata => Class::Offloaded,
            None => Class::HostOnly,
        }
    }

    /// A PE image is fat while it has `.hip_fat` and no `.kpackrf` (the
    /// offloaded `.hip_fat` keeps its address range, and may keep zeroed
    /// bytes in the file).
    fn pe_class(&self) -> Class {
        if self.empty_fatbin().is_some() {
            return Class::HostOnly;
        }
        let fatbin = match self.fatbin() {
            Ok(f) => f,
            Err(e) => return Class::Inconsistent(e.into()),
        };
        let has_metadata = self.has_section(Role::Metadata);
        let fat = fatbin.is_some() && !has_metadata;
        let wrappers = match self.wrappers() {
            Ok(w) => w,
            Err(_) if fat => return Class::Fat,
            Err(e) => return Class::Inconsistent(e.into()),
        };
        match (fat, has_metadata) {
            (true, _) => Class::Fat,
            (false, true) if wrappers.is_empty() || wrappers.all_hipk() => Class::Offloaded,
            (false, true) => Class::Inconsistent(Inconsistency::MetadataWithHipf),
            (false, false) => Class::HostOnly,
        }
    }
}

/// One `__CudaFatBinaryWrapper` of the wrapper table.
#[derive(Debug, Clone)]
pub struct WrapperSlot {
    /// Its place among the records (not its offset divided by 24: a table
    /// may be padded).
    pub index: usize,
    /// File offset of the wrapper.
    pub offset: u64,
    /// Address of the wrapper (ELF: virtual address; PE: RVA).
    pub addr: u64,
    /// The wrapper as stored in the file.
    pub wrapper: Wrapper,
    /// Its `binary` pointer at load time (relative to the load base), or
    /// why it cannot be resolved.
    pub pointer: Result<Pointer, BinaryError>,
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
    /// ELF: the dynamic relocations (empty for PE).
    pub relocs: Relocations,
    /// PE: the base relocations (empty for ELF).
    pub base_relocs: Vec<BaseReloc>,
    /// Bytes of the table that belong to no record: zero red zones and
    /// alignment gaps (0 for a plain array of records).
    pub padding: u64,
}

impl WrapperTable {
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// At least one wrapper, and every one HIPK.
    pub(crate) fn all_hipk(&self) -> bool {
        !self.slots.is_empty() && self.slots.iter().all(|s| s.wrapper.magic == HIPK_MAGIC)
    }

    /// The wrappers with their load-time pointers (see
    /// [`WrapperSlot::loaded`]).
    pub fn loaded(&self) -> Vec<Wrapper> {
        self.slots.iter().map(WrapperSlot::loaded).collect()
    }

    /// Whether the records are padded or spaced (not a plain array).
    pub fn is_padded(&self) -> bool {
        self.padding > 0
    }

    /// The address of a relocation that applies inside the table
    /// `[addr, addr + size)` but not to a record's pointer field, if any.
    fn stray_relocation(&self, bin: &HostBinary, addr: u64, size: u64) -> Option<u64> {
        let inside = |a: u64| a.wrapping_sub(addr) < size;
        let pointer_field = |a: u64| self.slots.iter().any(|s| s.addr + 8 == a);
        let stray = |a: &u64| inside(*a) && !pointer_field(*a);
        match bin {
            HostBinary::Elf(e) => self.relocs.addresses(e).find(stray),
            // PE: IMAGE_REL_BASED_ABSOLUTE (0) entries only pad a block.
            HostBinary::Pe(_) => self
                .base_relocs
                .iter()
                .filter(|r| r.typ != 0)
                .map(|r| r.rva)
                .find(stray),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // By hand: bare magics and a cut PE header, not images object::write makes.
    #[test]
    fn classifies_by_magic() {
        assert_eq!(classify(b"KPAK\x01\0\0\0"), Class::Archive);
        // Why an archive is not a host binary, for callers that say so.
        assert!(matches!(
            classify_parsed(b"KPAK\x01\0\0\0").binary,
            Err(BinaryError::Elf(ElfError::NotElf))
        ));
        assert_eq!(classify(b"!<arch>\nxx"), Class::StaticArchive);
        assert_eq!(classify(b"__CLANG_OFFLOAD_BUNDLE__"), Class::Bundle);
        assert_eq!(classify(b"CCOB\x02\0"), Class::Bundle);
        assert_eq!(classify(b"\x7fELF\x02\x01\x01"), Class::Other);
        assert_eq!(classify(b""), Class::Other);
        assert!(Class::StaticArchive.is_link_input());
        // PE: "MZ" may be a host binary; one that does not parse is Other.
        assert!(could_be_binary(b"MZ\x90\0"));
        assert_eq!(classify(b"MZ\x90\0"), Class::Other);
        assert!(matches!(
            HostBinary::parse(b"MZ\x90\0"),
            Err(BinaryError::Pe(PeError::Malformed(_)))
        ));
        assert!(!Class::Fat.is_link_input());
    }

    #[test]
    fn own_executable_is_host_only() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(classify(&exe), Class::HostOnly);
        let file = classify_parsed(&exe);
        assert_eq!(file.class, Class::HostOnly);
        let b = file.binary.unwrap();
        assert!(b.wrappers().unwrap().is_empty());
        assert!(b.fatbin().unwrap().is_none());
    }
}
