//! The ELF offload transform (SPEC §2.3): turn a fat binary into a host-only
//! one whose wrappers point (magic HIPK) at HIPK metadata.
//!
//! Layout. `.hip_fatbin` is page-aligned and lies in a read-only `PT_LOAD`
//! (X). Its first page(s) stay in the file and receive the new program
//! header table (one entry longer: X is split in two) followed by the
//! metadata (`.rocm_kpack_ref`); the section's remaining whole pages leave
//! the file. X becomes X1 (up to the end of the kept pages in the file,
//! zero-filled in memory up to the end of the removed pages) and X2 (the
//! rest of X, from the first page after the removed ones). The kept pages
//! keep X's `p_vaddr - p_offset`, so Linux kernels before 5.18, which put
//! `AT_PHDR` at (first `PT_LOAD`'s `p_vaddr - p_offset`) + `e_phoff`, find
//! the moved table when X is the first `PT_LOAD` (as linkers lay out
//! executables). Every other address is unchanged; file offsets after the
//! cut move down by the removed size, a whole number of `p_align` units, so
//! every segment stays congruent.
//!
//! When the section has no whole page to spare beyond what the table and
//! metadata need, nothing is cut: the program header table stays where it
//! is, the metadata is written over the start of the section, and the rest
//! of the section is zeroed. Either way `.hip_fatbin` becomes `SHT_NOBITS`
//! over what remains, no bundle byte stays in the file, and the new
//! `.rocm_kpack_ref` section header is appended at the end of the section
//! table (so no section index changes), its name added to a new copy of
//! `.shstrtab` written at the end of the file.

use object::elf;

use crate::bundle::{parse_fatbin, BundleError};
pub use crate::elf::PointerKind;
use crate::elf::{
    pointer_at, read_relas, read_relr, ElfError, Headers, ProgramHeader, Rela, RelocKinds,
    SectionHeader, FATBIN_SECTION, METADATA_SECTION, PHDR_SIZE, SHDR_SIZE, WRAPPER_SECTION,
};
use crate::hipk::{Wrapper, HIPF_MAGIC, HIPK_MAGIC, WRAPPER_SIZE};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error("{FATBIN_SECTION}: {0}")]
    Bundle(#[from] BundleError),
    #[error("no {FATBIN_SECTION} section: not a fat binary")]
    NotFat,
    #[error("{FATBIN_SECTION} is already NOBITS but the wrappers are not all HIPK")]
    HalfOffloaded,
    #[error("unsupported machine {0} (kpack rewrites x86-64 and AArch64 binaries)")]
    UnsupportedMachine(u16),
    #[error("unsupported ELF type {0} (kpack rewrites executables and shared objects)")]
    UnsupportedType(u16),
    #[error("wrapper {index}: unknown magic {magic:#010x} (expected HIPF {HIPF_MAGIC:#010x})")]
    UnknownMagic { index: usize, magic: u32 },
    #[error("wrappers mix HIPF and HIPK magics: a partly offloaded binary")]
    MixedWrappers,
    #[error("wrapper {index}: binary pointer {pointer:#x} does not point at the start of a bundle in {FATBIN_SECTION} [{start:#x}, {end:#x})")]
    PointerNotAtBundle {
        index: usize,
        pointer: u64,
        start: u64,
        end: u64,
    },
    #[error("relocation at {r_offset:#x} {what} inside {FATBIN_SECTION} [{start:#x}, {end:#x}), whose bytes are removed")]
    RelocationIntoRemoved {
        r_offset: u64,
        what: &'static str,
        start: u64,
        end: u64,
    },
    #[error("{FATBIN_SECTION} is not inside the file-backed part of a PT_LOAD segment")]
    FatbinNotLoaded,
    #[error("{FATBIN_SECTION} lies in a writable PT_LOAD segment: the HIPK metadata that replaces it must be read-only")]
    FatbinWritable,
    #[error("segment {index} (type {p_type:#x}) spans the removed range of {FATBIN_SECTION}")]
    SegmentSpansRemoved { index: usize, p_type: u32 },
    #[error("section {name} lies inside the removed range of {FATBIN_SECTION}")]
    SectionInRemoved { name: String },
    #[error("{FATBIN_SECTION} ({size} bytes) is too small for the {need} bytes of metadata")]
    NoRoom { size: u64, need: u64 },
    #[error("cannot make room for one more program header: {why}")]
    CannotGrowPhdrs { why: String },
}

