//! Step 3 of the transform: produce the output bytes from the input and the
//! plan. Every write is bounds-checked against the output, so that headers
//! the checks of step 1 could not foresee give an error, never a panic.

use object::elf;
use object::read::elf::{FileHeader as _, SectionHeader as _};

use super::analyze::Input;
use super::plan::{align_up, body_end, metadata_header, sections, Form, Plan};
use super::{Payload, TransformError};
use crate::bytes::{put_u16, put_u32, put_u64, u16_at, u64_at};
use crate::elf::{
    file_size, ElfError, SectionHeader, DYN_SIZE, LE, METADATA_SECTION, PHDR_SIZE, RELA_SIZE,
    SHDR_SIZE, SYM_SIZE, WRAPPER_SECTION,
};
use crate::hipk::WRAPPER_SIZE;
use crate::image::{Image, OutOfRange};

/// `DT_RELR` (packed relative relocations; not in `object` 0.36).
const DT_RELR: u32 = 36;

/// `d_tag`s whose value is an address.
const DT_ADDRESS_TAGS: [u32; 18] = [
    elf::DT_PLTGOT,
    elf::DT_HASH,
    elf::DT_STRTAB,
    elf::DT_SYMTAB,
    elf::DT_RELA,
    elf::DT_INIT,
    elf::DT_FINI,
    elf::DT_REL,
    elf::DT_JMPREL,
    elf::DT_INIT_ARRAY,
    elf::DT_FINI_ARRAY,
    elf::DT_PREINIT_ARRAY,
    elf::DT_SYMTAB_SHNDX,
    DT_RELR,
    elf::DT_GNU_HASH,
    elf::DT_VERSYM,
    elf::DT_VERDEF,
    elf::DT_VERNEED,
];

/// The whole output file, as pieces of the input and new bytes;
/// `payload` is the request's payload (metadata or bundles).
pub fn output<'a>(
    input: &Input<'a>,
    plan: &Plan,
    payload: &Payload,
) -> Result<Image<'a>, TransformError> {
    let mut out = body(input, plan)?;
    if let Some(len) = plan.at_end {
        // N, after the rest: the payload and the moved block go there.
        out.resize(plan.payload_off + len);
    }
    write_wrappers(&mut out, input, plan)?;
    move_block(&mut out, plan)?;
    write_phdrs(&mut out, input, plan, payload)?;
    fix_dynamic(&mut out, input, plan)?;
    let (mut shdrs, moved) = sections(input, plan)?;
    append_section_table(&mut out, input, plan, &mut shdrs)?;
    fix_symbols(&mut out, input, plan, &shdrs, &moved)?;
    write_file_header(&mut out, input, plan, shdrs.len())?;
    Ok(out)
}

/// The error for a range the input's headers put outside the output.
fn outside(what: &str) -> impl FnOnce(OutOfRange) -> TransformError + '_ {
    move |r| {
        ElfError::Malformed(format!(
            "{what} at file offset {:#x} lies outside the file",
            r.at
        ))
        .into()
    }
}

/// The `N` bytes of the output at `at`.
fn read_array<const N: usize>(out: &Image, at: u64, what: &str) -> Result<[u8; N], TransformError> {
    let mut b = [0u8; N];
    out.read_into(at, &mut b).map_err(outside(what))?;
    Ok(b)
}

/// Everything but the removed pages (or with the restored pages put back,
/// zero-filled), without the old section header table when it ends the file
/// (a new one is appended), and with the plan's ranges zeroed: no bundle or
/// metadata byte stays where it no longer belongs.
fn body<'a>(input: &Input<'a>, plan: &Plan) -> Result<Image<'a>, TransformError> {
    let (elf, b, cut) = (&input.elf, input.elf.bytes(), plan.cut);
    let body_end = body_end(elf, cut.end);
    for (i, sh) in elf.shdrs().iter().enumerate().skip(1) {
        if file_size(sh) > 0 && sh.sh_offset(LE) + sh.sh_size(LE) > body_end {
            return Err(ElfError::BadSection {
                name: elf.section_name(i)?,
                problem: "overlaps the section header table".into(),
            }
            .into());
        }
    }
    let table_end = elf.header().e_phoff(LE) + (plan.phdrs.len() * PHDR_SIZE) as u64;
    if table_end > cut.start {
        return Err(ElfError::Malformed(
            "the program header table lies in .hip_fatbin's removed pages".into(),
        )
        .into());
    }
    let mut out = Image::new(b);
    out.push_input(0..cut.start)
        .map_err(outside("the kept bytes"))?;
    out.push_zeros(cut.inserted);
    out.push_input(cut.end..body_end)
        .map_err(outside("the bytes after the cut"))?;
    for &(start, end) in &plan.zero {
        if end > start {
            out.fill_zero(start..end)
                .map_err(outside("cleared range"))?;
        }
    }
    Ok(out)
}

