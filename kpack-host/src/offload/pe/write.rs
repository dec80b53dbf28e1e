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
use crate::image::{Image, OutOfRange};
use crate::pe::{
    CHECKSUM_OFFSET, IMAGE_DIRECTORY_ENTRY_SECURITY, IMAGE_SCN_CNT_INITIALIZED_DATA,
    IMAGE_SCN_MEM_READ, METADATA_SECTION, SECTION_HEADER_SIZE,
};

/// The whole output file, as pieces of the input and new bytes. A
/// non-zero `CheckSum` is left to be computed over the written file
/// ([`checksum_field`]).
pub fn output<'a>(input: &Input<'a>, plan: &Plan, metadata: &[u8]) -> Result<Image<'a>, E> {
    let mut out = body(input, plan, metadata)?;
    write_sections(&mut out, input, plan)?;
    write_headers(&mut out, input, plan)?;
    write_wrappers(&mut out, input, plan)?;
    write_debug_entries(&mut out, input, plan)?;
    Ok(out)
}

/// The error for a range the input's headers put outside the output.
fn outside(what: &str) -> impl FnOnce(OutOfRange) -> E + '_ {
    move |_| {
        E::Layout(format!(
            "{what} lies in the removed bytes or outside the file"
        ))
    }
}

/// The output offset `at` (`None`: in the removed bytes) and `N` bytes
/// there.
fn read_array<const N: usize>(
    out: &Image,
    at: Option<u64>,
    what: &str,
) -> Result<(u64, [u8; N]), E> {
    let at = at.ok_or_else(|| outside(what)(OutOfRange { at: 0, len: 0 }))?;
    let mut b = [0u8; N];
    out.read_into(at, &mut b).map_err(outside(what))?;
    Ok((at, b))
}

/// The input without the removed range, `.hip_fat`'s remaining bytes
/// zeroed, the metadata after the last section, then the trailing data.
fn body<'a>(input: &Input<'a>, plan: &Plan, metadata: &[u8]) -> Result<Image<'a>, E> {
    let b = input.pe.bytes();
    let (cut, cut_end, tail) = (
        plan.cut_start,
        plan.cut_start + plan.removed,
        plan.tail_start,
    );
    let mut out = Image::new(b);
    out.push_input(0..cut).map_err(outside("the kept bytes"))?;
    out.push_input(cut_end..tail)
        .map_err(outside("the sections after the cut"))?;
    let f = input.fatbin();
    out.fill_zero(f.raw_offset..f.raw_offset + plan.fatbin_raw)
        .map_err(outside("the section's bytes"))?;
    out.resize(plan.meta_off);
    out.push_bytes(metadata);
    out.resize(plan.tail_out);
    out.push_input(tail..b.len() as u64)
        .map_err(outside("the trailing data"))?;
    Ok(out)
}

/// Every section header with its raw data where it moved (`.hip_fat`
/// shortened), and `.kpackrf`'s header after the last.
fn write_sections(out: &mut Image, input: &Input, plan: &Plan) -> Result<(), E> {
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
        out.write(at, object::pod::bytes_of(&n))
            .map_err(outside("a section header"))?;
    }
    let at = table + pe.section_headers().len() as u64 * SECTION_HEADER_SIZE;
    out.write(at, object::pod::bytes_of(&metadata_header(plan)))
        .map_err(outside("the new section header"))
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
fn write_headers(out: &mut Image, input: &Input, plan: &Plan) -> Result<(), E> {
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
    out.write(pe.file_header_offset(), object::pod::bytes_of(&fh))
        .map_err(outside("the file header"))?;
    let mut oh = *pe.optional_header();
    oh.size_of_image.set(LE, plan.size_of_image);
    oh.size_of_initialized_data
        .set(LE, plan.size_of_initialized_data);
    out.write(pe.optional_header_offset(), object::pod::bytes_of(&oh))
        .map_err(outside("the optional header"))?;
    let (cert, size) = pe.directory(IMAGE_DIRECTORY_ENTRY_SECURITY);
    if size > 0 {
        let at = pe.directories_offset() + 8 * IMAGE_DIRECTORY_ENTRY_SECURITY as u64;
        let m = plan
            .map_off(cert)
            .ok_or_else(|| E::Layout("the certificate table lies in the removed bytes".into()))?;
        out.write(at, &(m as u32).to_le_bytes())
            .map_err(outside("the certificate directory"))?;
    }
    Ok(())
}

/// Each wrapper: HIPK, pointing at `.kpackrf` (absolute, at the preferred
/// image base), `reserved1` = the bundle index it pointed at.
fn write_wrappers(out: &mut Image, input: &Input, plan: &Plan) -> Result<(), E> {
    let target = input.pe.image_base().wrapping_add(plan.meta_rva);
    for (&off, c) in input.wrapper_offsets.iter().zip(&input.changes) {
        let (at, mut w) = read_array::<WRAPPER_SIZE>(out, plan.map_off(off), "a wrapper")?;
        put_u32(&mut w, 0, HIPK_MAGIC);
        put_u64(&mut w, 8, target);
        put_u64(&mut w, 16, u64::from(c.co_index));
        out.write(at, &w).map_err(outside("a wrapper"))?;
    }
    Ok(())
}

/// Debug directory entries: `PointerToRawData` (a file offset) follows
/// the data it names.
fn write_debug_entries(out: &mut Image, input: &Input, plan: &Plan) -> Result<(), E> {
    for &entry in &input.debug_entries {
        let what = "a debug directory entry";
        let (at, mut e) = read_array::<28>(out, plan.map_off(entry), what)?;
        let ptr = u32_at(&e, 24).expect("28 bytes");
        if ptr != 0 {
            let m = plan
                .map_off(u64::from(ptr))
                .ok_or_else(|| E::Layout("debug data lies in the removed bytes".into()))?;
            put_u32(&mut e, 24, m as u32);
            out.write(at, &e).map_err(outside(what))?;
        }
    }
    Ok(())
}

/// Where a non-zero `CheckSum` is recomputed over the output, once it is
/// written (it sums every byte of the file).
pub fn checksum_field(input: &Input) -> Option<u64> {
    let pe = &input.pe;
    (pe.optional_header().check_sum.get(LE) != 0)
        .then(|| pe.optional_header_offset() + CHECKSUM_OFFSET)
}
