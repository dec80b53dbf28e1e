//! Step 1 of the PE transform: read the input and check everything the
//! plan relies on, before anything is planned or written.

use super::PeTransformError as E;
use crate::binary::{Address, HostBinary, WrapperTable};
use crate::bundle::list_fatbin;
use crate::elf::PointerKind;
use crate::offload::rewritten::WrapperChange;
use crate::offload::section::{Container, Reloc, SectionError};
use crate::offload::wrappers::{bundle_index, check_hipf, resolved, BundleRange, WrapperError};
use crate::pe::{
    BaseReloc, PeSection, PeView, DEBUG_ENTRY_SIZE, FATBIN_SECTION, IMAGE_DIRECTORY_ENTRY_DEBUG,
    IMAGE_REL_BASED_DIR64, METADATA_SECTION, SECTION_HEADER_SIZE,
};

/// What the transform needs to know about its input.
pub struct Input<'a> {
    pub pe: PeView<'a>,
    pub sections: Vec<PeSection<'a>>,
    /// Index of `.hip_fat` in `sections`.
    pub fatbin: usize,
    /// Number of bundles in it.
    pub bundles: usize,
    /// File offset of each wrapper, and what changes in it.
    pub wrapper_offsets: Vec<u64>,
    pub changes: Vec<WrapperChange>,
    /// End of the last section's raw data: what follows is trailing data
    /// (overlay, certificate table, COFF symbols).
    pub tail_start: u64,
    /// File offsets of the debug directory entries.
    pub debug_entries: Vec<u64>,
}

impl<'a> Input<'a> {
    pub fn fatbin(&self) -> &PeSection<'a> {
        &self.sections[self.fatbin]
    }
}

