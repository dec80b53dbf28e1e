//! Step 3 of the PE transform: produce the output bytes from the input and
//! the plan. Headers are written through `object`'s PE types; every
//! offset comes from the plan's mapping, checked against the output.

use object::pe::ImageSectionHeader;
use object::LittleEndian as LE;
use object::{U16, U32};

use super::analyze::Input;
use super::plan::Plan;
use super::PeTransformError as E;
use crate::bytes::{put_u32, put_u64, u32_at};
use crate::hipk::{HIPK_MAGIC, WRAPPER_SIZE};
use crate::pe::{
    CHECKSUM_OFFSET, IMAGE_DIRECTORY_ENTRY_SECURITY, IMAGE_SCN_CNT_INITIALIZED_DATA,
    IMAGE_SCN_MEM_READ, METADATA_SECTION, SECTION_HEADER_SIZE,
};

/// The whole output file.
pub fn output(input: &Input, plan: &Plan, metadata: &[u8]) -> Result<Vec<u8>, E> {
    let mut out = body(input, plan, metadata);
    write_sections(&mut out, input, plan)?;
    write_headers(&mut out, input, plan)?;
    write_wrappers(&mut out, input, plan)?;
    write_debug_entries(&mut out, input, plan)?;
    write_checksum(&mut out, input);
    Ok(out)
}

/// `len` bytes of the output at `at`, or an error naming `what`.
fn region<'o>(
    out: &'o mut [u8],
    at: Option<u64>,
    len: usize,
    what: &str,
) -> Result<&'o mut [u8], E> {
    let ok = at.and_then(|a| {
        let s = usize::try_from(a).ok()?;
        Some(s..s.checked_add(len)?)
    });
    match ok {
        Some(r) if r.end <= out.len() => Ok(&mut out[r]),
        _ => Err(E::Layout(format!(
            "{what} lies in the removed bytes or outside the file"
        ))),
    }
}

/// The input without the removed range, `.hip_fat`'s remaining bytes
/// zeroed, the metadata after the last section, then the trailing data.
fn body(input: &Input, plan: &Plan, metadata: &[u8]) -> Vec<u8> {
    let b = input.pe.bytes();
    let (cut, cut_end, tail) = (
        plan.cut_start as usize,
        (plan.cut_start + plan.removed) as usize,
        plan.tail_start as usize,
    );
    let mut out =
        Vec::with_capacity(b.len() - plan.removed as usize + plan.meta_raw as usize + 512);
    out.extend_from_slice(&b[..cut]);
    out.extend_from_slice(&b[cut_end..tail]);
    let f = input.fatbin();
    out[f.raw_offset as usize..(f.raw_offset + plan.fatbin_raw) as usize].fill(0);
    out.resize(plan.meta_off as usize, 0);
    out.extend_from_slice(metadata);
    out.resize(plan.tail_out as usize, 0);
    out.extend_from_slice(&b[tail..]);
    out
}

/// Every section header with its raw data where it moved (`.hip_fat`
/// shortened), and `.kpackrf`'s header after the last.
fn write_sections(out: &mut [u8], input: &Input, plan: &Plan) -> Result<(), E> {
    let pe = &input.pe;
    let table = pe.section_table_offset();
    for (i, h) in pe.section_headers().iter().enumerate() {
        let mut n = *h;
        let map = |v: &U32<LE>, what: &str| -> Result<U32<LE>, E> {
            match v.get(LE) {
                0 => Ok(*v),
                o => plan
                    .map_off(u64::from(o))
                    .map(|m| U32::new(LE, m as u32))
                    .ok_or_else(|| {
                        E::Layout(format!("{what} of section {i} lies in the removed bytes"))
                    }),
            }
        };
        if i == input.fatbin {
            n.size_of_raw_data.set(LE, plan.fatbin_raw as u32);
            if plan.fatbin_raw == 0 {
                n.pointer_to_raw_data.set(LE, 0);
            }
        } else if h.size_of_raw_data.get(LE) > 0 {
            n.pointer_to_raw_data = map(&h.pointer_to_raw_data, "the raw data")?;
        }
        n.pointer_to_relocations = map(&h.pointer_to_relocations, "the relocations")?;
        n.pointer_to_linenumbers = map(&h.pointer_to_linenumbers, "the line numbers")?;
        let at = table + i as u64 * SECTION_HEADER_SIZE;
        region(
            out,
            Some(at),
            SECTION_HEADER_SIZE as usize,
            "a section header",
        )?
        .copy_from_slice(object::pod::bytes_of(&n));
    }
    let at = table + pe.section_headers().len() as u64 * SECTION_HEADER_SIZE;
    region(
        out,
        Some(at),
        SECTION_HEADER_SIZE as usize,
        "the new section header",
    )?
    .copy_from_slice(object::pod::bytes_of(&metadata_header(plan)));
    Ok(())
}

