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

/// The bytes of X1's zero-filled tail that restore puts back into the
/// file for bundles ending at `bundles_end`: all of them when the bundles
/// reach past X1 (X1 and X2 then become one segment again), else whole
/// pages up to the bundles' end (X1 keeps the rest of its zero-filled
/// tail, X2 stays a segment of its own).
fn pages_back(input: &Input, bundles_end: u64) -> u64 {
    let x = input.x;
    let hole_len = x.p_memsz(LE) - x.p_filesz(LE);
    let file_end = x.p_vaddr(LE) + x.p_filesz(LE);
    if bundles_end > x.p_vaddr(LE) + x.p_memsz(LE) {
        hole_len
    } else {
        align_up(bundles_end.saturating_sub(file_end), input.unit).min(hole_len)
    }
}

/// Each wrapper HIPF again, pointing at its code object's bundle (`starts`:
/// per code object index, its offset from `payload_addr`).
fn restored_wrappers(
    input: &Input,
    starts: &[(u32, u64)],
    payload_addr: u64,
) -> Result<Vec<WrapperOut>, TransformError> {
    let bundle_of = |co: u32| starts.iter().find(|&&(c, _)| c == co).map(|&(_, o)| o);
    input
        .wrappers
        .changes
        .iter()
        .map(|c| {
            let off = bundle_of(c.co_index).ok_or_else(|| {
                TransformError::NotRestorable(format!(
                    "no bundle for wrapper {}'s code object index {}",
                    c.index, c.co_index
                ))
            })?;
            Ok(WrapperOut {
                magic: HIPF_MAGIC,
                pointer: payload_addr + off,
                reserved1: Some(0),
            })
        })
        .collect()
}

/// Plan the output of restore: the zero-filled tail of X1 (the pages
/// offload removed) goes back into the file, X1 and the segment after it
/// become one again, and the bundles of `request` take the free range of
/// `hole`, each wrapper pointing at its code object's bundle.
pub(crate) fn plan_restore(
    input: &Input,
    hole: &Hole,
    request: &Request,
) -> Result<Plan, TransformError> {
    let Request::Restore {
        bundles,
        starts,
        align,
    } = request
    else {
        return Err(TransformError::NotRestorable(
            "not a restore request".into(),
        ));
    };
    let x = input.x;
    let align = (*align).clamp(1, input.unit);
    let need = bundles.len();
    let payload_addr = place_in_hole(hole, align, need)?;
    let (cut, joined) = pages_put_back(input, hole, payload_addr + need);
    let payload_off = x.p_offset(LE) + (payload_addr - x.p_vaddr(LE));
    let wrappers = restored_wrappers(input, starts, payload_addr)?;
    let mut plan = Plan {
        payload_addr,
        payload_off,
        payload_len: need,
        form: Form::Restored,
        wrappers,
        zero: vec![(hole.meta.offset, hole.meta.offset + hole.meta.size)],
        symbol_map: Vec::new(),
        joined,
        restores_gap: hole.gap,
        align,
        cut,
        split: false,
        keep: 0,
        cut_addr_end: x.p_vaddr(LE) + x.p_memsz(LE),
        old_table_end: table_end(input, input.elf.phdrs().len()),
        block: None,
        notes: Vec::new(),
        phdrs: Vec::new(),
        gap: false,
        at_end: None,
    };
    plan.phdrs = joined_segments(input, &plan)?;
    // The program header slot freed by joining X1 and X2.
    let new_end = table_end(input, plan.phdrs.len());
    plan.zero.push((new_end, plan.old_table_end));
    Ok(plan)
}

/// Where `need` bytes of bundles go in the free range of `hole`, at
/// `align`; an error when they do not fit.
fn place_in_hole(hole: &Hole, align: u64, need: u64) -> Result<u64, TransformError> {
    let payload_addr = align_up(hole.start, align);
    if payload_addr.checked_add(need).is_none_or(|e| e > hole.end) {
        return Err(TransformError::RangeTooSmall {
            need,
            have: hole.end.saturating_sub(payload_addr),
            start: payload_addr,
            end: hole.end,
        });
    }
    Ok(payload_addr)
}

