//! Step 3 of the transform: produce the output bytes from the input and the
//! plan. Every write is bounds-checked against the output, so that headers
//! the checks of step 1 could not foresee give an error, never a panic.

use object::elf;
use object::read::elf::{FileHeader as _, SectionHeader as _};

use super::analyze::Input;
use super::plan::{align_up, sections, Form, Plan};
use super::TransformError;
use crate::bytes::{put_u16, put_u32, put_u64, u16_at, u64_at};
use crate::elf::{
    file_size, ElfError, SectionHeader, DYN_SIZE, LE, METADATA_SECTION, PHDR_SIZE, RELA_SIZE,
    SHDR_SIZE, SYM_SIZE, WRAPPER_SECTION,
};
use crate::hipk::WRAPPER_SIZE;

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

/// The whole output file; `payload` is the request's payload (metadata or
/// bundles).
pub fn output(input: &Input, plan: &Plan, payload: &[u8]) -> Result<Vec<u8>, TransformError> {
    let mut out = body(input, plan)?;
    write_wrappers(&mut out, input, plan)?;
    move_block(&mut out, input, plan);
    write_phdrs(&mut out, input, plan, payload)?;
    fix_dynamic(&mut out, input, plan)?;
    let (mut shdrs, moved) = sections(input, plan)?;
    append_section_table(&mut out, input, plan, &mut shdrs)?;
    fix_symbols(&mut out, input, plan, &shdrs, &moved)?;
    write_file_header(&mut out, input, plan, shdrs.len())?;
    Ok(out)
}

/// `len` bytes of the output at `at`, or an error if the input's headers
/// put them outside it.
fn region<'o>(
    out: &'o mut [u8],
    at: u64,
    len: usize,
    what: &str,
) -> Result<&'o mut [u8], TransformError> {
    let start = usize::try_from(at).ok();
    match start.and_then(|s| s.checked_add(len).map(|e| (s, e))) {
        Some((s, e)) if e <= out.len() => Ok(&mut out[s..e]),
        _ => Err(ElfError::Malformed(format!(
            "{what} at file offset {at:#x} lies outside the file"
        ))
        .into()),
    }
}

/// Everything but the removed pages (or with the restored pages put back,
/// zero-filled), without the old section header table when it ends the file
/// (a new one is appended), and with the plan's ranges zeroed: no bundle or
/// metadata byte stays where it no longer belongs.
fn body(input: &Input, plan: &Plan) -> Result<Vec<u8>, TransformError> {
    let (elf, b, cut) = (&input.elf, input.elf.bytes(), plan.cut);
    let (shoff, len) = (elf.header().e_shoff(LE), b.len() as u64);
    let old_sh_end = shoff + (elf.shdrs().len() * SHDR_SIZE) as u64;
    let body_end = if old_sh_end == len && shoff >= cut.end {
        shoff
    } else {
        len
    };
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
    let len = body_end - cut.removed + cut.inserted;
    let mut out = Vec::with_capacity(len as usize + 4096);
    out.extend_from_slice(&b[..cut.start as usize]);
    out.resize(out.len() + cut.inserted as usize, 0);
    out.extend_from_slice(&b[cut.end as usize..body_end as usize]);
    for &(start, end) in &plan.zero {
        if end > start {
            region(&mut out, start, (end - start) as usize, "cleared range")?.fill(0);
        }
    }
    Ok(out)
}

/// Each wrapper gets its new magic, pointer (HIPK: the metadata; HIPF: its
/// bundle) and `reserved1`; the relocation that sets its pointer becomes
/// RELATIVE to the new value.
fn write_wrappers(out: &mut [u8], input: &Input, plan: &Plan) -> Result<(), TransformError> {
    let w = &input.wrappers;
    for ((&off, new), rela) in w.offsets.iter().zip(&plan.wrappers).zip(&w.relas) {
        let at = plan.map_off(off).ok_or(TransformError::SectionInRemoved {
            name: WRAPPER_SECTION.into(),
        })?;
        region(out, at, WRAPPER_SIZE, "wrapper")?;
        let at = at as usize;
        put_u32(out, at, new.magic);
        put_u64(out, at + 8, new.pointer);
        if let Some(r1) = new.reserved1 {
            put_u64(out, at + 16, r1);
        }
        let Some(ri) = *rela else {
            continue;
        };
        let mut r = input.relocs.relas[ri];
        r.r_type = input.kinds.relative;
        r.r_sym = 0;
        r.r_addend = new.pointer as i64;
        let at = plan
            .map_off(r.entry_offset)
            .ok_or(TransformError::SectionInRemoved {
                name: ".rela.dyn".into(),
            })?;
        region(out, at, RELA_SIZE, "relocation")?
            .copy_from_slice(object::pod::bytes_of(&r.to_rela()));
    }
    Ok(())
}