fn metadata_header(plan: &Plan) -> ImageSectionHeader {
    let mut name = [0u8; 8];
    name.copy_from_slice(METADATA_SECTION.as_bytes());
    ImageSectionHeader {
        name,
        virtual_size: U32::new(LE, plan.meta_len as u32),
        virtual_address: U32::new(LE, plan.meta_rva as u32),
        size_of_raw_data: U32::new(LE, plan.meta_raw as u32),
        pointer_to_raw_data: U32::new(LE, plan.meta_off as u32),
        pointer_to_relocations: U32::new(LE, 0),
        pointer_to_linenumbers: U32::new(LE, 0),
        number_of_relocations: U16::new(LE, 0),
        number_of_linenumbers: U16::new(LE, 0),
        characteristics: U32::new(LE, IMAGE_SCN_CNT_INITIALIZED_DATA | IMAGE_SCN_MEM_READ),
    }
}

/// `NumberOfSections`, `PointerToSymbolTable`, `SizeOfImage`,
/// `SizeOfInitializedData` and the certificate table's file offset.
fn write_headers(out: &mut [u8], input: &Input, plan: &Plan) -> Result<(), E> {
    let pe = &input.pe;
    let mut fh = *pe.file_header();
    let n = fh.number_of_sections.get(LE);
    fh.number_of_sections.set(LE, n + 1);
    let sym = fh.pointer_to_symbol_table.get(LE);
    if sym != 0 {
        let m = plan
            .map_off(u64::from(sym))
            .ok_or_else(|| E::Layout("the COFF symbol table lies in the removed bytes".into()))?;
        fh.pointer_to_symbol_table.set(LE, m as u32);
    }
    region(
        out,
        Some(pe.file_header_offset()),
        std::mem::size_of_val(&fh),
        "the file header",
    )?
    .copy_from_slice(object::pod::bytes_of(&fh));
    let mut oh = *pe.optional_header();
    oh.size_of_image.set(LE, plan.size_of_image);
    oh.size_of_initialized_data
        .set(LE, plan.size_of_initialized_data);
    region(
        out,
        Some(pe.optional_header_offset()),
        std::mem::size_of_val(&oh),
        "the optional header",
    )?
    .copy_from_slice(object::pod::bytes_of(&oh));
    let (cert, size) = pe.directory(IMAGE_DIRECTORY_ENTRY_SECURITY);
    if size > 0 {
        let at = pe.directories_offset() + 8 * IMAGE_DIRECTORY_ENTRY_SECURITY as u64;
        let m = plan
            .map_off(cert)
            .ok_or_else(|| E::Layout("the certificate table lies in the removed bytes".into()))?;
        put_u32(
            region(out, Some(at), 4, "the certificate directory")?,
            0,
            m as u32,
        );
    }
    Ok(())
}

/// Each wrapper: HIPK, pointing at `.kpackrf` (absolute, at the preferred
/// image base), `reserved1` = the bundle index it pointed at.
fn write_wrappers(out: &mut [u8], input: &Input, plan: &Plan) -> Result<(), E> {
    let target = input.pe.image_base().wrapping_add(plan.meta_rva);
    for (&off, c) in input.wrapper_offsets.iter().zip(&input.changes) {
        let w = region(out, plan.map_off(off), WRAPPER_SIZE, "a wrapper")?;
        put_u32(w, 0, HIPK_MAGIC);
        put_u64(w, 8, target);
        put_u64(w, 16, u64::from(c.co_index));
    }
    Ok(())
}

/// Debug directory entries: `PointerToRawData` (a file offset) follows
/// the data it names.
fn write_debug_entries(out: &mut [u8], input: &Input, plan: &Plan) -> Result<(), E> {
    for &entry in &input.debug_entries {
        let e = region(out, plan.map_off(entry), 28, "a debug directory entry")?;
        let ptr = u32_at(e, 24).expect("28 bytes");
        if ptr != 0 {
            let m = plan
                .map_off(u64::from(ptr))
                .ok_or_else(|| E::Layout("debug data lies in the removed bytes".into()))?;
            put_u32(e, 24, m as u32);
        }
    }
    Ok(())
}

/// A non-zero `CheckSum` is recomputed over the output.
fn write_checksum(out: &mut [u8], input: &Input) {
    let pe = &input.pe;
    if pe.optional_header().check_sum.get(LE) == 0 {
        return;
    }
    let sum = pe.checksum_of(out);
    let at = (pe.optional_header_offset() + CHECKSUM_OFFSET) as usize;
    put_u32(out, at, sum);
}