/// The cut of restore: the pages of X1's zero-filled tail that go back
/// into the file at its end ([`pages_back`]), and X2 when they are all of
/// that tail (X1 and X2 then join).
fn pages_put_back(input: &Input, hole: &Hole, bundles_end: u64) -> (Cut, Option<usize>) {
    let x = input.x;
    let at = x.p_offset(LE) + x.p_filesz(LE);
    let hole_len = x.p_memsz(LE) - x.p_filesz(LE);
    let inserted = pages_back(input, bundles_end);
    let joined = if inserted == hole_len { hole.x2 } else { None };
    (Cut::inserting(at, inserted), joined)
}

/// The program headers of restore: X1 file-backed over the inserted pages
/// and, when they are all of its zero-filled tail, joined with X2 (one
/// segment again, with both parts' permissions), `PT_PHDR` resized, later
/// file offsets moved up by the inserted pages.
fn joined_segments(input: &Input, plan: &Plan) -> Result<Vec<ProgramHeader>, TransformError> {
    let phdrs = input.elf.phdrs();
    let n = phdrs.len() - usize::from(plan.joined.is_some());
    let mut out = Vec::with_capacity(n);
    for (i, p) in phdrs.iter().enumerate() {
        if Some(i) == plan.joined {
            continue;
        }
        // X1 with the gap after it as its tail, if offload left one.
        let p = if i == input.xi { &input.x } else { p };
        let mut q = *p;
        if i == input.xi {
            let mut end_mem = p.p_vaddr(LE) + p.p_memsz(LE);
            if let Some(x2) = plan.joined.map(|j| phdrs[j]) {
                end_mem = x2.p_vaddr(LE) + x2.p_memsz(LE);
                let end_file = x2.p_vaddr(LE) + x2.p_filesz(LE);
                q.p_filesz.set(LE, end_file - p.p_vaddr(LE));
                q.p_flags.set(LE, p.p_flags(LE) | x2.p_flags(LE));
            } else {
                q.p_filesz.set(LE, p.p_filesz(LE) + plan.cut.inserted);
            }
            q.p_memsz.set(LE, end_mem - p.p_vaddr(LE));
            if plan.restores_gap && plan.joined.is_none() {
                // What does not go back stays unmapped.
                q.p_memsz.set(LE, q.p_filesz(LE));
            }
        } else if p.p_type(LE) == elf::PT_PHDR {
            let table = (n * PHDR_SIZE) as u64;
            q.p_filesz.set(LE, table);
            q.p_memsz.set(LE, table);
        } else if p.p_offset(LE) >= plan.cut.start {
            q.p_offset.set(LE, p.p_offset(LE) + plan.cut.inserted);
        }
        out.push(q);
    }
    Ok(out)
}

/// The block to move, taken larger than the table's growth needs when
/// that makes room to keep its notes right after the table (see
/// [`NotePlace`]); if no larger block can move, the notes move with it.
fn block_with_room_for_notes(
    elf: &ElfView,
    old_end: u64,
    new_end: u64,
) -> Result<Option<BlockMove>, TransformError> {
    let Some(block) = block_to_move(elf, old_end, new_end)? else {
        return Ok(None);
    };
    let mut end = new_end;
    let mut candidate = block;
    for _ in 0..16 {
        let notes = place_notes(elf, &candidate, new_end);
        if !notes.is_empty() || notes_in(elf, &candidate).is_empty() {
            return Ok(Some(candidate));
        }
        // Vacate more: up to the end of the block, plus the notes' bytes.
        let need: u64 = notes_in(elf, &candidate)
            .iter()
            .map(|&i| elf.shdrs()[i].sh_size(LE) + elf.shdrs()[i].sh_addralign(LE).max(1))
            .sum();
        end = end.max(candidate.start_off + candidate.len()) + need;
        match block_to_move(elf, old_end, end) {
            Ok(Some(bigger)) if bigger.len() > candidate.len() => candidate = bigger,
            _ => break,
        }
    }
    Ok(Some(block))
}

