//! The ELF offload transform (formats.md §4.3): turn a fat binary into a host-only
//! one whose wrappers point (magic HIPK) at HIPK metadata.
//!
//! Layout. `.hip_fatbin` is page-aligned and lies in a read-only `PT_LOAD`
//! (X). Its first page(s) stay in the file and receive the HIPK metadata
//! (`.rocm_kpack_ref`); the section's remaining whole pages leave the file.
//! X becomes X1 (up to the end of the kept pages in the file, zero-filled
//! in memory up to the end of the removed pages) and X2 (the rest of X,
//! from the first page after the removed ones), so the program header table
//! needs one more entry. It stays where it is (right after the ELF header,
//! where binutils and libelf expect it, and where Linux kernels before 5.18
//! compute `AT_PHDR`) and grows in place; the sections it grows over
//! (notes, dynamic symbol and hash tables, version tables, dynamic
//! relocations, `.interp`) move, as one block, into the kept page(s) after
//! the metadata, with the dynamic entries, `PT_NOTE`/`PT_INTERP` and symbols
//! that refer to them. Every other address is unchanged; file offsets after
//! the cut move down by the removed size, a whole number of `p_align`
//! units, so every segment stays congruent.
//!
//! When the section has no whole page to spare beyond what the metadata
//! (and a moved block) need, nothing is cut: the program header table stays
//! as it is, the metadata is written over the start of the section, and the
//! rest of the section is zeroed. Either way `.hip_fatbin` becomes
//! `SHT_NOBITS` over what remains, no bundle byte stays in the file, and the
//! new `.rocm_kpack_ref` section header is appended at the end of the
//! section table (so no section index changes), its name added to a new copy
//! of `.shstrtab` written at the end of the file.
//!
//! The steps: [`analyze`] reads and checks the input, [`plan::plan`]
//! decides what moves where, [`write::output`] produces the bytes;
//! [`verify::verify_elf`] checks a result ([`verify::verify_fat`], one of
//! prune or restore).

mod analyze;
mod plan;
pub mod verify;
mod write;

pub use plan::align_up;

#[cfg(test)]
mod tests;

