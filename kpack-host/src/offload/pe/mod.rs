//! The PE/COFF offload transform (formats.md §4.4): turn a fat DLL or executable
//! into a host-only one whose wrappers point (magic HIPK) at HIPK metadata
//! in a new section `.kpackrf`.
//!
//! Layout. `.hip_fat` keeps its header, its RVA and its `VirtualSize`, so
//! every address in the image stays where it was; its whole pages
//! (`max(4 KiB, FileAlignment)` units) leave the file (`SizeOfRawData`
//! shrinks, and the loader zero-fills the rest of the section), and what
//! remains of its raw data is zeroed: no bundle byte stays in the file.
//! The raw data of the sections after it moves down by the removed size (a
//! whole number of FileAlignment units, so every `PointerToRawData` stays
//! aligned). `.kpackrf` (initialized, read-only data) is appended after the
//! last section, at the next FileAlignment offset and SectionAlignment RVA,
//! its header after the last one in the section table (which must fit
//! below `SizeOfHeaders`). Whatever followed the last section in the file
//! (overlay, certificate table, COFF symbol and string table) moves behind
//! `.kpackrf`, keeping its alignment, and the fields that hold file
//! offsets follow: `PointerToRawData` of sections and debug directory
//! entries, `PointerToSymbolTable`, the certificate table directory.
//! `NumberOfSections`, `SizeOfImage`, `SizeOfInitializedData` and a
//! non-zero `CheckSum` are updated.
//!
//! Each wrapper in `.hipFatB` becomes HIPK: its `binary` is the absolute
//! address of `.kpackrf` at the preferred image base (the DIR64 base
//! relocation already on that slot rebases it at load time), its
//! `reserved1` the index of the bundle its pointer named.
//!
//! The steps: [`analyze`] reads and checks the input, [`plan::plan`]
//! decides where everything goes, [`write::output`] produces the bytes;
//! [`verify::verify_pe`] checks a result.

mod analyze;
mod plan;
pub mod verify;
mod write;

#[cfg(test)]
mod tests;

use crate::offload::rewritten::Transformed;
use crate::offload::section::{Container, SectionError};
use crate::pe::{PeError, PeView, FATBIN_SECTION, METADATA_SECTION};

pub use verify::verify_pe;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeTransformError {
    #[error(transparent)]
    Pe(#[from] PeError),
    #[error(transparent)]
    Section(#[from] SectionError),
    #[error("{FATBIN_SECTION} has no bytes in the file")]
    FatbinEmpty,
    #[error("a {METADATA_SECTION} section exists already")]
    HasMetadata,
    #[error("no room for one more section header below SizeOfHeaders ({why})")]
    NoRoomForHeader { why: String },
    #[error("unsupported layout: {0}")]
    Layout(String),
}

crate::offload::section::from_section_errors!(PeTransformError, Container::Pe);

/// Transform a fat PE image. `metadata` is the encoded HIPK metadata.
pub fn transform<'a>(b: &'a [u8], metadata: &[u8]) -> Result<Transformed<'a>, PeTransformError> {
    rewrite(PeView::parse(b)?, metadata)
}

/// Rewrite a fat PE image, parsed, with the encoded HIPK `metadata`:
/// analyze, plan, write.
pub fn rewrite<'a>(pe: PeView<'a>, metadata: &[u8]) -> Result<Transformed<'a>, PeTransformError> {
    let input = analyze::analyze(pe)?;
    let plan = plan::plan(&input, metadata.len() as u64)?;
    let image = write::output(&input, &plan, metadata)?;
    Ok(Transformed {
        image,
        checksum_at: write::checksum_field(&input),
        wrappers: input.changes.clone(),
        metadata_addr: plan.meta_rva,
        payload_off: plan.meta_off,
        bundles: input.bundles,
        removed: plan.removed,
        inserted: 0,
        moved_phdrs: false,
    })
}