/// The note sections (with file bytes) inside the block, in file order.
fn notes_in(elf: &ElfView, bl: &BlockMove) -> Vec<usize> {
    let mut notes: Vec<usize> = (1..elf.shdrs().len())
        .filter(|&i| {
            let s = &elf.shdrs()[i];
            s.sh_type(LE) == elf::SHT_NOTE
                && file_size(s) > 0
                && (bl.start_off..bl.start_off + bl.len()).contains(&s.sh_offset(LE))
        })
        .collect();
    notes.sort_by_key(|&i| elf.shdrs()[i].sh_offset(LE));
    notes
}

/// The note sections of the block, in address order, packed from
/// `table_end` (each at its alignment, with the block's address-to-offset
/// difference); none if they do not all fit inside the block's old range.
fn place_notes(elf: &ElfView, bl: &BlockMove, table_end: u64) -> Vec<NotePlace> {
    let notes = notes_in(elf, bl);
    // A note that overlaps another section cannot go its own way: that
    // section's bytes would be copied with the note's, and the section's
    // own (rewritten) copy moved with the block.
    if notes.iter().any(|&i| overlaps_another(elf, i)) {
        return Vec::new();
    }
    let bias = bl.start_addr.wrapping_sub(bl.start_off);
    let mut pos = table_end;
    let mut placed = Vec::with_capacity(notes.len());
    for i in notes {
        let s = &elf.shdrs()[i];
        pos = align_up(pos, s.sh_addralign(LE).max(1));
        placed.push(NotePlace {
            index: i,
            addr: s.sh_addr(LE),
            off: s.sh_offset(LE),
            size: s.sh_size(LE),
            new_addr: pos.wrapping_add(bias),
            new_off: pos,
        });
        pos += s.sh_size(LE);
    }
    if pos > bl.start_off + bl.len() {
        return Vec::new();
    }
    placed
}

/// Whether section `i`'s file bytes overlap another section's.
fn overlaps_another(elf: &ElfView, i: usize) -> bool {
    let s = &elf.shdrs()[i];
    let (start, end) = (s.sh_offset(LE), s.sh_offset(LE) + file_size(s));
    sections_overlapping(elf, start, end)
        .into_iter()
        .any(|j| j != i)
}

/// `bl` moved to address `new_addr` in the kept pages of the section at
/// `f_addr` (file offset `f_off`).
fn place_block(mut bl: BlockMove, new_addr: u64, f_addr: u64, f_off: u64) -> BlockMove {
    bl.addr_delta = new_addr.wrapping_sub(bl.start_addr);
    bl.off_delta = (new_addr - f_addr + f_off).wrapping_sub(bl.start_off);
    bl
}

/// Section types that hold nothing code refers to by address, so that they
/// can move when the dynamic section, program headers and symbols follow.
fn movable(elf: &ElfView, i: usize) -> bool {
    let t = elf.shdrs()[i].sh_type(LE);
    matches!(
        t,
        elf::SHT_NOTE
            | elf::SHT_DYNSYM
            | elf::SHT_STRTAB
            | elf::SHT_HASH
            | elf::SHT_GNU_HASH
            | elf::SHT_GNU_VERSYM
            | elf::SHT_GNU_VERNEED
            | elf::SHT_GNU_VERDEF
            | elf::SHT_RELA
            | elf::SHT_REL
            | elf::SHT_RELR
    ) || (t == elf::SHT_PROGBITS && elf.section_name(i).is_ok_and(|n| n == ".interp"))
}

/// Sections with bytes in the file (index 0 excluded) that overlap the
/// file range `[start, end)`.
fn sections_overlapping(elf: &ElfView, start: u64, end: u64) -> Vec<usize> {
    (1..elf.shdrs().len())
        .filter(|&i| {
            let s = &elf.shdrs()[i];
            file_size(s) > 0 && s.sh_offset(LE) < end && s.sh_offset(LE) + s.sh_size(LE) > start
        })
        .collect()
}

