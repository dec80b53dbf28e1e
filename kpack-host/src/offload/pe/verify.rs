//! The verifier of offloaded PE images (`kpack verify-binary`, also
//! behind `verify-elf`): checks the headers, the section layout, the HIPK
//! metadata, the wrappers and the base relocations against formats.md §4.4, from
//! the file alone. The transform runs it on its own output.
//!
//! Each check adds what it finds wrong to a list, so that a report names
//! every problem at once.

use object::LittleEndian as LE;

use crate::binary::HostBinary;
use crate::hipk::{HipkMetadata, MAX_METADATA_SIZE};
use crate::offload::verify::{check_hipk_wrapper, Verified, VerifyError};
use crate::pe::{
    BaseReloc, PeSection, PeView, FATBIN_SECTION, IMAGE_DIRECTORY_ENTRY_BASERELOC,
    IMAGE_DIRECTORY_ENTRY_EXPORT, IMAGE_DIRECTORY_ENTRY_IMPORT, IMAGE_DIRECTORY_ENTRY_SECURITY,
    IMAGE_REL_BASED_DIR64, IMAGE_SCN_CNT_INITIALIZED_DATA, IMAGE_SCN_MEM_READ, IMAGE_SCN_MEM_WRITE,
    METADATA_SECTION, SECTION_HEADER_SIZE, WRAPPER_SECTION,
};

/// Check an offloaded PE image. With `bundles`, also that every wrapper's
/// code object index names one of that many bundles.
pub fn verify_pe(b: &[u8], bundles: Option<usize>) -> Result<Verified, VerifyError> {
    verify_pe_with(b, bundles, Checksum::Verify)
}

/// Whether [`verify_pe_with`] sums the whole image to check a non-zero
/// `CheckSum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checksum {
    Verify,
    /// The writer has just computed it over this very file (the self-check
    /// of a rewrite): summing it again would read every page of the file.
    Trust,
}

/// [`verify_pe`], the checksum checked or not.
pub(crate) fn verify_pe_with(
    b: &[u8],
    bundles: Option<usize>,
    checksum: Checksum,
) -> Result<Verified, VerifyError> {
    let pe = PeView::parse(b)?;
    let sections = pe.sections()?;
    let mut bad = Vec::new();
    check_headers(&pe, &sections, &mut bad);
    if checksum == Checksum::Verify {
        check_checksum(&pe, &mut bad);
    }
    check_sections(&pe, &sections, &mut bad);
    check_directories(&pe, &sections, &mut bad);
    let relocs = pe.base_relocations().unwrap_or_else(|e| {
        bad.push(e.to_string());
        Vec::new()
    });
    let metadata = check_metadata(&pe, &sections, &mut bad);
    check_device_code_gone(&pe, &sections, &relocs, &mut bad);
    let metadata_rva = metadata.as_ref().map(|(_, a)| *a);
    let co_indices = check_wrappers(&pe, &relocs, metadata_rva, bundles, &mut bad);
    match metadata {
        Some((metadata, metadata_addr)) if bad.is_empty() => Ok(Verified {
            metadata,
            metadata_addr,
            co_indices,
            warnings: Vec::new(),
        }),
        _ => Err(VerifyError::Problems(bad)),
    }
}

/// The section table fits below `SizeOfHeaders` and `SizeOfImage` covers
/// every section.
fn check_headers(pe: &PeView, sections: &[PeSection], bad: &mut Vec<String>) {
    let (fa, sa) = (pe.file_alignment(), pe.section_alignment());
    if !fa.is_power_of_two() || !sa.is_power_of_two() || fa > sa {
        bad.push(format!(
            "FileAlignment {fa:#x} / SectionAlignment {sa:#x} are not powers of two with FileAlignment <= SectionAlignment"
        ));
        return;
    }
    let table_end = pe.section_table_offset() + sections.len() as u64 * SECTION_HEADER_SIZE;
    if table_end > pe.size_of_headers() {
        bad.push(format!(
            "the section table ends at {table_end:#x}, past SizeOfHeaders {:#x}",
            pe.size_of_headers()
        ));
    }
    let image_end = sections
        .iter()
        .map(|s| (s.rva + s.mem_size()).div_ceil(sa) * sa)
        .max()
        .unwrap_or(0);
    let size_of_image = u64::from(pe.optional_header().size_of_image.get(LE));
    if size_of_image < image_end || size_of_image % sa != 0 {
        bad.push(format!(
            "SizeOfImage {size_of_image:#x} does not cover the sections (end {image_end:#x}) in whole SectionAlignment units"
        ));
    }
}