/// Each wrapper gets its new magic, pointer (HIPK: the metadata; HIPF: its
/// bundle) and `reserved1`; the relocation that sets its pointer becomes
/// RELATIVE to the new value.
fn write_wrappers(out: &mut Image, input: &Input, plan: &Plan) -> Result<(), TransformError> {
    let w = &input.wrappers;
    for ((&off, new), rela) in w.offsets.iter().zip(&plan.wrappers).zip(&w.relas) {
        let at = plan.map_off(off).ok_or(TransformError::SectionInRemoved {
            name: WRAPPER_SECTION.into(),
        })?;
        let mut record: [u8; WRAPPER_SIZE] = read_array(out, at, "wrapper")?;
        put_u32(&mut record, 0, new.magic);
        put_u64(&mut record, 8, new.pointer);
        if let Some(r1) = new.reserved1 {
            put_u64(&mut record, 16, r1);
        }
        out.write(at, &record).map_err(outside("wrapper"))?;
        let Some(ri) = *rela else {
            continue;
        };
        let mut r = input
            .relocs
            .rela(&input.elf, ri)
            .ok_or_else(|| ElfError::Malformed(format!("no relocation {ri}")))?;
        r.r_type = input.kinds.relative;
        r.r_sym = 0;
        r.r_addend = new.pointer as i64;
        let at = plan
            .map_off(r.entry_offset)
            .ok_or(TransformError::SectionInRemoved {
                name: ".rela.dyn".into(),
            })?;
        let rela = r.to_rela();
        let entry = object::pod::bytes_of(&rela);
        debug_assert_eq!(entry.len(), RELA_SIZE);
        out.write(at, entry).map_err(outside("relocation"))?;
    }
    Ok(())
}

/// Move the block into the kept pages and clear its old place (the grown
/// program header table is written over it); its notes go back right after
/// the table.
fn move_block(out: &mut Image, plan: &Plan) -> Result<(), TransformError> {
    let Some(bl) = plan.block else {
        return Ok(());
    };
    let from = bl.start_off..bl.start_off + bl.len();
    let to = from.start.wrapping_add(bl.off_delta);
    out.copy_within(from.clone(), to)
        .map_err(outside("the moved block"))?;
    out.fill_zero(plan.old_table_end..from.end)
        .map_err(outside("the moved block"))?;
    for n in &plan.notes {
        out.write_input(n.new_off, n.off..n.off + n.size)
            .map_err(outside("a note"))?;
        // Nothing of it stays in the block's copy.
        let copy = n.off.wrapping_add(bl.off_delta);
        out.fill_zero(copy..copy + n.size)
            .map_err(outside("a note"))?;
    }
    Ok(())
}

/// The new program header table in place, and the payload.
fn write_phdrs(
    out: &mut Image,
    input: &Input,
    plan: &Plan,
    payload: &Payload,
) -> Result<(), TransformError> {
    let phoff = input.elf.header().e_phoff(LE);
    let table: Vec<u8> = plan
        .phdrs
        .iter()
        .flat_map(|p| object::pod::bytes_of(p).iter().copied())
        .collect();
    out.write(phoff, &table)
        .map_err(outside("program header"))?;
    let at = plan.payload_off;
    match payload {
        Payload::Bytes(b) => out.write(at, b),
        Payload::File(file, len) => out.write_file(at, file.clone(), 0, *len),
    }
    .map_err(outside("payload"))
}