/// The sections a program header table growing from `old_end` to `new_end`
/// would overwrite, as one contiguous block (from the first to the last of
/// them, and whole segments such as `PT_NOTE` that start inside it).
fn block_to_move(
    elf: &ElfView,
    old_end: u64,
    new_end: u64,
) -> Result<Option<BlockMove>, TransformError> {
    let mut hit = sections_overlapping(elf, old_end, new_end);
    if hit.is_empty() {
        return Ok(None);
    }
    hit.sort_by_key(|&i| elf.shdrs()[i].sh_offset(LE));
    let first = elf.shdrs()[hit[0]];
    let start = first.sh_offset(LE);
    let end = hit
        .iter()
        .map(|&i| elf.shdrs()[i].sh_offset(LE) + elf.shdrs()[i].sh_size(LE))
        .max()
        .unwrap_or(0);
    let end = close_block(elf, start, end);
    let mut align = 8;
    let inside = sections_overlapping(elf, start, end);
    for &i in &inside {
        align = align.max(check_movable(elf, i, &first, end)?);
    }
    let block = BlockMove {
        start_addr: first.sh_addr(LE),
        end_addr: first.sh_addr(LE) + (end - start),
        start_off: start,
        align,
        addr_delta: 0,
        off_delta: 0,
    };
    // Sections move by address: none may have its address in the block
    // and its bytes elsewhere.
    let addrs = block.start_addr..block.end_addr;
    if let Some(i) = (1..elf.shdrs().len()).find(|i| {
        let s = &elf.shdrs()[*i];
        let alloc = s.sh_flags(LE) & u64::from(elf::SHF_ALLOC) != 0;
        alloc && file_size(s) > 0 && addrs.contains(&s.sh_addr(LE)) && !inside.contains(i)
    }) {
        return Err(TransformError::CannotGrowPhdrs {
            why: format!(
                "section {} is not laid out like its neighbours",
                elf.section_name(i)?
            ),
        });
    }
    Ok(Some(block))
}

/// Extend the block `[start, end)` until it holds whole segments that
/// start inside it and every section that starts inside it.
fn close_block(elf: &ElfView, start: u64, mut end: u64) -> u64 {
    loop {
        let seg_end = elf
            .phdrs()
            .iter()
            .filter(|p| {
                !p.is_load() && p.p_filesz(LE) > 0 && (start..end).contains(&p.p_offset(LE))
            })
            .map(|p| p.p_offset(LE) + p.p_filesz(LE))
            .max()
            .unwrap_or(0);
        let limit = end.max(seg_end);
        let sec_end = elf.shdrs()[1..]
            .iter()
            .filter(|s| file_size(s) > 0 && s.sh_offset(LE) < limit && s.sh_offset(LE) >= start)
            .map(|s| s.sh_offset(LE) + s.sh_size(LE))
            .max()
            .unwrap_or(0);
        let next = limit.max(sec_end);
        if next == end {
            return end;
        }
        end = next;
    }
}

/// Can section `i`, inside the block that starts with `first` and ends at
/// file offset `end`, move with it? Returns the alignment it needs.
fn check_movable(
    elf: &ElfView,
    i: usize,
    first: &SectionHeader,
    end: u64,
) -> Result<u64, TransformError> {
    let s = &elf.shdrs()[i];
    let name = elf.section_name(i)?;
    let refuse = |why: String| Err(TransformError::CannotGrowPhdrs { why });
    let (off, size) = (s.sh_offset(LE), s.sh_size(LE));
    if s.sh_flags(LE) & u64::from(elf::SHF_ALLOC) == 0 || !movable(elf, i) {
        return refuse(format!(
            "section {name} follows the program header table and cannot move"
        ));
    }
    if off < first.sh_offset(LE) || off + size > end {
        return refuse(format!("section {name} overlaps the block"));
    }
    if s.sh_addr(LE).wrapping_sub(first.sh_addr(LE)) != off - first.sh_offset(LE) {
        return refuse(format!(
            "section {name} is not laid out like its neighbours"
        ));
    }
    match s
        .sh_addralign(LE)
        .checked_next_power_of_two()
        .filter(|&a| a <= 1 << 30)
    {
        Some(a) => Ok(a),
        None => refuse(format!(
            "section {name} has an unsupported alignment {:#x}",
            s.sh_addralign(LE)
        )),
    }
}

