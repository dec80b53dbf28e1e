//! Step 2 of the transform: decide the output layout — which file range of
//! `.hip_fatbin` leaves the file (or, for restore, which pages go back into
//! it), whether the program header table grows and which block of sections
//! moves out of its way, where the payload goes, what the wrappers become,
//! and the new program and section headers. Nothing is written here.
//!
//! [`plan`] lays out offload and prune (the payload kept at the section's
//! start: metadata or pruned bundles; whole pages after it leave the file);
//! [`plan_restore`] the inverse cut of restore (the removed pages put back,
//! the bundles in the range the device code had).

use object::elf;
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _};

use super::analyze::{Fatbin, Hole, Input};
use super::{Request, TransformError};
use crate::binary::Address;
use crate::elf::{
    file_size, offset_mapping_problems, ElfView, MappingProblem, PhdrExt, ProgramHeader,
    SectionHeader, FATBIN_SECTION, LE, PHDR_SIZE,
};
use crate::hipk::{HIPF_MAGIC, HIPK_MAGIC};
use crate::offload::wrappers::WrapperError;

mod block;
mod layout;
mod restore;

use block::{block_with_room_for_notes, check_block_relocations, place_block, place_notes};
pub(crate) use layout::sections;
use layout::{holds_sections, segments};
pub(crate) use restore::plan_restore;

/// The file range of the input that leaves the file (`[start, end)`,
/// `removed` bytes), or, for restore, the place where `inserted` zero bytes
/// go back into it (`start == end`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    pub start: u64,
    pub end: u64,
    pub removed: u64,
    pub inserted: u64,
}

/// What the section's range becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// Offload: `.hip_fatbin` NOBITS after the metadata; a
    /// `.rocm_kpack_ref` header appended.
    Offloaded,
    /// Prune: `.hip_fatbin` PROGBITS over the pruned bundles.
    Pruned,
    /// Restore: `.hip_fatbin` PROGBITS over the bundles; the last section
    /// header (`.rocm_kpack_ref`) dropped.
    Restored,
}

/// One wrapper as written: magic, pointer (written in the file and as the
/// addend of its relocation), and `reserved1` when it changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WrapperOut {
    pub magic: u32,
    pub pointer: u64,
    pub reserved1: Option<u64>,
}

/// A block of sections moved out of the grown program header table's way,
/// into the kept page(s) of `.hip_fatbin` after the metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockMove {
    pub start_addr: u64,
    pub end_addr: u64,
    pub start_off: u64,
    /// Alignment the block needs (the largest of its sections').
    pub align: u64,
    /// How its addresses and file offsets move (wrapping).
    pub addr_delta: u64,
    pub off_delta: u64,
}

impl BlockMove {
    pub fn len(&self) -> u64 {
        self.end_addr - self.start_addr
    }
}

/// A note section of the moved block placed back at the start of its
/// segment, right after the grown program header table, instead of moving
/// with the block: `objcopy --only-keep-debug` keeps the bytes of notes and
/// empties every other allocated section, and a segment whose bytes come
/// after emptied sections cannot be laid out (it warns "section can't be
/// allocated in segment"), so notes must stay ahead of the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotePlace {
    pub index: usize,
    pub addr: u64,
    pub off: u64,
    pub size: u64,
    pub new_addr: u64,
    pub new_off: u64,
}

impl NotePlace {
    fn holds_addr(&self, addr: u64) -> bool {
        (self.addr..self.addr + self.size).contains(&addr)
    }

    fn holds_off(&self, off: u64) -> bool {
        (self.off..self.off + self.size).contains(&off)
    }
}