pub fn analyze(pe: PeView<'_>) -> Result<Input<'_>, E> {
    let sections = pe.sections()?;
    if pe.section_index(METADATA_SECTION).is_some() {
        return Err(E::HasMetadata);
    }
    let fatbin = pe
        .section_index(FATBIN_SECTION)
        .ok_or(SectionError::NotFat(Container::Pe))?;
    let f = &sections[fatbin];
    if f.raw_size == 0 {
        return Err(E::FatbinEmpty);
    }
    let tail_start = check_layout(&pe, &sections, f)?;
    check_header_room(&pe)?;
    let starts: Vec<(usize, usize)> = list_fatbin(f.data)?
        .iter()
        .map(|bundle| (bundle.range.start, bundle.index))
        .collect();
    let table = HostBinary::Pe(pe).wrappers().map_err(WrapperError::Table)?;
    // Read here, not taken from the table: without a wrapper section the
    // table is empty, relocations included.
    let relocs = pe.base_relocations()?;
    let (wrapper_offsets, changes) = resolve_wrappers(&table, f, &starts, !relocs.is_empty())?;
    let slots: Vec<u64> = table.slots.iter().map(|s| s.addr + 8).collect();
    check_relocations(&pe, &relocs, f, &slots)?;
    let debug_entries = debug_entries(&pe)?;
    Ok(Input {
        pe,
        fatbin,
        bundles: starts.len(),
        wrapper_offsets,
        changes,
        tail_start,
        debug_entries,
        sections,
    })
}

/// Alignments are powers of two, and the sections and directories are
/// laid out as the verifier requires of the output (raw data aligned,
/// after the headers, not shared; memory ascending and disjoint;
/// directories in sections; the certificate and COFF symbol tables after
/// the sections, inside the file): what the plan moves must be sound to
/// begin with. Returns the end of the last section's raw data.
fn check_layout(pe: &PeView, sections: &[PeSection], f: &PeSection) -> Result<u64, E> {
    let (fa, sa) = (pe.file_alignment(), pe.section_alignment());
    if !fa.is_power_of_two() || !sa.is_power_of_two() || fa > sa || fa > 1 << 16 {
        return Err(E::Layout(format!(
            "FileAlignment {fa:#x} / SectionAlignment {sa:#x}"
        )));
    }
    if pe.size_of_headers() > pe.bytes().len() as u64 {
        return Err(E::Layout(format!(
            "SizeOfHeaders {:#x} runs past the end of the file",
            pe.size_of_headers()
        )));
    }
    let mut bad = Vec::new();
    super::verify::check_sections(pe, sections, &mut bad);
    super::verify::check_directories(pe, sections, &mut bad);
    if let Some(problem) = bad.into_iter().next() {
        return Err(E::Layout(problem));
    }
    if !f.raw_size.is_multiple_of(fa) {
        return Err(E::Layout(format!(
            "{FATBIN_SECTION}: SizeOfRawData {:#x} is not a multiple of FileAlignment",
            f.raw_size
        )));
    }
    Ok(sections
        .iter()
        .filter(|s| s.raw_size > 0)
        .map(|s| s.raw_offset + s.raw_size)
        .max()
        .unwrap_or(0)
        .max(pe.size_of_headers()))
}

/// One more 40-byte header must fit after the section table, below
/// `SizeOfHeaders` and the first raw data, over bytes that are zero.
fn check_header_room(pe: &PeView) -> Result<(), E> {
    let n = pe.section_headers().len() as u64;
    let at = pe.section_table_offset() + n * SECTION_HEADER_SIZE;
    let end = at + SECTION_HEADER_SIZE;
    if end > pe.size_of_headers() {
        return Err(E::NoRoomForHeader {
            why: format!(
                "the table would end at {end:#x}, SizeOfHeaders is {:#x}",
                pe.size_of_headers()
            ),
        });
    }
    let slot = pe.bytes().get(at as usize..end as usize);
    if slot.is_none_or(|b| b.iter().any(|&c| c != 0)) {
        return Err(E::NoRoomForHeader {
            why: format!("the bytes at {at:#x} after the section table are in use"),
        });
    }
    Ok(())
}

/// Every wrapper must be HIPF version 1 and point at the start of a
/// bundle, through a DIR64 base relocation when the image has any (else
/// the pointer would not follow the image when Windows moves it); its
/// `co_index` is that bundle's index.
fn resolve_wrappers(
    table: &WrapperTable,
    f: &PeSection,
    starts: &[(usize, usize)],
    relocatable: bool,
) -> Result<(Vec<u64>, Vec<WrapperChange>), E> {
    let range = BundleRange {
        section: FATBIN_SECTION,
        start: f.rva,
        end: f.rva + f.mem_size(),
        starts,
        address: Address::Rva,
    };
    let mut offsets = Vec::new();
    let mut changes = Vec::new();
    for slot in &table.slots {
        let index = slot.index;
        check_hipf(slot)?;
        if slot.wrapper.version != 1 {
            let version = slot.wrapper.version;
            return Err(WrapperError::UnknownVersion { index, version }.into());
        }
        let p = resolved(slot)?;
        if relocatable && p.kind != PointerKind::BaseRelocDir64 {
            return Err(WrapperError::NotRebased { index }.into());
        }
        let co_index = bundle_index(slot, p, &range)?;
        offsets.push(slot.offset);
        changes.push(WrapperChange {
            index,
            co_index,
            pointer: p.kind,
        });
    }
    Ok((offsets, changes))
}

/// No base relocation may apply to `.hip_fat`'s bytes, and no DIR64 one
/// other than the wrappers' may point into it: those bytes leave the file.
fn check_relocations(
    pe: &PeView,
    relocs: &[BaseReloc],
    f: &PeSection,
    wrapper_slots: &[u64],
) -> Result<(), E> {
    let hit = |rva: u64, what: &'static str| -> E {
        SectionError::RelocationIntoRemoved {
            reloc: Reloc::Pe(rva),
            what,
            start: f.rva,
            end: f.rva + f.mem_size(),
        }
        .into()
    };
    for r in relocs {
        if f.contains_rva(r.rva) {
            return Err(hit(r.rva, "applies to bytes"));
        }
        if r.typ != IMAGE_REL_BASED_DIR64 || wrapper_slots.contains(&r.rva) {
            continue;
        }
        let value = pe
            .rva_to_offset(r.rva, 8)
            .and_then(|o| crate::bytes::u64_at(pe.bytes(), o));
        if value.is_some_and(|v| f.contains_rva(v.wrapping_sub(pe.image_base()))) {
            return Err(hit(r.rva, "points"));
        }
    }
    Ok(())
}

/// The file offsets of the debug directory's entries.
fn debug_entries(pe: &PeView) -> Result<Vec<u64>, E> {
    let (rva, size) = pe.directory(IMAGE_DIRECTORY_ENTRY_DEBUG);
    if size == 0 {
        return Ok(Vec::new());
    }
    let off = pe
        .rva_to_offset(rva, size)
        .ok_or_else(|| E::Layout("the debug directory lies outside the file".into()))?;
    Ok((0..size / DEBUG_ENTRY_SIZE)
        .map(|k| off + k * DEBUG_ENTRY_SIZE)
        .collect())
}