/// No relocation may apply to, or point into, the moved block: code would
/// still find the old addresses.
fn check_block_relocations(input: &Input, plan: &Plan) -> Result<(), TransformError> {
    if plan.block.is_none() {
        return Ok(());
    }
    let refuse = |at: u64| TransformError::CannotGrowPhdrs {
        why: format!("relocation at {at:#x} refers to a section that must move"),
    };
    for r in input.relocs.relas(&input.elf) {
        let points_in = r.r_type == input.kinds.relative && plan.in_block(r.r_addend as u64);
        if plan.in_block(r.r_offset) || points_in {
            return Err(refuse(r.r_offset));
        }
    }
    // Packed relative relocations: the address is the word's own value.
    let elf = &input.elf;
    for a in input.relocs.relr(&input.elf) {
        let value = elf.relr_value(a);
        if plan.in_block(a) || value.is_some_and(|v| plan.in_block(v)) {
            return Err(refuse(a));
        }
    }
    Ok(())
}

/// The new program header table: X split in two (or shortened), `PT_PHDR`
/// resized, segments in the moved block moved, later offsets shifted.
fn segments(input: &Input, plan: &Plan, r: &Removal) -> Result<Vec<ProgramHeader>, TransformError> {
    let phdrs = input.elf.phdrs();
    let grow = r.grow;
    let mut out = Vec::with_capacity(phdrs.len() + grow);
    for (i, p) in phdrs.iter().enumerate() {
        if i == input.xi && plan.split {
            out.extend(split_x(input, plan, r));
            continue;
        }
        let mut q = *p;
        let (off, filesz) = (p.p_offset(LE), p.p_filesz(LE));
        let removed = plan.cut.removed;
        if p.p_type(LE) == elf::PT_PHDR {
            let table = ((phdrs.len() + if plan.split { grow } else { 0 }) * PHDR_SIZE) as u64;
            q.p_filesz.set(LE, table);
            q.p_memsz.set(LE, table);
        } else if !p.is_load() && filesz > 0 && plan.in_block_off(off) {
            // PT_INTERP, PT_NOTE: follow the moved sections.
            let delta = plan.moved_addr(p.p_vaddr(LE)).wrapping_sub(p.p_vaddr(LE));
            q.p_offset.set(LE, plan.moved_off(off));
            q.p_vaddr.set(LE, p.p_vaddr(LE).wrapping_add(delta));
            q.p_paddr.set(LE, p.p_paddr(LE).wrapping_add(delta));
        } else if removed > 0 && filesz > 0 {
            if off >= plan.cut.end {
                q.p_offset.set(LE, off - removed);
            } else if off + filesz > plan.cut.start {
                return Err(TransformError::SegmentSpansRemoved {
                    index: i,
                    p_type: p.p_type(LE),
                });
            }
        } else if removed > 0 && off >= plan.cut.end {
            q.p_offset.set(LE, off - removed);
        }
        out.push(q);
    }
    if let Some(len) = plan.at_end {
        let last_load = out.iter().rposition(|p| p.is_load()).map_or(0, |i| i + 1);
        out.insert(last_load, payload_segment(plan, len, input.unit));
    }
    Ok(out)
}

/// N: the payload's read-only segment after every other one.
fn payload_segment(plan: &Plan, len: u64, unit: u64) -> ProgramHeader {
    use object::{U32, U64};
    ProgramHeader {
        p_type: U32::new(LE, elf::PT_LOAD),
        p_flags: U32::new(LE, elf::PF_R),
        p_offset: U64::new(LE, plan.payload_off),
        p_vaddr: U64::new(LE, plan.payload_addr),
        p_paddr: U64::new(LE, plan.payload_addr),
        p_filesz: U64::new(LE, len),
        p_memsz: U64::new(LE, len),
        p_align: U64::new(LE, unit),
    }
}