/// Move the block into the kept pages and clear its old place (the grown
/// program header table is written over it); its notes go back right after
/// the table.
fn move_block(out: &mut [u8], input: &Input, plan: &Plan) {
    if let Some(bl) = plan.block {
        let from = bl.start_off as usize..(bl.start_off + bl.len()) as usize;
        let to = from.start.wrapping_add(bl.off_delta as usize);
        out.copy_within(from.clone(), to);
        out[plan.old_table_end as usize..from.end].fill(0);
        for n in &plan.notes {
            let (src, dst) = (n.off as usize, n.new_off as usize);
            let len = n.size as usize;
            out[dst..dst + len].copy_from_slice(&input.elf.bytes()[src..src + len]);
            // Nothing of it stays in the block's copy.
            let copy = src.wrapping_add(bl.off_delta as usize);
            out[copy..copy + len].fill(0);
        }
    }
}

/// The new program header table in place, and the payload.
fn write_phdrs(
    out: &mut [u8],
    input: &Input,
    plan: &Plan,
    payload: &[u8],
) -> Result<(), TransformError> {
    let phoff = input.elf.header().e_phoff(LE);
    for (k, p) in plan.phdrs.iter().enumerate() {
        let at = phoff + (k * PHDR_SIZE) as u64;
        region(out, at, PHDR_SIZE, "program header")?.copy_from_slice(object::pod::bytes_of(p));
    }
    region(out, plan.payload_off, payload.len(), "payload")?.copy_from_slice(payload);
    Ok(())
}

/// Dynamic entries that point into the moved block follow it.
fn fix_dynamic(out: &mut [u8], input: &Input, plan: &Plan) -> Result<(), TransformError> {
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
            let entry = region(out, at, DYN_SIZE, ".dynamic entry")?;
            let tag = u64_at(entry, 0).expect("16 bytes");
            let val = u64_at(entry, 8).expect("16 bytes");
            let address_tag = u32::try_from(tag).is_ok_and(|t| DT_ADDRESS_TAGS.contains(&t));
            if address_tag && plan.in_block(val) {
                put_u64(entry, 8, plan.moved_addr(val));
            }
        }
    }
    Ok(())
}

/// The section header table at the end of the file; for offload with the
/// metadata's header last and, before the table, a new `.shstrtab` that
/// has its name.
fn append_section_table(
    out: &mut Vec<u8>,
    input: &Input,
    plan: &Plan,
    shdrs: &mut Vec<SectionHeader>,
) -> Result<(), TransformError> {
    if plan.form == Form::Offloaded {
        append_metadata_header(out, input, plan, shdrs)?;
    }
    out.resize(align_up(out.len() as u64, 8) as usize, 0);
    for s in shdrs.iter() {
        out.extend_from_slice(object::pod::bytes_of(s));
    }
    Ok(())
}

/// A new `.shstrtab` with the metadata section's name, and the metadata's
/// header appended to `shdrs`.
fn append_metadata_header(
    out: &mut Vec<u8>,
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
    let new_str_off = out.len() as u64;
    out.extend_from_slice(strtab);
    out.extend_from_slice(METADATA_SECTION.as_bytes());
    out.push(0);
    let new_str_size = out.len() as u64 - new_str_off;
    shdrs[stri].sh_offset.set(LE, new_str_off);
    shdrs[stri].sh_size.set(LE, new_str_size);
    shdrs.push(metadata_header(name_off, plan));
    Ok(())
}

fn metadata_header(name_off: u32, plan: &Plan) -> SectionHeader {
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

/// Symbols in moved sections follow them; those in the section's range
/// follow its payload (see [`symbol_target`]).
fn fix_symbols(
    out: &mut [u8],
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
        if base + n * SYM_SIZE as u64 > out.len() as u64 {
            return Err(ElfError::BadSection {
                name: elf.section_name(i)?,
                problem: "symbol table outside the file".into(),
            }
            .into());
        }
        for k in 0..n {
            let at = base + k * SYM_SIZE as u64;
            let shndx = usize::from(u16_at(out, at + 6).expect("inside the table"));
            let value = u64_at(out, at + 8).expect("inside the table");
            let at = at as usize;
            if let Some((index, new)) = symbol_target(input, plan, shdrs, shndx, value)? {
                put_u16(out, at + 6, index);
                put_u64(out, at + 8, new);
            } else if moved.contains(&shndx) {
                put_u64(
                    out,
                    at + 8,
                    value.wrapping_add(plan.section_addr_delta(shndx)),
                );
            }
        }
    }
    Ok(())
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
        Form::Offloaded if shndx == f.index && (f.addr..plan.kept_end()).contains(&value) => {
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
    out: &mut [u8],
    input: &Input,
    plan: &Plan,
    shnum: usize,
) -> Result<(), TransformError> {
    let mut fh = *input.elf.header();
    let shoff = (out.len() - shnum * SHDR_SIZE) as u64;
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
    out[..std::mem::size_of_val(&fh)].copy_from_slice(object::pod::bytes_of(&fh));
    Ok(())
}