/// Dynamic entries that point into the moved block follow it.
fn fix_dynamic(out: &mut Image, input: &Input, plan: &Plan) -> Result<(), TransformError> {
    if plan.block.is_none() {
        return Ok(());
    }
    let elf = &input.elf;
    for (i, s) in elf.shdrs().iter().enumerate() {
        if s.sh_type(LE) != elf::SHT_DYNAMIC {
            continue;
        }
        let base = plan
            .map_off(s.sh_offset(LE))
            .ok_or(TransformError::SectionInRemoved {
                name: elf.section_name(i)?,
            })?;
        for k in 0..s.sh_size(LE) / DYN_SIZE as u64 {
            let at = base + k * DYN_SIZE as u64;
            let mut entry: [u8; DYN_SIZE] = read_array(out, at, ".dynamic entry")?;
            let tag = u64_at(&entry, 0).expect("16 bytes");
            let val = u64_at(&entry, 8).expect("16 bytes");
            let address_tag = u32::try_from(tag).is_ok_and(|t| DT_ADDRESS_TAGS.contains(&t));
            if address_tag && plan.in_block(val) {
                put_u64(&mut entry, 8, plan.moved_addr(val));
                out.write(at, &entry).map_err(outside(".dynamic entry"))?;
            }
        }
    }
    Ok(())
}

/// The section header table at the end of the file; for offload with the
/// metadata's header last and, before the table, a new `.shstrtab` that
/// has its name.
fn append_section_table(
    out: &mut Image,
    input: &Input,
    plan: &Plan,
    shdrs: &mut Vec<SectionHeader>,
) -> Result<(), TransformError> {
    if plan.form == Form::Offloaded {
        append_metadata_header(out, input, plan, shdrs)?;
    }
    out.resize(align_up(out.len(), 8));
    let table: Vec<u8> = shdrs
        .iter()
        .flat_map(|s| object::pod::bytes_of(s).iter().copied())
        .collect();
    out.push_bytes(table);
    Ok(())
}

/// A new `.shstrtab` with the metadata section's name, and the metadata's
/// header appended to `shdrs`.
fn append_metadata_header(
    out: &mut Image,
    input: &Input,
    plan: &Plan,
    shdrs: &mut Vec<SectionHeader>,
) -> Result<(), TransformError> {
    let elf = &input.elf;
    let stri = usize::from(elf.header().e_shstrndx(LE));
    let old_str = elf
        .shdrs()
        .get(stri)
        .ok_or(ElfError::Malformed("no section name table".into()))?;
    let (str_off, str_size) = (old_str.sh_offset(LE), old_str.sh_size(LE));
    let strtab = usize::try_from(str_off)
        .ok()
        .and_then(|o| elf.bytes().get(o..o.checked_add(str_size as usize)?))
        .ok_or(ElfError::Malformed(
            "section name table outside the file".into(),
        ))?;
    let name_off = (strtab.len()) as u32;
    let new_str_off = out.len();
    let mut names = Vec::with_capacity(strtab.len() + METADATA_SECTION.len() + 1);
    names.extend_from_slice(strtab);
    names.extend_from_slice(METADATA_SECTION.as_bytes());
    names.push(0);
    let new_str_size = names.len() as u64;
    out.push_bytes(names);
    shdrs[stri].sh_offset.set(LE, new_str_off);
    shdrs[stri].sh_size.set(LE, new_str_size);
    shdrs.push(metadata_header(name_off, plan));
    Ok(())
}

/// Symbols in moved sections follow them; those in the section's range
/// follow its payload (see [`symbol_target`]).
fn fix_symbols(
    out: &mut Image,
    input: &Input,
    plan: &Plan,
    shdrs: &[SectionHeader],
    moved: &[usize],
) -> Result<(), TransformError> {
    let elf = &input.elf;
    for (i, s) in elf.shdrs().iter().enumerate() {
        let t = s.sh_type(LE);
        if t != elf::SHT_SYMTAB && t != elf::SHT_DYNSYM {
            continue;
        }
        let base = shdrs[i].sh_offset(LE);
        let n = s.sh_size(LE) / SYM_SIZE as u64;
        if base + n * SYM_SIZE as u64 > out.len() {
            return Err(ElfError::BadSection {
                name: elf.section_name(i)?,
                problem: "symbol table outside the file".into(),
            }
            .into());
        }
        let fix = |sym: &mut [u8]| fix_symbol(sym, input, plan, shdrs, moved);
        for_each_entry(out, base, n, SYM_SIZE, fix)?;
    }
    Ok(())
}

/// Symbols read a batch at a time: a symbol table is as long as the
/// binary has symbols, and only the few that change are written back.
const ENTRY_BATCH: u64 = 16 << 10;