/// The output layout.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Where the payload (metadata or bundles) goes.
    pub payload_addr: u64,
    pub payload_off: u64,
    pub payload_len: u64,
    pub form: Form,
    /// Per wrapper, in table order.
    pub wrappers: Vec<WrapperOut>,
    /// Output file ranges zeroed before the payload is written: no bundle
    /// (or metadata) byte of the input stays where it no longer belongs.
    pub zero: Vec<(u64, u64)>,
    /// Prune: (old address, new address) of each bundle start; symbols at
    /// an old start follow it.
    pub symbol_map: Vec<(u64, u64)>,
    /// Restore: the segment merged into X1 (and dropped from the table).
    pub joined: Option<usize>,
    /// Restore: the removed range is an unmapped gap after X1 (offload's
    /// [`Plan::gap`]): what does not go back into the file stays unmapped.
    pub restores_gap: bool,
    /// Restore: the alignment of the restored section.
    pub align: u64,
    pub cut: Cut,
    /// Whether X is split in two (pages removed from its middle).
    pub split: bool,
    /// Bytes of `.hip_fatbin` kept at its start (whole pages when split).
    pub keep: u64,
    /// End address of the removed pages.
    pub cut_addr_end: u64,
    /// End of the input's program header table in the file.
    pub old_table_end: u64,
    pub block: Option<BlockMove>,
    /// The block's notes, placed right after the grown table (empty when
    /// they do not fit there: then they move with the block).
    pub notes: Vec<NotePlace>,
    /// The new program header table.
    pub phdrs: Vec<ProgramHeader>,
    /// The removed pages' address range is left unmapped, X1 ending with
    /// its file bytes, instead of being X1's zero-filled tail (whose window
    /// in file offsets would take in later sections' offsets); `.hip_fatbin`
    /// is then an empty NOBITS section at the end of X1.
    pub gap: bool,
    /// The payload (and the moved block) is in N, a read-only segment after
    /// every other one, the section being in the middle of a writable
    /// segment (a read-only segment there would sit among its data): N's
    /// length.
    pub at_end: Option<u64>,
}

impl Plan {
    /// Where an input file offset lands in the output (`None` inside the
    /// removed range).
    pub(crate) fn map_off(&self, o: u64) -> Option<u64> {
        let c = self.cut;
        if c.inserted > 0 {
            return Some(if o >= c.start { o + c.inserted } else { o });
        }
        if o < c.start || c.removed == 0 {
            Some(o)
        } else if o >= c.end {
            Some(o - c.removed)
        } else {
            None
        }
    }

    /// Is this input address inside the moved block?
    pub(crate) fn in_block(&self, addr: u64) -> bool {
        self.block
            .is_some_and(|bl| (bl.start_addr..bl.end_addr).contains(&addr))
    }

    fn in_block_off(&self, off: u64) -> bool {
        self.block
            .is_some_and(|bl| (bl.start_off..bl.start_off + bl.len()).contains(&off))
    }

    /// Where an address inside the moved block goes (a placed note's own
    /// place, or the block's).
    pub(crate) fn moved_addr(&self, addr: u64) -> u64 {
        match self.notes.iter().find(|n| n.holds_addr(addr)) {
            Some(n) => n.new_addr + (addr - n.addr),
            None => addr.wrapping_add(self.block.map_or(0, |bl| bl.addr_delta)),
        }
    }

    /// Where a file offset inside the moved block goes.
    pub(crate) fn moved_off(&self, off: u64) -> u64 {
        match self.notes.iter().find(|n| n.holds_off(off)) {
            Some(n) => n.new_off + (off - n.off),
            None => off.wrapping_add(self.block.map_or(0, |bl| bl.off_delta)),
        }
    }

    /// How far the addresses of moved section `index` move.
    pub(crate) fn section_addr_delta(&self, index: usize) -> u64 {
        match self.notes.iter().find(|n| n.index == index) {
            Some(n) => n.new_addr.wrapping_sub(n.addr),
            None => self.block.map_or(0, |bl| bl.addr_delta),
        }
    }

    /// Whether a symbol of `.hip_fatbin` at `value` (in `f`) names the
    /// metadata afterwards: one in its kept part, or at its start.
    pub(crate) fn names_metadata(&self, f: &Fatbin, value: u64) -> bool {
        match self.at_end {
            Some(_) => value == f.addr,
            None => (f.addr..self.kept_end()).contains(&value),
        }
    }

    /// The end of the kept part of `.hip_fatbin` (symbols into it name the
    /// metadata afterwards).
    pub(crate) fn kept_end(&self) -> u64 {
        if self.split {
            self.payload_addr + self.keep
        } else {
            self.payload_addr + self.payload_len
        }
    }
}

pub fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl Cut {
    /// A cut that removes the file bytes `start..end`.
    fn removing(start: u64, end: u64) -> Cut {
        Cut {
            start,
            end,
            removed: end - start,
            inserted: 0,
        }
    }

    /// A cut that puts `inserted` zero bytes back into the file at `at`.
    fn inserting(at: u64, inserted: u64) -> Cut {
        Cut {
            start: at,
            end: at,
            removed: 0,
            inserted,
        }
    }
}