/// What the transform did to one wrapper.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WrapperChange {
    pub index: usize,
    /// The bundle index the wrapper pointed at: its `reserved1` now.
    pub co_index: u32,
    /// How the pointer is applied at load time.
    pub pointer: PointerKind,
}

/// The result of [`transform`].
#[derive(Debug, Clone)]
pub struct Transformed {
    pub bytes: Vec<u8>,
    pub wrappers: Vec<WrapperChange>,
    pub metadata_addr: u64,
    /// Number of bundles in the original `.hip_fatbin`.
    pub bundles: usize,
    /// Bytes removed from the file (whole pages).
    pub removed: u64,
    /// Whether the program header table moved.
    pub moved_phdrs: bool,
}

/// What an input looks like before transforming.
pub enum Precheck {
    /// A fat binary to transform.
    Fat,
    /// Every wrapper is already HIPK and `.hip_fatbin` is gone or NOBITS.
    AlreadyOffloaded,
}

/// `d_tag`s whose value is an address.
const DT_ADDRESS_TAGS: [u64; 18] = [
    3,           // DT_PLTGOT
    4,           // DT_HASH
    5,           // DT_STRTAB
    6,           // DT_SYMTAB
    7,           // DT_RELA
    12,          // DT_INIT
    13,          // DT_FINI
    17,          // DT_REL
    23,          // DT_JMPREL
    25,          // DT_INIT_ARRAY
    26,          // DT_FINI_ARRAY
    32,          // DT_PREINIT_ARRAY
    34,          // DT_SYMTAB_SHNDX
    36,          // DT_RELR
    0x6fff_fef5, // DT_GNU_HASH
    0x6fff_fff0, // DT_VERSYM
    0x6fff_fffc, // DT_VERDEF
    0x6fff_fffe, // DT_VERNEED
];

/// Section types that hold nothing code refers to by address, so that they
/// can move when the dynamic section, program headers and symbols follow.
fn movable(h: &Headers, i: usize) -> bool {
    let t = h.shdrs[i].sh_type;
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
            | crate::elf::SHT_RELR
    ) || (t == elf::SHT_PROGBITS && h.names[i] == ".interp")
}

/// The sections a grown program header table would overwrite, as one
/// contiguous block (from the first to the last of them).
struct Block {
    start_addr: u64,
    end_addr: u64,
    start_off: u64,
    align: u64,
}