/// A non-zero `CheckSum` is the image's.
fn check_checksum(pe: &PeView, bad: &mut Vec<String>) {
    let stored = pe.optional_header().check_sum.get(LE);
    if stored != 0 && stored != pe.checksum_of(pe.bytes()) {
        bad.push(format!(
            "CheckSum {stored:#x} is not the image's checksum {:#x}",
            pe.checksum_of(pe.bytes())
        ));
    }
}

/// Raw data aligned, after the headers, inside the file and not shared;
/// RVAs aligned, ascending and not overlapping. The transform asks the
/// same of its input.
pub(super) fn check_sections(pe: &PeView, sections: &[PeSection], bad: &mut Vec<String>) {
    let (fa, sa) = (pe.file_alignment().max(1), pe.section_alignment().max(1));
    let mut raw: Vec<&PeSection> = sections.iter().filter(|s| s.raw_size > 0).collect();
    raw.sort_by_key(|s| s.raw_offset);
    for s in &raw {
        if s.raw_offset % fa != 0 {
            bad.push(format!(
                "section {}: PointerToRawData {:#x} is not a multiple of FileAlignment",
                s.name, s.raw_offset
            ));
        }
        if s.raw_offset < pe.size_of_headers() {
            bad.push(format!("section {}: raw data inside the headers", s.name));
        }
    }
    for w in raw.windows(2) {
        if w[0].raw_offset + w[0].raw_size > w[1].raw_offset {
            bad.push(format!(
                "sections {} and {} overlap in the file",
                w[0].name, w[1].name
            ));
        }
    }
    for w in sections.windows(2) {
        if w[0].rva % sa != 0 || w[0].rva + w[0].mem_size() > w[1].rva {
            bad.push(format!(
                "sections {} and {} are not in ascending, SectionAlignment-aligned, disjoint memory",
                w[0].name, w[1].name
            ));
        }
    }
}

/// The export, import and base relocation directories lie in sections;
/// the certificate table (a file offset) lies after them, inside the file;
/// so does the COFF symbol table. The transform asks the same of its input.
pub(super) fn check_directories(pe: &PeView, sections: &[PeSection], bad: &mut Vec<String>) {
    for (i, name) in [
        (IMAGE_DIRECTORY_ENTRY_EXPORT, "export"),
        (IMAGE_DIRECTORY_ENTRY_IMPORT, "import"),
        (IMAGE_DIRECTORY_ENTRY_BASERELOC, "base relocation"),
    ] {
        let (rva, size) = pe.directory(i);
        if size > 0 && !sections.iter().any(|s| s.contains_rva(rva)) {
            bad.push(format!(
                "the {name} directory (RVA {rva:#x}) is in no section"
            ));
        }
    }
    let len = pe.bytes().len() as u64;
    let raw_end = sections
        .iter()
        .filter(|s| s.raw_size > 0)
        .map(|s| s.raw_offset + s.raw_size)
        .max()
        .unwrap_or(0);
    let (cert, size) = pe.directory(IMAGE_DIRECTORY_ENTRY_SECURITY);
    if size > 0 && (cert < raw_end || cert + size > len || cert % 8 != 0) {
        bad.push(format!(
            "the certificate table ({size:#x} bytes at {cert:#x}) is not 8-byte aligned after the sections, inside the file"
        ));
    }
    let sym = u64::from(pe.file_header().pointer_to_symbol_table.get(LE));
    if sym != 0 && (sym < raw_end || sym > len) {
        bad.push(format!(
            "the COFF symbol table at {sym:#x} does not lie after the sections, inside the file"
        ));
    }
}

