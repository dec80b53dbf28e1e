//! Step 2 of the PE transform: decide the output layout — which file bytes
//! of `.hip_fat` leave the file, where `.kpackrf` goes in the file and in
//! memory, where the trailing data lands, and the new header values.
//! Nothing is written here.

use object::LittleEndian as LE;

use super::analyze::Input;
use super::PeTransformError as E;
use crate::pe::{PeSection, IMAGE_SCN_CNT_INITIALIZED_DATA};

/// The unit `.hip_fat` loses whole multiples of.
pub(crate) const PAGE: u64 = 4096;

/// The output layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Input file range `[cut_start, cut_start + removed)` leaves the file
    /// (the tail of `.hip_fat`'s raw data).
    pub cut_start: u64,
    pub removed: u64,
    /// `.hip_fat`'s new `SizeOfRawData` (its bytes all zero).
    pub fatbin_raw: u64,
    /// Input offset where the trailing data starts.
    pub tail_start: u64,
    /// Output offset where the trailing data lands.
    pub tail_out: u64,
    /// `.kpackrf`: output file offset, raw size, RVA, length.
    pub meta_off: u64,
    pub meta_raw: u64,
    pub meta_rva: u64,
    pub meta_len: u64,
    pub size_of_image: u32,
    pub size_of_initialized_data: u32,
}

impl Plan {
    /// Where an input file offset lands in the output (`None` inside the
    /// removed range).
    pub(crate) fn map_off(&self, o: u64) -> Option<u64> {
        let cut_end = self.cut_start + self.removed;
        if o < self.cut_start {
            Some(o)
        } else if o < cut_end {
            None
        } else if o < self.tail_start {
            Some(o - self.removed)
        } else {
            Some(o - self.tail_start + self.tail_out)
        }
    }
}

pub fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Plan the output for `meta_len` bytes of metadata.
pub fn plan(input: &Input, meta_len: u64) -> Result<Plan, E> {
    let pe = &input.pe;
    let (fa, sa) = (pe.file_alignment(), pe.section_alignment());
    let f = input.fatbin();
    let unit = PAGE.max(fa);
    let removed = f.raw_size / unit * unit;
    let fatbin_raw = f.raw_size - removed;
    let meta_off = align_up(input.tail_start - removed, fa);
    let meta_raw = align_up(meta_len, fa);
    // The trailing data keeps its offset modulo FileAlignment (the
    // certificate table must stay 8-byte aligned).
    let tail_out = meta_off + meta_raw + input.tail_start % fa;
    let meta_rva = input
        .sections
        .iter()
        .map(|s| align_up(s.rva + s.virtual_size.max(s.raw_size), sa))
        .max()
        .unwrap_or(0)
        .max(align_up(pe.size_of_headers(), sa));
    let too_big = || E::Layout("the image would exceed 4 GiB".into());
    let size_of_image =
        u32::try_from(meta_rva + align_up(meta_len.max(1), sa)).map_err(|_| too_big())?;
    let old_init = u64::from(pe.optional_header().size_of_initialized_data.get(LE));
    let init_removed = if is_initialized(f) { removed } else { 0 };
    let size_of_initialized_data =
        u32::try_from((old_init + meta_raw).saturating_sub(init_removed)).map_err(|_| too_big())?;
    u32::try_from(tail_out + (pe.bytes().len() as u64 - input.tail_start))
        .map_err(|_| too_big())?;
    Ok(Plan {
        cut_start: f.raw_offset + fatbin_raw,
        removed,
        fatbin_raw,
        tail_start: input.tail_start,
        tail_out,
        meta_off,
        meta_raw,
        meta_rva,
        meta_len,
        size_of_image,
        size_of_initialized_data,
    })
}

fn is_initialized(s: &PeSection) -> bool {
    s.characteristics & IMAGE_SCN_CNT_INITIALIZED_DATA != 0
}