/// W1 (a writable X's bytes before `.hip_fatbin`, when offload splits the
/// metadata's pages off), X1 (up to the end of the kept pages in the file,
/// in memory up to the end of the removed pages; read-only after W1) and,
/// when X goes on after the removed pages, X2. A part that holds no code is
/// not executable (GNU ld puts `.hip_fatbin` in the text segment; after the
/// split, one part may hold only data such as `.eh_frame`).
fn split_x(input: &Input, plan: &Plan, r: &Removal) -> Vec<ProgramHeader> {
    let (x, f) = (input.x, input.fatbin);
    let (x_off, x_vaddr) = (x.p_offset(LE), x.p_vaddr(LE));
    let mut parts = Vec::with_capacity(3);
    let mut x1 = x;
    if input.writable && plan.form == Form::Offloaded && plan.at_end.is_none() {
        if r.w1 {
            let mut w1 = x;
            w1.p_filesz.set(LE, f.offset - x_off);
            w1.p_memsz.set(LE, f.addr - x_vaddr);
            parts.push(w1);
        }
        x1 = part_from(&x, f.addr);
        x1.p_flags.set(LE, x.p_flags(LE) & !elf::PF_W);
    }
    x1.p_filesz.set(LE, plan.cut.start - x1.p_offset(LE));
    let x_end = x_vaddr + x.p_memsz(LE);
    let cut_addr_end = if r.x2 || r.tail_dropped {
        plan.cut_addr_end
    } else {
        x_end
    };
    x1.p_memsz.set(LE, cut_addr_end - x1.p_vaddr(LE));
    if r.detach {
        // The removed range: unmapped.
        x1.p_memsz.set(LE, x1.p_filesz(LE));
    }
    if !r.no_x1 {
        parts.push(x1);
    }
    if r.x2 {
        let mut x2 = part_from(&x, cut_addr_end);
        x2.p_offset.set(LE, plan.cut.end - plan.cut.removed);
        x2.p_filesz.set(LE, x_off + x.p_filesz(LE) - plan.cut.end);
        x2.p_memsz.set(LE, x_end - cut_addr_end);
        parts.push(x2);
    }
    // A part that holds no code is not executable, one that holds no
    // writable section not writable (eu-elflint checks both).
    for part in &mut parts {
        let (start, end) = (part.p_vaddr(LE), part.p_vaddr(LE) + part.p_memsz(LE));
        for (flag, section_flag) in [(elf::PF_X, elf::SHF_EXECINSTR), (elf::PF_W, elf::SHF_WRITE)] {
            if !holds(&input.elf, start, end, section_flag) {
                part.p_flags.set(LE, part.p_flags(LE) & !flag);
            }
        }
    }
    parts
}

/// The part of `x` from address `addr` on (its file offset following), to
/// its end.
fn part_from(x: &ProgramHeader, addr: u64) -> ProgramHeader {
    let delta = addr - x.p_vaddr(LE);
    let mut p = *x;
    p.p_offset.set(LE, x.p_offset(LE) + delta);
    p.p_vaddr.set(LE, addr);
    p.p_paddr.set(LE, x.p_paddr(LE).wrapping_add(delta));
    p.p_filesz.set(LE, x.p_filesz(LE).saturating_sub(delta));
    p.p_memsz.set(LE, x.p_memsz(LE) - delta);
    p
}

/// Does an allocated section other than `.hip_fatbin` lie in X from
/// address `from` on?
fn holds_sections(input: &Input, from: u64) -> bool {
    let x_end = input.x.p_vaddr(LE) + input.x.p_memsz(LE);
    input.elf.shdrs().iter().enumerate().skip(1).any(|(i, s)| {
        i != input.fatbin.index
            && s.sh_size(LE) > 0
            && s.sh_flags(LE) & u64::from(elf::SHF_ALLOC) != 0
            && s.sh_addr(LE) < x_end
            && s.sh_addr(LE) + s.sh_size(LE) > from
    })
}