fn block_to_move(h: &Headers, old_end: u64, new_end: u64) -> Result<Option<Block>, TransformError> {
    let mut hit: Vec<usize> = (1..h.shdrs.len())
        .filter(|&i| {
            let s = &h.shdrs[i];
            s.file_size() > 0 && s.sh_offset < new_end && s.sh_offset + s.sh_size > old_end
        })
        .collect();
    if hit.is_empty() {
        return Ok(None);
    }
    hit.sort_by_key(|&i| h.shdrs[i].sh_offset);
    let first = h.shdrs[hit[0]];
    let mut last_end = hit
        .iter()
        .map(|&i| h.shdrs[i].sh_offset + h.shdrs[i].sh_size)
        .max()
        .unwrap_or(0);
    // A segment such as PT_NOTE that starts inside the block moves whole:
    // take in every section up to its end (and so on, until stable).
    loop {
        let seg_end = h
            .phdrs
            .iter()
            .filter(|p| {
                !p.is_load() && p.p_filesz > 0 && (first.sh_offset..last_end).contains(&p.p_offset)
            })
            .map(|p| p.p_offset + p.p_filesz)
            .max()
            .unwrap_or(0);
        let sec_end = (1..h.shdrs.len())
            .map(|i| h.shdrs[i])
            .filter(|s| {
                s.file_size() > 0
                    && s.sh_offset < last_end.max(seg_end)
                    && s.sh_offset >= first.sh_offset
            })
            .map(|s| s.sh_offset + s.sh_size)
            .max()
            .unwrap_or(0);
        let end = last_end.max(seg_end).max(sec_end);
        if end == last_end {
            break;
        }
        last_end = end;
    }
    // Everything inside the block moves with it.
    let inside: Vec<usize> = (1..h.shdrs.len())
        .filter(|&i| {
            let s = &h.shdrs[i];
            s.file_size() > 0 && s.sh_offset < last_end && s.sh_offset + s.sh_size > first.sh_offset
        })
        .collect();
    let mut align = 8;
    for &i in &inside {
        let s = &h.shdrs[i];
        if s.sh_flags & elf::SHF_ALLOC as u64 == 0 || !movable(h, i) {
            return Err(TransformError::CannotGrowPhdrs {
                why: format!(
                    "section {} follows the program header table and cannot move",
                    h.names[i]
                ),
            });
        }
        if s.sh_offset < first.sh_offset || s.sh_offset + s.sh_size > last_end {
            return Err(TransformError::CannotGrowPhdrs {
                why: format!("section {} overlaps the block", h.names[i]),
            });
        }
        if s.sh_addr.wrapping_sub(first.sh_addr) != s.sh_offset - first.sh_offset {
            return Err(TransformError::CannotGrowPhdrs {
                why: format!("section {} is not laid out like its neighbours", h.names[i]),
            });
        }
        let a = s
            .sh_addralign
            .checked_next_power_of_two()
            .filter(|&a| a <= 1 << 30)
            .ok_or_else(|| TransformError::CannotGrowPhdrs {
                why: format!(
                    "section {} has an unsupported alignment {:#x}",
                    h.names[i], s.sh_addralign
                ),
            })?;
        align = align.max(a);
    }
    Ok(Some(Block {
        start_addr: first.sh_addr,
        end_addr: first.sh_addr + (last_end - first.sh_offset),
        start_off: first.sh_offset,
        align,
    }))
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
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

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn read_u64(b: &[u8], at: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    b.get(at..at.checked_add(8)?)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
}

/// Read the wrappers, with the file offset of each.
fn wrappers(b: &[u8], h: &Headers) -> Result<Vec<(u64, u64, Wrapper)>, TransformError> {
    let Some(i) = h.section_index(WRAPPER_SECTION) else {
        return Ok(Vec::new());
    };
    let s = &h.shdrs[i];
    if s.sh_type == elf::SHT_NOBITS {
        return Ok(Vec::new());
    }
    if !s.sh_size.is_multiple_of(WRAPPER_SIZE as u64)
        || s.sh_offset
            .checked_add(s.sh_size)
            .is_none_or(|e| e > b.len() as u64)
    {
        return Err(ElfError::BadSection {
            name: WRAPPER_SECTION.into(),
            problem: "bad size or bounds".into(),
        }
        .into());
    }
    Ok((0..s.sh_size / WRAPPER_SIZE as u64)
        .map(|k| {
            let off = s.sh_offset + k * WRAPPER_SIZE as u64;
            let addr = s.sh_addr + k * WRAPPER_SIZE as u64;
            let w = Wrapper::parse(
                b[off as usize..off as usize + WRAPPER_SIZE]
                    .try_into()
                    .expect("24 bytes"),
            );
            (off, addr, w)
        })
        .collect())
}

/// Is this input a fat binary to transform, or already offloaded?
pub fn precheck(b: &[u8]) -> Result<Precheck, TransformError> {
    let h = Headers::parse(b)?;
    let ws = wrappers(b, &h)?;
    let fat = h.section_index(FATBIN_SECTION).map(|i| h.shdrs[i]);
    let all_hipk = !ws.is_empty() && ws.iter().all(|(_, _, w)| w.magic == HIPK_MAGIC);
    match fat {
        Some(s) if s.sh_type != elf::SHT_NOBITS => {
            if all_hipk {
                return Err(TransformError::MixedWrappers);
            }
            Ok(Precheck::Fat)
        }
        Some(_) if all_hipk => Ok(Precheck::AlreadyOffloaded),
        // A fat binary without wrappers comes out of the transform like this.
        Some(_) if ws.is_empty() && h.section_index(METADATA_SECTION).is_some() => {
            Ok(Precheck::AlreadyOffloaded)
        }
        Some(_) => Err(TransformError::HalfOffloaded),
        None if all_hipk && h.section_index(METADATA_SECTION).is_some() => {
            Ok(Precheck::AlreadyOffloaded)
        }
        None => Err(TransformError::NotFat),
    }
}

/// Reject headers whose ranges overflow or leave the file, so that the
/// layout arithmetic below cannot.
fn validate_layout(h: &Headers, len: u64) -> Result<(), TransformError> {
    for (i, p) in h.phdrs.iter().enumerate() {
        let bad = |what: &str| -> TransformError {
            ElfError::Malformed(format!("program header {i}: {what}")).into()
        };
        if p.p_filesz > 0 && p.p_offset.checked_add(p.p_filesz).is_none_or(|e| e > len) {
            return Err(bad("its file range runs past the end of the file"));
        }
        if p.p_vaddr.checked_add(p.p_memsz).is_none() || p.p_paddr.checked_add(p.p_memsz).is_none()
        {
            return Err(bad("its address range overflows"));
        }
        if p.is_load() && p.p_filesz > p.p_memsz {
            return Err(bad("file size exceeds memory size"));
        }
        if p.is_load() && (p.p_align > 1 << 30 || (p.p_align > 1 && !p.p_align.is_power_of_two())) {
            return Err(bad("unsupported alignment"));
        }
    }
    for (i, s) in h.shdrs.iter().enumerate() {
        let overflow = s.sh_addr.checked_add(s.sh_size).is_none()
            || (s.file_size() > 0 && s.sh_offset.checked_add(s.sh_size).is_none_or(|e| e > len));
        if overflow {
            return Err(ElfError::BadSection {
                name: h.names[i].clone(),
                problem: "its range overflows or leaves the file".into(),
            }
            .into());
        }
    }
    Ok(())
}

/// Transform a fat binary. `metadata` is the encoded HIPK metadata.
pub fn transform(b: &[u8], metadata: &[u8]) -> Result<Transformed, TransformError> {
    let h = Headers::parse(b)?;
    validate_layout(&h, b.len() as u64)?;
    let ehdr = h.file;
    let kinds = RelocKinds::for_machine(ehdr.e_machine)
        .ok_or(TransformError::UnsupportedMachine(ehdr.e_machine))?;
    if ehdr.e_type != elf::ET_EXEC && ehdr.e_type != elf::ET_DYN {
        return Err(TransformError::UnsupportedType(ehdr.e_type));
    }
    let fi = h
        .section_index(FATBIN_SECTION)
        .ok_or(TransformError::NotFat)?;
    let fs = h.shdrs[fi];
    if fs.sh_type == elf::SHT_NOBITS {
        return Err(TransformError::HalfOffloaded);
    }
    let (f_addr, f_off, f_size) = (fs.sh_addr, fs.sh_offset, fs.sh_size);
    let f_end = f_addr + f_size;
    let section = b
        .get(
            f_off as usize
                ..(f_off
                    .checked_add(f_size)
                    .ok_or(TransformError::FatbinNotLoaded)?) as usize,
        )
        .ok_or(TransformError::FatbinNotLoaded)?;
    let bundles = parse_fatbin(section)?;

    // The PT_LOAD holding the section.
    let xi = h
        .phdrs
        .iter()
        .position(|p| {
            p.is_load()
                && p.file_contains(f_off, f_size)
                && p.p_offset.wrapping_sub(p.p_vaddr) == f_off.wrapping_sub(f_addr)
        })
        .ok_or(TransformError::FatbinNotLoaded)?;
    let x = h.phdrs[xi];
    // The metadata goes where the section was (SPEC 2.2: in a read-only
    // PT_LOAD); a writable segment (e.g. `ld -N`) cannot hold it.
    if x.p_flags & elf::PF_W != 0 {
        return Err(TransformError::FatbinWritable);
    }
    let unit = h
        .phdrs
        .iter()
        .filter(|p| p.is_load())
        .map(|p| p.p_align)
        .max()
        .unwrap_or(4096)
        .max(4096);
    if !unit.is_power_of_two() {
        return Err(ElfError::Malformed(format!(
            "PT_LOAD alignment {unit:#x} is not a power of two"
        ))
        .into());
    }

    // Wrappers and where their pointers come from.
    let relas = read_relas(b, &h)?;
    let relr = read_relr(b, &h)?;
    let ws = wrappers(b, &h)?;
    let mut changes = Vec::with_capacity(ws.len());
    let mut rela_edits: Vec<usize> = Vec::new();
    let mut wrapper_pointer_addrs = Vec::with_capacity(ws.len());
    for (index, &(off, addr, w)) in ws.iter().enumerate() {
        match w.magic {
            HIPF_MAGIC => {}
            HIPK_MAGIC => return Err(TransformError::MixedWrappers),
            magic => return Err(TransformError::UnknownMagic { index, magic }),
        }
        let p = pointer_at(b, &h, &relas, &relr, addr + 8, off + 8)?;
        let (ptr, kind, rela) = (p.value, p.kind, p.rela);
        let co_index = ptr
            .checked_sub(f_addr)
            .and_then(|rel| bundles.iter().find(|bd| bd.range.start as u64 == rel))
            .map(|bd| bd.index as u32)
            .ok_or(TransformError::PointerNotAtBundle {
                index,
                pointer: ptr,
                start: f_addr,
                end: f_end,
            })?;
        changes.push(WrapperChange {
            index,
            co_index,
            pointer: kind,
        });
        rela_edits.extend(rela);
        wrapper_pointer_addrs.push(addr + 8);
    }
    // No other relocation may refer to the section's bytes.
    for r in &relas {
        if (f_addr..f_end).contains(&r.r_offset) {
            return Err(TransformError::RelocationIntoRemoved {
                r_offset: r.r_offset,
                what: "applies to bytes",
                start: f_addr,
                end: f_end,
            });
        }
        if r.r_type == kinds.relative
            && (f_addr..f_end).contains(&(r.r_addend as u64))
            && !wrapper_pointer_addrs.contains(&r.r_offset)
        {
            return Err(TransformError::RelocationIntoRemoved {
                r_offset: r.r_offset,
                what: "points",
                start: f_addr,
                end: f_end,
            });
        }
    }
    for &a in &relr {
        if (f_addr..f_end).contains(&a) {
            return Err(TransformError::RelocationIntoRemoved {
                r_offset: a,
                what: "applies to bytes",
                start: f_addr,
                end: f_end,
            });
        }
        if !wrapper_pointer_addrs.contains(&a) {
            if let Some(v) = h.addr_to_offset(a, 8).and_then(|o| read_u64(b, o)) {
                if (f_addr..f_end).contains(&v) {
                    return Err(TransformError::RelocationIntoRemoved {
                        r_offset: a,
                        what: "points",
                        start: f_addr,
                        end: f_end,
                    });
                }
            }
        }
    }

    // Plan the layout. Removing pages from the middle of X splits it in
    // two, so the program header table needs one more entry. The table
    // stays where it is (right after the ELF header, where binutils and
    // libelf expect it and where old kernels compute AT_PHDR) and grows in
    // place; the sections it grows over (notes, dynamic symbol and hash
    // tables, version tables, dynamic relocations, .interp) move, as one
    // block, into the kept first page(s) of .hip_fatbin after the metadata.
    let meta_len = metadata.len() as u64;
    let cut_addr_end = (f_end / unit) * unit;
    let cut_end_if_split = f_off + cut_addr_end.saturating_sub(f_addr);
    let x_file_end = x.p_offset + x.p_filesz;
    let grow = usize::from(x_file_end > cut_end_if_split);
    let old_table_end = ehdr.e_phoff + (h.phdrs.len() * PHDR_SIZE) as u64;
    let new_table_end = ehdr.e_phoff + ((h.phdrs.len() + grow) * PHDR_SIZE) as u64;
    let block = if grow > 0 {
        block_to_move(&h, old_table_end, new_table_end)?
    } else {
        None
    };
    let block_len = block.as_ref().map_or(0, |bl| bl.end_addr - bl.start_addr);
    let (block_new_addr, kept_len) = match &block {
        Some(bl) => {
            let a = align_up(f_addr + meta_len, bl.align) + bl.start_addr % bl.align;
            (a, a + block_len - f_addr)
        }
        None => (0, meta_len),
    };
    let keep = align_up(kept_len, unit);
    let split = f_addr % unit == 0 && cut_addr_end > f_addr + keep;
    let (cut_start, cut_end, removed) = if split {
        let s = f_off + keep;
        (s, cut_end_if_split, cut_end_if_split - s)
    } else {
        if meta_len > f_size {
            return Err(TransformError::NoRoom {
                size: f_size,
                need: meta_len,
            });
        }
        (f_off + f_size, f_off + f_size, 0)
    };
    let block = if split { block } else { None };
    let map_off = |o: u64| -> Option<u64> {
        if o < cut_start || removed == 0 {
            Some(o)
        } else if o >= cut_end {
            Some(o - removed)
        } else {
            None
        }
    };
    // Where the block goes: addresses and file offsets move by these.
    let (addr_delta, off_delta) = match &block {
        Some(bl) => (
            block_new_addr.wrapping_sub(bl.start_addr),
            (block_new_addr - f_addr + f_off).wrapping_sub(bl.start_off),
        ),
        None => (0, 0),
    };
    let in_block = |addr: u64| {
        block
            .as_ref()
            .is_some_and(|bl| (bl.start_addr..bl.end_addr).contains(&addr))
    };
    let in_block_off = |off: u64| {
        block.as_ref().is_some_and(|bl| {
            (bl.start_off..bl.start_off + (bl.end_addr - bl.start_addr)).contains(&off)
        })
    };
    if block.is_some() {
        for r in &relas {
            if in_block(r.r_offset) || (r.r_type == kinds.relative && in_block(r.r_addend as u64)) {
                return Err(TransformError::CannotGrowPhdrs {
                    why: format!(
                        "relocation at {:#x} refers to a section that must move",
                        r.r_offset
                    ),
                });
            }
        }
    }

    // Segments.
    let mut phdrs: Vec<ProgramHeader> = Vec::with_capacity(h.phdrs.len() + 1);
    for (i, p) in h.phdrs.iter().enumerate() {
        if i == xi && split {
            let mut x1 = x;
            x1.p_filesz = cut_start - x.p_offset;
            if grow == 0 {
                phdrs.push(x1);
            } else {
                x1.p_memsz = cut_addr_end - x.p_vaddr;
                let mut x2 = x;
                x2.p_offset = cut_end - removed;
                x2.p_vaddr = cut_addr_end;
                x2.p_paddr = x.p_paddr.wrapping_add(cut_addr_end - x.p_vaddr);
                x2.p_filesz = x_file_end - cut_end;
                x2.p_memsz = x.p_vaddr + x.p_memsz - cut_addr_end;
                phdrs.push(x1);
                phdrs.push(x2);
            }
            continue;
        }
        let mut q = *p;
        if q.p_type == elf::PT_PHDR {
            q.p_filesz = ((h.phdrs.len() + if split { grow } else { 0 }) * PHDR_SIZE) as u64;
            q.p_memsz = q.p_filesz;
        } else if !q.is_load() && q.p_filesz > 0 && in_block_off(q.p_offset) {
            // PT_INTERP, PT_NOTE: follow the moved sections.
            q.p_offset = q.p_offset.wrapping_add(off_delta);
            q.p_vaddr = q.p_vaddr.wrapping_add(addr_delta);
            q.p_paddr = q.p_paddr.wrapping_add(addr_delta);
        } else if removed > 0 && q.p_filesz > 0 {
            if q.p_offset >= cut_end {
                q.p_offset -= removed;
            } else if q.p_offset + q.p_filesz > cut_start {
                return Err(TransformError::SegmentSpansRemoved {
                    index: i,
                    p_type: q.p_type,
                });
            }
        } else if removed > 0 && q.p_offset >= cut_end {
            q.p_offset -= removed;
        }
        phdrs.push(q);
    }
    let phnum = phdrs.len();
    let metadata_addr = f_addr;
    let metadata_off = f_off;

    // Body: everything but the removed pages (and the old section header
    // table when it ends the file; a new one is appended).
    let old_sh_end = ehdr.e_shoff + (h.shdrs.len() * SHDR_SIZE) as u64;
    let body_end = if old_sh_end == b.len() as u64 && ehdr.e_shoff >= cut_end {
        ehdr.e_shoff
    } else {
        b.len() as u64
    };
    for (i, sh) in h.shdrs.iter().enumerate().skip(1) {
        if sh.file_size() > 0 && sh.sh_offset + sh.sh_size > body_end {
            return Err(ElfError::BadSection {
                name: h.names[i].clone(),
                problem: "overlaps the section header table".into(),
            }
            .into());
        }
    }
    if ehdr.e_phoff + (phnum * PHDR_SIZE) as u64 > cut_start {
        return Err(ElfError::Malformed(
            "the program header table lies in .hip_fatbin's removed pages".into(),
        )
        .into());
    }
    let mut out = Vec::with_capacity((body_end - removed) as usize + 4096);
    out.extend_from_slice(&b[..cut_start as usize]);
    out.extend_from_slice(&b[cut_end as usize..body_end as usize]);

    // No bundle byte stays: zero what is left of the section in the file.
    let f_file_end = map_off(f_off + f_size).expect("end of section maps");
    out[f_off as usize..cut_start as usize].fill(0);
    if removed > 0 {
        out[(cut_end - removed) as usize..f_file_end as usize].fill(0);
    }

    // Wrappers and their relocations.
    for (&(off, _, _), c) in ws.iter().zip(&changes) {
        let at = map_off(off).ok_or(TransformError::SectionInRemoved {
            name: WRAPPER_SECTION.into(),
        })? as usize;
        region(&mut out, at as u64, WRAPPER_SIZE, "wrapper")?;
        put_u32(&mut out, at, HIPK_MAGIC);
        put_u64(&mut out, at + 8, metadata_addr);
        put_u64(&mut out, at + 16, c.co_index as u64);
    }
    for &ri in &rela_edits {
        let mut r = relas[ri];
        r.r_type = kinds.relative;
        r.r_sym = 0;
        r.r_addend = metadata_addr as i64;
        let at = map_off(r.entry_offset).ok_or(TransformError::SectionInRemoved {
            name: ".rela.dyn".into(),
        })? as usize;
        region(&mut out, at as u64, Rela::SIZE, "relocation")?.copy_from_slice(&r.to_bytes());
    }

    // Move the block, then grow the table over its old place.
    if let Some(bl) = &block {
        let from = bl.start_off as usize..(bl.start_off + block_len) as usize;
        let to = from.start.wrapping_add(off_delta as usize);
        out.copy_within(from.clone(), to);
        out[old_table_end as usize..from.end].fill(0);
    }
    for (k, p) in phdrs.iter().enumerate() {
        let at = ehdr.e_phoff as usize + k * PHDR_SIZE;
        region(&mut out, at as u64, PHDR_SIZE, "program header")?.copy_from_slice(&p.to_bytes());
    }
    out[metadata_off as usize..(metadata_off + meta_len) as usize].copy_from_slice(metadata);

    // Dynamic entries that point into the moved block.
    if block.is_some() {
        for (i, s) in h.shdrs.iter().enumerate() {
            if s.sh_type != elf::SHT_DYNAMIC {
                continue;
            }
            let base = map_off(s.sh_offset).ok_or(TransformError::SectionInRemoved {
                name: h.names[i].clone(),
            })?;
            for k in 0..s.sh_size / 16 {
                let at = (base + k * 16) as usize;
                let entry = region(&mut out, at as u64, 16, ".dynamic entry")?;
                let tag = u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"));
                let val = u64::from_le_bytes(entry[8..].try_into().expect("8 bytes"));
                if DT_ADDRESS_TAGS.contains(&tag) && in_block(val) {
                    put_u64(&mut out, at + 8, val.wrapping_add(addr_delta));
                }
            }
        }
    }

    // Sections: shift, move, turn .hip_fatbin into NOBITS, add .rocm_kpack_ref.
    let mut shdrs: Vec<SectionHeader> = Vec::with_capacity(h.shdrs.len() + 1);
    let mut moved_sections = Vec::new();
    for (i, s) in h.shdrs.iter().enumerate() {
        let mut t = *s;
        if i == fi {
            t.sh_type = elf::SHT_NOBITS;
            if split {
                // Up to the end of the removed pages: the zeroed tail of
                // the section after them lies in the next segment.
                t.sh_addr = f_addr + keep;
                t.sh_offset = cut_end - removed;
                t.sh_size = cut_addr_end - t.sh_addr;
            } else {
                let start = align_up(meta_len, 16).min(f_size);
                t.sh_addr = f_addr + start;
                t.sh_offset = f_off + start;
                t.sh_size = f_size - start;
                t.sh_addralign = t.sh_addralign.min(16);
            }
            shdrs.push(t);
            continue;
        }
        if i > 0
            && t.sh_flags & elf::SHF_ALLOC as u64 != 0
            && t.file_size() > 0
            && in_block(t.sh_addr)
        {
            t.sh_addr = t.sh_addr.wrapping_add(addr_delta);
            t.sh_offset = t.sh_offset.wrapping_add(off_delta);
            moved_sections.push(i);
        } else if i > 0 && removed > 0 {
            let fsz = t.file_size();
            if t.sh_offset >= cut_end {
                t.sh_offset -= removed;
            } else if fsz > 0 && t.sh_offset + fsz > cut_start {
                return Err(TransformError::SectionInRemoved {
                    name: h.names[i].clone(),
                });
            }
        }
        shdrs.push(t);
    }
    // New .shstrtab with the metadata section's name, at the end.
    let stri = ehdr.e_shstrndx as usize;
    let old_str = h
        .shdrs
        .get(stri)
        .copied()
        .ok_or(ElfError::Malformed("no section name table".into()))?;
    let strtab = b
        .get(old_str.sh_offset as usize..(old_str.sh_offset + old_str.sh_size) as usize)
        .ok_or(ElfError::Malformed(
            "section name table outside the file".into(),
        ))?;
    let mut new_str = strtab.to_vec();
    let name_off = new_str.len() as u32;
    new_str.extend_from_slice(METADATA_SECTION.as_bytes());
    new_str.push(0);
    let str_off = out.len() as u64;
    out.extend_from_slice(&new_str);
    shdrs[stri].sh_offset = str_off;
    shdrs[stri].sh_size = new_str.len() as u64;
    shdrs.push(SectionHeader {
        sh_name: name_off,
        sh_type: elf::SHT_PROGBITS,
        sh_flags: elf::SHF_ALLOC as u64,
        sh_addr: metadata_addr,
        sh_offset: metadata_off,
        sh_size: meta_len,
        sh_link: 0,
        sh_info: 0,
        sh_addralign: 16,
        sh_entsize: 0,
    });
    out.resize(align_up(out.len() as u64, 8) as usize, 0);
    let shoff = out.len() as u64;
    for s in &shdrs {
        out.extend_from_slice(&s.to_bytes());
    }

    let mut fh = ehdr;
    fh.e_shoff = shoff;
    fh.e_shnum =
        u16::try_from(shdrs.len()).map_err(|_| ElfError::Malformed("too many sections".into()))?;
    fh.e_phnum =
        u16::try_from(phnum).map_err(|_| ElfError::Malformed("too many segments".into()))?;
    // Symbols: those in moved sections follow them; those that named the
    // section's start (`__hip_fatbin`) or its kept pages now name the
    // metadata, what the wrappers point at.
    let meta_index = u16::try_from(shdrs.len() - 1)
        .map_err(|_| ElfError::Malformed("too many sections".into()))?;
    let kept_end = if split {
        f_addr + keep
    } else {
        f_addr + meta_len
    };
    for (i, s) in h.shdrs.iter().enumerate() {
        if s.sh_type != elf::SHT_SYMTAB && s.sh_type != elf::SHT_DYNSYM {
            continue;
        }
        let base = shdrs[i].sh_offset;
        let n = s.sh_size / 24;
        if base + n * 24 > out.len() as u64 {
            return Err(ElfError::BadSection {
                name: h.names[i].clone(),
                problem: "symbol table outside the file".into(),
            }
            .into());
        }
        for k in 0..n {
            let at = (base + k * 24) as usize;
            let shndx = u16::from_le_bytes([out[at + 6], out[at + 7]]) as usize;
            let value = u64::from_le_bytes(out[at + 8..at + 16].try_into().expect("8 bytes"));
            if shndx == fi && (f_addr..kept_end).contains(&value) {
                out[at + 6..at + 8].copy_from_slice(&meta_index.to_le_bytes());
                put_u64(&mut out, at + 8, metadata_addr);
            } else if moved_sections.contains(&shndx) {
                put_u64(&mut out, at + 8, value.wrapping_add(addr_delta));
            }
        }
    }
    fh.write(&mut out);
    let moved_phdrs = false;
    Ok(Transformed {
        bytes: out,
        wrappers: changes,
        metadata_addr,
        bundles: bundles.len(),
        removed,
        moved_phdrs,
    })
}