/// The end in the file of a program header table of `phnum` entries at the
/// input's `e_phoff`.
fn table_end(input: &Input, phnum: usize) -> u64 {
    input.elf.header().e_phoff(LE) + (phnum * PHDR_SIZE) as u64
}

/// Plan the output of offload or prune: `request`'s payload kept at the
/// start of `.hip_fatbin`, whole pages after it removed.
pub fn plan(input: &Input, request: &Request) -> Result<Plan, TransformError> {
    let plan = plan_with(input, request, false)?;
    if !plan.split || !maps_worse(input, &plan)? {
        return Ok(plan);
    }
    // X1's zero-filled window holds another section's file offset (or the
    // section's lands in an earlier segment's): the removed range is left
    // unmapped instead, if that plan works and maps better.
    match plan_with(input, request, true) {
        Ok(d) if d.split && !maps_worse(input, &d)? => Ok(d),
        _ => Ok(plan),
    }
}

/// Whether `plan`'s headers map a section to a wrong segment by its file
/// offset where the input's did not (what eu-elflint checks:
/// [`offset_mapping_problems`]).
fn maps_worse(input: &Input, plan: &Plan) -> Result<bool, TransformError> {
    let elf = &input.elf;
    let named = |list: Vec<(usize, MappingProblem)>| -> Result<Vec<_>, TransformError> {
        let mut v = Vec::with_capacity(list.len());
        for (i, p) in list {
            v.push((elf.section_name(i)?, p));
        }
        Ok(v)
    };
    let before = named(offset_mapping_problems(elf.phdrs(), elf.shdrs()))?;
    let (mut shdrs, _) = sections(input, plan)?;
    if plan.form == Form::Offloaded {
        shdrs.push(metadata_header(0, plan));
    }
    let after = named(offset_mapping_problems(&plan.phdrs, &shdrs))?;
    Ok(after.iter().any(|p| !before.contains(p)))
}

/// The metadata's section header as [`plan`] places it, its name at
/// `name_off` in the section name table.
pub(super) fn metadata_header(name_off: u32, plan: &Plan) -> SectionHeader {
    use object::{U32, U64};
    SectionHeader {
        sh_name: U32::new(LE, name_off),
        sh_type: U32::new(LE, elf::SHT_PROGBITS),
        sh_flags: U64::new(LE, u64::from(elf::SHF_ALLOC)),
        sh_addr: U64::new(LE, plan.payload_addr),
        sh_offset: U64::new(LE, plan.payload_off),
        sh_size: U64::new(LE, plan.payload_len),
        sh_link: U32::new(LE, 0),
        sh_info: U32::new(LE, 0),
        sh_addralign: U64::new(LE, 16),
        sh_entsize: U64::new(LE, 0),
    }
}

/// [`plan`], the removed range detached from X1 or not.
fn plan_with(input: &Input, request: &Request, detach: bool) -> Result<Plan, TransformError> {
    let meta_len = request.payload().len();
    let f = input.fatbin;
    let separate = input.writable && matches!(request, Request::Offload { .. });
    let r = Removal::of(input, separate, detach)?;
    let block = if r.grow > 0 {
        block_with_room_for_notes(&input.elf, r.old_table_end, r.new_table_end)?
    } else {
        None
    };
    // Where the payload goes: the section's first page(s), or, when the
    // section lies in the middle of a writable segment, a read-only segment
    // of its own after every other one (N).
    let at = match r.at_end {
        true => end_of_image(input, &r),
        false => f,
    };
    let (block, used) = block_after_payload(at, block, meta_len);
    let kept_len = if r.at_end { 0 } else { used };
    let (keep, split, cut) = kept_and_cut(input, &r, kept_len, meta_len)?;
    if separate && !split {
        return Err(TransformError::FatbinWritable {
            why: "and has no whole page beside the metadata",
        });
    }
    let (form, wrappers, symbol_map) = wrappers_for(input, request, at.addr)?;
    let mut plan = Plan {
        payload_addr: at.addr,
        payload_off: at.offset,
        payload_len: meta_len,
        form,
        wrappers,
        zero: Vec::new(),
        symbol_map,
        joined: None,
        restores_gap: false,
        align: 0,
        cut,
        split,
        keep,
        cut_addr_end: r.cut_addr_end,
        old_table_end: r.old_table_end,
        block: if split { block } else { None },
        notes: Vec::new(),
        phdrs: Vec::new(),
        gap: r.detach && split,
        at_end: (r.at_end && split).then_some(used),
    };
    if let Some(bl) = plan.block {
        plan.notes = place_notes(&input.elf, &bl, r.new_table_end);
    }
    check_block_relocations(input, &plan)?;
    plan.phdrs = segments(input, &plan, &r)?;
    plan.zero = cleared(input, &plan);
    Ok(plan)
}