use crate::elf::{ElfError, ElfView, FATBIN_SECTION};
use crate::offload::rewritten::Transformed;
use crate::offload::section::{Container, SectionError};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error(transparent)]
    Section(#[from] SectionError),
    #[error("{FATBIN_SECTION} holds no bundle: no device code to move")]
    NoBundles,
    #[error("{FATBIN_SECTION} is already NOBITS but the wrappers are not all HIPK")]
    HalfOffloaded,
    #[error("unsupported machine {} (kpack rewrites x86-64, AArch64 and ppc64le binaries)", crate::elf::machine_name(*.0))]
    UnsupportedMachine(u16),
    #[error("unsupported ELF type {0} (kpack rewrites executables and shared objects)")]
    UnsupportedType(u16),
    #[error("relocation at {0:#x} applies to the ELF header or the program header table, which the transform rewrites")]
    RelocationIntoHeaders(u64),
    #[error("{FATBIN_SECTION} is not inside the file-backed part of a PT_LOAD segment")]
    FatbinNotLoaded,
    #[error("{FATBIN_SECTION} lies in a writable PT_LOAD segment {why}: the read-only segment the HIPK metadata needs cannot be split off")]
    FatbinWritable { why: &'static str },
    #[error("segment {index} (type {p_type:#x}) spans the removed range of {FATBIN_SECTION}")]
    SegmentSpansRemoved { index: usize, p_type: u32 },
    #[error("section {name} lies inside the removed range of {FATBIN_SECTION}")]
    SectionInRemoved { name: String },
    #[error("{FATBIN_SECTION} ({size} bytes) is too small for the {need} bytes of metadata")]
    NoRoom { size: u64, need: u64 },
    #[error("cannot make room for one more program header: {why}")]
    CannotGrowPhdrs { why: String },
    #[error("the bundles need {need} bytes, but the range {FATBIN_SECTION} had holds {have} (from {start:#x} to the next section at {end:#x})")]
    RangeTooSmall {
        need: u64,
        have: u64,
        start: u64,
        end: u64,
    },
    #[error("cannot restore: {0}")]
    NotRestorable(String),
}

crate::offload::section::from_section_errors!(TransformError, Container::Elf);

/// What the transform does with the section's range: the payload kept at
/// its start, the form the section takes and where the wrappers point.
#[derive(Debug, Clone)]
pub enum Request<'a> {
    /// Offload: the encoded HIPK metadata is kept; `.hip_fatbin` becomes
    /// NOBITS after it, `.rocm_kpack_ref` is added, and every wrapper
    /// becomes HIPK, pointing at the metadata, `reserved1` = its bundle.
    Offload { metadata: &'a [u8] },
    /// Prune: `bundles` (the pruned bundles, laid out) are kept;
    /// `.hip_fatbin` stays PROGBITS over them, the wrappers stay HIPF and
    /// point at their bundles' new places. `starts` maps each old bundle's
    /// offset in the section to its new offset in `bundles`.
    Prune {
        bundles: &'a [u8],
        starts: Vec<(u64, u64)>,
    },
    /// Restore (of an offloaded binary): `bundles` go back into the range
    /// the device code had, the removed pages go back into the file,
    /// `.hip_fatbin` is PROGBITS again and `.rocm_kpack_ref` is dropped;
    /// each wrapper becomes HIPF, pointing at the offset `starts` gives for
    /// its code object index. The bundles start at a multiple of `align`
    /// (4 KiB for uncompressed bundles, whose code objects clang aligns so).
    Restore {
        bundles: Payload<'a>,
        starts: Vec<(u32, u64)>,
        align: u64,
    },
}

/// The bytes a request keeps at the start of the range.
#[derive(Debug, Clone)]
pub enum Payload<'a> {
    Bytes(&'a [u8]),
    /// The first `len` bytes of a file (restore's bundles, spilled as they
    /// were built), read when the output is written.
    File(std::sync::Arc<std::fs::File>, u64),
}

impl Payload<'_> {
    pub fn len(&self) -> u64 {
        match self {
            Payload::Bytes(b) => b.len() as u64,
            Payload::File(_, len) => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Request<'_> {
    /// The bytes kept at the start of the range.
    pub fn payload(&self) -> Payload<'_> {
        match self {
            Request::Offload { metadata } => Payload::Bytes(metadata),
            Request::Prune { bundles, .. } => Payload::Bytes(bundles),
            Request::Restore { bundles, .. } => bundles.clone(),
        }
    }
}

/// Transform a fat binary. `metadata` is the encoded HIPK metadata.
pub fn transform<'a>(b: &'a [u8], metadata: &[u8]) -> Result<Transformed<'a>, TransformError> {
    rewrite(ElfView::parse(b)?, &Request::Offload { metadata })
}

/// The address range that restore may fill with bundles in an offloaded
/// binary (what [`Request::Restore`]'s payload must fit, after aligning
/// its start).
pub(crate) fn restore_room(elf: ElfView) -> Result<std::ops::Range<u64>, TransformError> {
    let (_, hole) = analyze::analyze_offloaded(elf)?;
    Ok(hole.start..hole.end)
}

/// Rewrite a fat binary (offload, prune) or an offloaded one (restore) as
/// `request` says: analyze, plan, write.
pub fn rewrite<'a>(elf: ElfView<'a>, request: &Request) -> Result<Transformed<'a>, TransformError> {
    let (input, plan) = match request {
        Request::Restore { .. } => {
            let (input, hole) = analyze::analyze_offloaded(elf)?;
            let plan = plan::plan_restore(&input, &hole, request)?;
            (input, plan)
        }
        _ => {
            let input = analyze::analyze(elf)?;
            let plan = plan::plan(&input, request)?;
            (input, plan)
        }
    };
    let image = write::output(&input, &plan, &request.payload())?;
    Ok(Transformed {
        image,
        checksum_at: None,
        wrappers: input.wrappers.changes.clone(),
        metadata_addr: plan.payload_addr,
        payload_off: plan.payload_off,
        bundles: input.bundles,
        removed: plan.cut.removed,
        inserted: plan.cut.inserted,
        moved_phdrs: false,
    })
}
