//! The plan of restore: the removed pages put back into the file, the
//! bundles placed in the range the device code had, the wrappers HIPF
//! again, the split segment joined.

use super::*;

/// The bytes of X1's zero-filled tail that restore puts back into the
/// file for bundles ending at `bundles_end`: all of them when the bundles
/// reach past X1 (X1 and X2 then become one segment again), else whole
/// pages up to the bundles' end (X1 keeps the rest of its zero-filled
/// tail, X2 stays a segment of its own).
pub(super) fn pages_back(input: &Input, bundles_end: u64) -> u64 {
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
pub(super) fn restored_wrappers(
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
pub(super) fn place_in_hole(hole: &Hole, align: u64, need: u64) -> Result<u64, TransformError> {
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
pub(super) fn pages_put_back(input: &Input, hole: &Hole, bundles_end: u64) -> (Cut, Option<usize>) {
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
pub(super) fn joined_segments(
    input: &Input,
    plan: &Plan,
) -> Result<Vec<ProgramHeader>, TransformError> {
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