/// Where the pages offload or prune may remove end, and what removing them
/// does to the program header table.
struct Removal {
    /// The last unit boundary in `.hip_fatbin`.
    cut_addr_end: u64,
    /// Its file offset.
    cut_end_if_split: u64,
    /// X goes on after those pages with sections of its own: removing them
    /// splits it in two (X1 and X2).
    x2: bool,
    /// X goes on after those pages with nothing but the zeroed end of
    /// `.hip_fatbin`: those bytes stay in the file, unmapped, as padding (a
    /// segment without sections is laid out by strip and objcopy at an
    /// offset that breaks it), and X1 ends with the removed pages.
    tail_dropped: bool,
    /// X is writable and holds bytes before `.hip_fatbin`: they stay in a
    /// writable segment of their own (W1) ahead of X1, which is read-only.
    w1: bool,
    /// The removed pages' range is left unmapped rather than X1's tail.
    detach: bool,
    /// The payload goes into a new read-only segment after every other one
    /// (the section is in the middle of a writable segment).
    at_end: bool,
    /// X1 has nothing to hold (the payload at the end, the section at X's
    /// start): it is left out, and the section's range unmapped.
    no_x1: bool,
    /// Program headers the table would gain (X2, W1).
    grow: usize,
    /// End of the program header table in the file, before it grows and
    /// after.
    old_table_end: u64,
    new_table_end: u64,
}

impl Removal {
    /// The removal from X; `separate`: X1 is split off a writable X as a
    /// read-only segment (the section must start on a page boundary).
    fn of(input: &Input, separate: bool, detach: bool) -> Result<Removal, TransformError> {
        let (f, x, unit) = (input.fatbin, input.x, input.unit);
        if separate && !f.addr.is_multiple_of(unit) {
            return Err(TransformError::FatbinWritable {
                why: "and does not start on a page boundary",
            });
        }
        // Removing pages from the middle of X splits it in two: one more
        // program header, which needs room after the table.
        let cut_addr_end = (f.end() / unit) * unit;
        let cut_end_if_split = f.offset + cut_addr_end.saturating_sub(f.addr);
        let x_file_end = x.p_offset(LE) + x.p_filesz(LE);
        let goes_on = x_file_end > cut_end_if_split;
        let x2 = goes_on && holds_sections(input, cut_addr_end);
        let at_end = separate && x2;
        let w1 = separate && !at_end && f.addr > x.p_vaddr(LE);
        let no_x1 = at_end && f.addr == x.p_vaddr(LE);
        let grow = usize::from(x2) + usize::from(w1) + usize::from(at_end) - usize::from(no_x1);
        let phnum = input.elf.phdrs().len();
        Ok(Removal {
            cut_addr_end,
            cut_end_if_split,
            x2,
            tail_dropped: goes_on && !x2,
            w1,
            detach,
            at_end,
            no_x1,
            grow,
            old_table_end: table_end(input, phnum),
            new_table_end: table_end(input, phnum + grow),
        })
    }
}

/// The moved block (if any) placed right after the payload (`meta_len`
/// bytes at the start of `f`), as aligned as it was, and how many bytes of
/// `f` the payload and the block take.
fn block_after_payload(
    f: Fatbin,
    block: Option<BlockMove>,
    meta_len: u64,
) -> (Option<BlockMove>, u64) {
    match block {
        Some(bl) => {
            let a = align_up(f.addr + meta_len, bl.align) + bl.start_addr % bl.align;
            (
                Some(place_block(bl, a, f.addr, f.offset)),
                a + bl.len() - f.addr,
            )
        }
        None => (None, meta_len),
    }
}

/// Where N (see [`Plan::at_end`]) goes: on the first unit boundary after
/// every segment in memory, and after everything the output file keeps of
/// the input (the section header table, which is written anew, aside).
fn end_of_image(input: &Input, r: &Removal) -> Fatbin {
    let elf = &input.elf;
    let mem_end = elf
        .phdrs()
        .iter()
        .filter(|p| p.is_load())
        .map(|p| p.p_vaddr(LE) + p.p_memsz(LE))
        .max()
        .unwrap_or(0);
    let f = input.fatbin;
    let removed = r.cut_end_if_split - f.offset;
    let file_end = body_end(elf, r.cut_end_if_split) - removed;
    Fatbin {
        index: f.index,
        addr: align_up(mem_end, input.unit),
        offset: align_up(file_end, input.unit),
        size: 0,
    }
}