/// `.kpackrf` is read-only initialized data with its bytes in the file,
/// and decodes. Returns the metadata and its RVA.
fn check_metadata(
    pe: &PeView,
    sections: &[PeSection],
    bad: &mut Vec<String>,
) -> Option<(HipkMetadata, u64)> {
    let Some(s) = pe.section_index(METADATA_SECTION).map(|i| &sections[i]) else {
        bad.push(format!("no {METADATA_SECTION} section"));
        return None;
    };
    let want = IMAGE_SCN_CNT_INITIALIZED_DATA | IMAGE_SCN_MEM_READ;
    if s.characteristics & want != want || s.characteristics & IMAGE_SCN_MEM_WRITE != 0 {
        bad.push(format!(
            "{METADATA_SECTION} is not read-only initialized data (characteristics {:#x})",
            s.characteristics
        ));
    }
    if s.raw_size < s.virtual_size {
        bad.push(format!("{METADATA_SECTION} is not all in the file"));
    }
    let len = s.data.len().min(MAX_METADATA_SIZE);
    match HipkMetadata::decode(&s.data[..len]) {
        Ok(m) => Some((m, s.rva)),
        Err(e) => {
            bad.push(format!("{METADATA_SECTION} does not decode: {e}"));
            None
        }
    }
}

/// `.hip_fat`'s bytes in the file are all zero, and no base relocation
/// applies to it or points into it.
fn check_device_code_gone(
    pe: &PeView,
    sections: &[PeSection],
    relocs: &[BaseReloc],
    bad: &mut Vec<String>,
) {
    let Some(f) = pe.section_index(FATBIN_SECTION).map(|i| &sections[i]) else {
        return;
    };
    let raw = pe
        .bytes()
        .get(f.raw_offset as usize..(f.raw_offset + f.raw_size) as usize);
    if f.raw_size > 0 && raw.is_none_or(|b| b.iter().any(|&c| c != 0)) {
        bad.push(format!(
            "bytes of {FATBIN_SECTION} remain in the file at {:#x}",
            f.raw_offset
        ));
    }
    for r in relocs {
        if f.contains_rva(r.rva) {
            bad.push(format!(
                "base relocation at RVA {:#x} applies to bytes of {FATBIN_SECTION}",
                r.rva
            ));
        }
        let value = pe
            .rva_to_offset(r.rva, 8)
            .and_then(|o| crate::bytes::u64_at(pe.bytes(), o));
        let target = value.map(|v| v.wrapping_sub(pe.image_base()));
        if r.typ == IMAGE_REL_BASED_DIR64 && target.is_some_and(|t| f.contains_rva(t)) {
            bad.push(format!(
                "base relocation at RVA {:#x} points into {FATBIN_SECTION}",
                r.rva
            ));
        }
    }
}

/// Every wrapper is HIPK version 1 with a code object index in range, its
/// pointer resolves to the metadata, and a relocatable image rebases it.
/// Returns the code object indices.
fn check_wrappers(
    pe: &PeView,
    relocs: &[BaseReloc],
    metadata_rva: Option<u64>,
    bundles: Option<usize>,
    bad: &mut Vec<String>,
) -> Vec<u64> {
    if pe.section_index(WRAPPER_SECTION).is_none() {
        bad.push(format!("no {WRAPPER_SECTION} section"));
        return Vec::new();
    }
    let table = match HostBinary::Pe(*pe).wrappers() {
        Ok(t) => t,
        Err(e) => {
            bad.push(e.to_string());
            return Vec::new();
        }
    };
    let relocatable = !relocs.is_empty();
    let mut co_indices = Vec::with_capacity(table.len());
    for slot in &table.slots {
        let k = slot.index;
        co_indices.push(check_hipk_wrapper(slot, bundles, bad));
        match (&slot.pointer, metadata_rva) {
            (Ok(p), Some(m)) if p.value != m => bad.push(format!(
                "wrapper {k}: binary pointer resolves to RVA {:#x}, not the metadata at {m:#x}",
                p.value
            )),
            (Ok(p), _) if relocatable && p.kind != crate::elf::PointerKind::BaseRelocDir64 => {
                bad.push(format!(
                    "wrapper {k}: the image has base relocations but none rebases the binary pointer"
                ))
            }
            (Ok(_), _) => {}
            (Err(e), _) => bad.push(format!("wrapper {k}: {e}")),
        }
    }
    co_indices
}