/// Does an allocated section with `flag` lie in `[start, end)`?
fn holds(elf: &ElfView, start: u64, end: u64, flag: u32) -> bool {
    elf.shdrs().iter().any(|s| {
        let (addr, size) = (s.sh_addr(LE), s.sh_size(LE));
        let flags = s.sh_flags(LE);
        flags & u64::from(elf::SHF_ALLOC) != 0
            && flags & u64::from(flag) != 0
            && addr < end
            && addr + size > start
    })
}

/// The new section headers (without the metadata's, appended later):
/// `.hip_fatbin` NOBITS over what remains of it, moved sections at their
/// new places, later offsets shifted. Also returns the moved sections.
pub fn sections(
    input: &Input,
    plan: &Plan,
) -> Result<(Vec<SectionHeader>, Vec<usize>), TransformError> {
    let elf = &input.elf;
    let mut out = Vec::with_capacity(elf.shdrs().len() + 1);
    let mut moved = Vec::new();
    for (i, s) in elf.shdrs().iter().enumerate() {
        let mut t = *s;
        let fsz = file_size(s);
        let (off, removed) = (s.sh_offset(LE), plan.cut.removed);
        if i == input.fatbin.index {
            out.push(match plan.form {
                Form::Offloaded => nobits_fatbin(input, plan, t),
                Form::Pruned | Form::Restored => progbits_fatbin(plan, t),
            });
            continue;
        }
        let alloc = s.sh_flags(LE) & u64::from(elf::SHF_ALLOC) != 0;
        if i > 0 && alloc && fsz > 0 && plan.in_block(s.sh_addr(LE)) {
            t.sh_addr.set(LE, plan.moved_addr(s.sh_addr(LE)));
            t.sh_offset.set(LE, plan.moved_off(off));
            moved.push(i);
            out.push(t);
            continue;
        }
        if i > 0 && removed > 0 {
            if off >= plan.cut.end {
                t.sh_offset.set(LE, off - removed);
            } else if fsz > 0 && off + fsz > plan.cut.start {
                return Err(TransformError::SectionInRemoved {
                    name: elf.section_name(i)?,
                });
            } else if off > plan.cut.start {
                // An empty (or NOBITS) section placed among the removed
                // bytes: where they were, not past the shorter file's end.
                t.sh_offset.set(LE, plan.cut.start);
            }
        }
        if i > 0 && plan.cut.inserted > 0 && off >= plan.cut.start {
            t.sh_offset.set(LE, off + plan.cut.inserted);
        }
        out.push(t);
    }
    if plan.form == Form::Restored {
        // The metadata's header, the last (checked by analyze).
        out.pop();
    }
    Ok((out, moved))
}

/// `.hip_fatbin` as PROGBITS over the bundles of prune or restore.
fn progbits_fatbin(plan: &Plan, mut t: SectionHeader) -> SectionHeader {
    t.sh_type.set(LE, elf::SHT_PROGBITS);
    t.sh_addr.set(LE, plan.payload_addr);
    t.sh_offset.set(LE, plan.payload_off);
    t.sh_size.set(LE, plan.payload_len);
    if plan.form == Form::Restored {
        t.sh_addralign.set(LE, plan.align);
    }
    t
}

/// `.hip_fatbin` as NOBITS: from the end of the kept pages to the end of
/// the removed ones (the zeroed tail after them lies in X2), or, when
/// nothing is cut, after the metadata written over its start.
fn nobits_fatbin(input: &Input, plan: &Plan, mut t: SectionHeader) -> SectionHeader {
    let f = input.fatbin;
    t.sh_type.set(LE, elf::SHT_NOBITS);
    if plan.split {
        let addr = f.addr + plan.keep;
        let end = if plan.gap { addr } else { plan.cut_addr_end };
        t.sh_addr.set(LE, addr);
        t.sh_offset.set(LE, plan.cut.end - plan.cut.removed);
        t.sh_size.set(LE, end - addr);
    } else {
        let start = align_up(plan.payload_len, 16).min(f.size);
        t.sh_addr.set(LE, f.addr + start);
        t.sh_offset.set(LE, f.offset + start);
        t.sh_size.set(LE, f.size - start);
        t.sh_addralign.set(LE, t.sh_addralign(LE).min(16));
    }
    t
}
