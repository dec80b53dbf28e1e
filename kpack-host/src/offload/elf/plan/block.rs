//! The block of sections that moves out of the way when the program
//! header table grows: which sections, where they go, the notes among
//! them, and the relocations that must not reach them.

use super::*;

/// The block to move, taken larger than the table's growth needs when
/// that makes room to keep its notes right after the table (see
/// [`NotePlace`]); if no larger block can move, the notes move with it.
pub(super) fn block_with_room_for_notes(
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
pub(super) fn notes_in(elf: &ElfView, bl: &BlockMove) -> Vec<usize> {
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
pub(super) fn place_notes(elf: &ElfView, bl: &BlockMove, table_end: u64) -> Vec<NotePlace> {
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
pub(super) fn overlaps_another(elf: &ElfView, i: usize) -> bool {
    let s = &elf.shdrs()[i];
    let (start, end) = (s.sh_offset(LE), s.sh_offset(LE) + file_size(s));
    sections_overlapping(elf, start, end)
        .into_iter()
        .any(|j| j != i)
}

/// `bl` moved to address `new_addr` in the kept pages of the section at
/// `f_addr` (file offset `f_off`).
pub(super) fn place_block(mut bl: BlockMove, new_addr: u64, f_addr: u64, f_off: u64) -> BlockMove {
    bl.addr_delta = new_addr.wrapping_sub(bl.start_addr);
    bl.off_delta = (new_addr - f_addr + f_off).wrapping_sub(bl.start_off);
    bl
}

/// Section types that hold nothing code refers to by address, so that they
/// can move when the dynamic section, program headers and symbols follow.
pub(super) fn movable(elf: &ElfView, i: usize) -> bool {
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
pub(super) fn sections_overlapping(elf: &ElfView, start: u64, end: u64) -> Vec<usize> {
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
pub(super) fn block_to_move(
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
pub(super) fn close_block(elf: &ElfView, start: u64, mut end: u64) -> u64 {
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
pub(super) fn check_movable(
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
pub(super) fn check_block_relocations(input: &Input, plan: &Plan) -> Result<(), TransformError> {
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
