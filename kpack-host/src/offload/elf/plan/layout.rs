//! The output's program and section headers: the segment holding
//! `.hip_fatbin` split around the removed pages, the payload's segment, and
//! `.hip_fatbin` as PROGBITS or NOBITS.

use super::*;

/// The new program header table: X split in two (or shortened), `PT_PHDR`
/// resized, segments in the moved block moved, later offsets shifted.
pub(super) fn segments(
    input: &Input,
    plan: &Plan,
    r: &Removal,
) -> Result<Vec<ProgramHeader>, TransformError> {
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
pub(super) fn payload_segment(plan: &Plan, len: u64, unit: u64) -> ProgramHeader {
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
pub(super) fn split_x(input: &Input, plan: &Plan, r: &Removal) -> Vec<ProgramHeader> {
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
pub(super) fn part_from(x: &ProgramHeader, addr: u64) -> ProgramHeader {
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
pub(super) fn holds_sections(input: &Input, from: u64) -> bool {
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
pub(super) fn holds(elf: &ElfView, start: u64, end: u64, flag: u32) -> bool {
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
pub(super) fn progbits_fatbin(plan: &Plan, mut t: SectionHeader) -> SectionHeader {
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
pub(super) fn nobits_fatbin(input: &Input, plan: &Plan, mut t: SectionHeader) -> SectionHeader {
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