/// Where the bytes the output keeps of the input end: before the section
/// header table when it ends the file after `cut_end` (a new one is
/// written), else at the end of the file.
pub(super) fn body_end(elf: &ElfView, cut_end: u64) -> u64 {
    let (shoff, len) = (elf.header().e_shoff(LE), elf.bytes().len() as u64);
    let old_sh_end = shoff + (elf.shdrs().len() * crate::elf::SHDR_SIZE) as u64;
    if old_sh_end == len && shoff >= cut_end {
        shoff
    } else {
        len
    }
}

/// The bytes of `.hip_fatbin` kept at its start (the first `kept_len` and
/// up to a unit boundary), whether X is split, and the cut: the whole
/// pages after the kept ones, or nothing when there are none (the
/// `meta_len` bytes of payload must then fit the section).
fn kept_and_cut(
    input: &Input,
    r: &Removal,
    kept_len: u64,
    meta_len: u64,
) -> Result<(u64, bool, Cut), TransformError> {
    let (f, unit) = (input.fatbin, input.unit);
    // Keep up to the first unit boundary after the metadata (and the moved
    // block): the removed range then starts and ends on unit boundaries,
    // so later segments stay congruent whatever the section's alignment
    // (GNU ld on AArch64 aligns segments to 64 KiB, sections to 4 KiB).
    let keep = align_up(f.addr + kept_len, unit) - f.addr;
    let split = r.cut_addr_end > f.addr + keep;
    let cut = if split {
        Cut::removing(f.offset + keep, r.cut_end_if_split)
    } else if meta_len > f.size {
        return Err(TransformError::NoRoom {
            size: f.size,
            need: meta_len,
        });
    } else {
        Cut::removing(f.offset + f.size, f.offset + f.size)
    };
    Ok((keep, split, cut))
}

/// What the wrappers become, and where symbols at bundle starts go: HIPK
/// at the metadata (offload), or HIPF at their pruned bundles.
type WrapperPlan = (Form, Vec<WrapperOut>, Vec<(u64, u64)>);

fn wrappers_for(
    input: &Input,
    request: &Request,
    payload_addr: u64,
) -> Result<WrapperPlan, TransformError> {
    let f = input.fatbin;
    let w = &input.wrappers;
    match request {
        Request::Offload { .. } => {
            let out = w.changes.iter().map(|c| WrapperOut {
                magic: HIPK_MAGIC,
                pointer: payload_addr,
                reserved1: Some(u64::from(c.co_index)),
            });
            Ok((Form::Offloaded, out.collect(), Vec::new()))
        }
        Request::Prune { starts, .. } => {
            let moved = |old: u64| starts.iter().find(|&&(o, _)| o == old).map(|&(_, n)| n);
            let mut out = Vec::with_capacity(w.targets.len());
            for (c, &target) in w.changes.iter().zip(&w.targets) {
                let new = moved(target).ok_or(WrapperError::PointerNotAtBundle {
                    index: c.index,
                    pointer: Address::Virtual(f.addr + target),
                    section: FATBIN_SECTION,
                    start: f.addr,
                    end: f.end(),
                })?;
                out.push(WrapperOut {
                    magic: HIPF_MAGIC,
                    pointer: f.addr + new,
                    reserved1: None,
                });
            }
            let map = starts.iter().map(|&(o, n)| (f.addr + o, f.addr + n));
            Ok((Form::Pruned, out, map.collect()))
        }
        Request::Restore { .. } => Err(TransformError::NotRestorable(
            "restore plans with plan_restore".into(),
        )),
    }
}

/// The output ranges to zero: what is left in the file of the section's
/// bytes (the kept pages, before the payload goes there, and the partial
/// last page after the removed ones).
fn cleared(input: &Input, plan: &Plan) -> Vec<(u64, u64)> {
    let (f, cut) = (input.fatbin, plan.cut);
    let mut zero = vec![(f.offset, cut.start)];
    if cut.removed > 0 {
        let f_file_end = plan
            .map_off(f.offset + f.size)
            .expect("end of section maps");
        zero.push((cut.end - cut.removed, f_file_end));
    }
    zero
}