/// Run `f` over each of the `n` entries of `size` bytes at `base` in the
/// output; the entries it changes (it returns true) are written back.
fn for_each_entry(
    out: &mut Image,
    base: u64,
    n: u64,
    size: usize,
    mut f: impl FnMut(&mut [u8]) -> Result<bool, TransformError>,
) -> Result<(), TransformError> {
    let mut first = 0;
    while first < n {
        let count = (n - first).min(ENTRY_BATCH);
        let at = base + first * size as u64;
        let mut batch = out
            .read(at, count * size as u64)
            .map_err(outside("symbol table"))?;
        for (k, entry) in batch.chunks_exact_mut(size).enumerate() {
            if f(entry)? {
                let entry_at = at + (k * size) as u64;
                out.write(entry_at, entry).map_err(outside("symbol"))?;
            }
        }
        first += count;
    }
    Ok(())
}

/// One symbol (its bytes): moved with its section or its payload; whether
/// it changed.
fn fix_symbol(
    sym: &mut [u8],
    input: &Input,
    plan: &Plan,
    shdrs: &[SectionHeader],
    moved: &[usize],
) -> Result<bool, TransformError> {
    let shndx = usize::from(u16_at(sym, 6).expect("a whole symbol"));
    let value = u64_at(sym, 8).expect("a whole symbol");
    if let Some((index, new)) = symbol_target(input, plan, shdrs, shndx, value)? {
        put_u16(sym, 6, index);
        put_u64(sym, 8, new);
        // A sized symbol (the new offload driver's `.fatbin_image`) fits
        // what it names now: the metadata, or the rest of the section.
        let size = u64_at(sym, 16).expect("a whole symbol");
        let room = (plan.payload_addr + plan.payload_len).saturating_sub(new);
        if size > room {
            put_u64(sym, 16, room);
        }
        Ok(true)
    } else if moved.contains(&shndx) {
        put_u64(sym, 8, value.wrapping_add(plan.section_addr_delta(shndx)));
        Ok(true)
    } else {
        Ok(false)
    }
}

/// The new section index and value of a symbol of section `shndx` at
/// `value`, when the transform moves it: offload points those that named
/// the section's kept part (`__hip_fatbin...`) at the metadata, what the
/// wrappers point at; prune moves those at a bundle's start with the
/// bundle (any other into the section's new range); restore points those
/// of the dropped metadata section at the bundles.
fn symbol_target(
    input: &Input,
    plan: &Plan,
    shdrs: &[SectionHeader],
    shndx: usize,
    value: u64,
) -> Result<Option<(u16, u64)>, TransformError> {
    let f = input.fatbin;
    let index =
        |i: usize| u16::try_from(i).map_err(|_| ElfError::Malformed("too many sections".into()));
    let (start, end) = (plan.payload_addr, plan.payload_addr + plan.payload_len);
    Ok(match plan.form {
        Form::Offloaded if shndx == f.index && plan.names_metadata(&f, value) => {
            Some((index(shdrs.len() - 1)?, plan.payload_addr))
        }
        Form::Pruned if shndx == f.index && (f.addr..=f.end()).contains(&value) => {
            let new = match plan.symbol_map.iter().find(|&&(old, _)| old == value) {
                Some(&(_, new)) => new,
                None if value == f.end() => end,
                None => start,
            };
            Some((index(f.index)?, new))
        }
        Form::Restored if shndx == shdrs.len() => Some((index(f.index)?, start)),
        Form::Restored if shndx == f.index && !(start..=end).contains(&value) => {
            Some((index(f.index)?, start))
        }
        _ => None,
    })
}

/// Section header table offset and counts in the file header.
fn write_file_header(
    out: &mut Image,
    input: &Input,
    plan: &Plan,
    shnum: usize,
) -> Result<(), TransformError> {
    let mut fh = *input.elf.header();
    let shoff = out.len() - (shnum * SHDR_SIZE) as u64;
    fh.e_shoff.set(LE, shoff);
    fh.e_shnum.set(
        LE,
        u16::try_from(shnum).map_err(|_| ElfError::Malformed("too many sections".into()))?,
    );
    fh.e_phnum.set(
        LE,
        u16::try_from(plan.phdrs.len())
            .map_err(|_| ElfError::Malformed("too many segments".into()))?,
    );
    out.write(0, object::pod::bytes_of(&fh))
        .map_err(outside("the file header"))
}
