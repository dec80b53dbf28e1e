//! Step 1 of the transform: read the input and check everything the layout
//! relies on, before anything is planned or written.

use object::elf;
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _};

use super::TransformError;
use crate::binary::{Address, HostBinary, WrapperSlot, WrapperTable};
use crate::bundle::list_fatbin;
use crate::elf::{
    file_size, ElfError, ElfView, PhdrExt, Pointer, ProgramHeader, RelocKinds, Relocations,
    SectionHeader, FATBIN_SECTION, LE, METADATA_SECTION, PHDR_SIZE,
};
use crate::offload::rewritten::WrapperChange;
use crate::offload::section::{Container, Reloc, SectionError};
use crate::offload::wrappers::{bundle_index, check_hipf, resolved, BundleRange, WrapperError};

/// What the transform needs to know about its input.
pub struct Input<'a> {
    pub elf: ElfView<'a>,
    pub kinds: RelocKinds,
    /// The `.hip_fatbin` section: index, address, file offset, size.
    pub fatbin: Fatbin,
    /// Number of bundles in it.
    pub bundles: usize,
    /// Index of the `PT_LOAD` holding it (X), and X.
    pub xi: usize,
    pub x: ProgramHeader,
    /// X is writable: offload then splits the metadata's pages off into a
    /// read-only segment of their own.
    pub writable: bool,
    /// The page unit: the largest `PT_LOAD` alignment, at least 4 KiB.
    pub unit: u64,
    pub relocs: Relocations,
    pub wrappers: Wrappers,
}

/// Where `.hip_fatbin` is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fatbin {
    pub index: usize,
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
}

impl Fatbin {
    pub fn end(&self) -> u64 {
        self.addr + self.size
    }

    pub fn contains(&self, addr: u64) -> bool {
        (self.addr..self.end()).contains(&addr)
    }
}

/// The wrappers and what the transform changes in them.
#[derive(Debug, Clone, Default)]
pub struct Wrappers {
    /// File offset of each wrapper.
    pub offsets: Vec<u64>,
    pub changes: Vec<WrapperChange>,
    /// Per wrapper: the index (in `relocs.relas`) of the relocation that
    /// sets its pointer, rewritten to the pointer's new value.
    pub relas: Vec<Option<usize>>,
    /// Addresses of the wrappers' pointer fields.
    pub pointer_addrs: Vec<u64>,
    /// Per wrapper (fat binaries): the offset in `.hip_fatbin` of the
    /// bundle its pointer names.
    pub targets: Vec<u64>,
}

impl Wrappers {
    /// Record the wrapper of `slot`, whose pointer resolved to `p`, as
    /// naming code object `co_index`.
    fn push(&mut self, slot: &WrapperSlot, p: &Pointer, co_index: u32) {
        self.offsets.push(slot.offset);
        self.changes.push(WrapperChange {
            index: slot.index,
            co_index,
            pointer: p.kind,
        });
        self.relas.push(p.rela);
        self.pointer_addrs.push(slot.addr + 8);
    }
}

/// What restore fills in an offloaded binary: the metadata section, the
/// free address range the bundles may take, and the segment after X1.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hole {
    /// `.rocm_kpack_ref` (it is dropped).
    pub meta: Fatbin,
    /// The free range: from the metadata (or the end of the sections moved
    /// after it) to the next section after the removed pages.
    pub start: u64,
    pub end: u64,
    /// X2: the segment that follows X1 in memory and in the file.
    pub x2: Option<usize>,
    /// The removed range is an unmapped gap after X1 (offload left it so).
    pub gap: bool,
}

pub fn analyze(elf: ElfView<'_>) -> Result<Input<'_>, TransformError> {
    let kinds = rewritable(&elf)?;
    let bin = HostBinary::Elf(elf);
    let (fatbin, bundle_starts) = find_fatbin(&elf)?;
    let (xi, x) = holding_segment(&elf, &fatbin)?;
    check_loads_after(&elf, xi, &x)?;
    let unit = page_unit(&elf)?;
    let table = bin.wrappers().map_err(WrapperError::Table)?;
    let wrappers = resolve_wrappers(&table, &fatbin, &bundle_starts)?;
    // All of the file's relocations, not the table's: a binary without a
    // wrapper table can still have relocations into the section.
    let relocs = Relocations::read(&elf)?;
    check_relocations(&elf, &relocs, kinds, &fatbin, &wrappers.pointer_addrs)?;
    Ok(Input {
        elf,
        kinds,
        fatbin,
        bundles: bundle_starts.len(),
        xi,
        x,
        writable: x.p_flags(LE) & elf::PF_W != 0,
        unit,
        relocs,
        wrappers,
    })
}

/// The relocation kinds of the machine of a binary the transform can
/// rewrite (an executable or shared object of a machine it knows, headers
/// in range).
fn rewritable(elf: &ElfView) -> Result<RelocKinds, TransformError> {
    elf.check_sections()?;
    validate_layout(elf)?;
    let machine = elf.machine();
    let kinds =
        RelocKinds::for_machine(machine).ok_or(TransformError::UnsupportedMachine(machine))?;
    if elf.e_type() != elf::ET_EXEC && elf.e_type() != elf::ET_DYN {
        return Err(TransformError::UnsupportedType(elf.e_type()));
    }
    Ok(kinds)
}

/// Reject headers whose ranges overflow or leave the file, so that the
/// layout arithmetic of the later steps cannot.
fn validate_layout(elf: &ElfView) -> Result<(), TransformError> {
    let len = elf.bytes().len() as u64;
    for (i, p) in elf.phdrs().iter().enumerate() {
        let bad = |what: &str| -> TransformError {
            ElfError::Malformed(format!("program header {i}: {what}")).into()
        };
        let (off, filesz, memsz) = (p.p_offset(LE), p.p_filesz(LE), p.p_memsz(LE));
        if filesz > 0 && off.checked_add(filesz).is_none_or(|e| e > len) {
            return Err(bad("its file range runs past the end of the file"));
        }
        if p.p_vaddr(LE).checked_add(memsz).is_none() || p.p_paddr(LE).checked_add(memsz).is_none()
        {
            return Err(bad("its address range overflows"));
        }
        let align = p.p_align(LE);
        if p.is_load() && filesz > memsz {
            return Err(bad("file size exceeds memory size"));
        }
        if p.is_load() && (align > 1 << 30 || (align > 1 && !align.is_power_of_two())) {
            return Err(bad("unsupported alignment"));
        }
    }
    for (i, s) in elf.shdrs().iter().enumerate() {
        let size = s.sh_size(LE);
        let overflow = s.sh_addr(LE).checked_add(size).is_none()
            || (file_size(s) > 0 && s.sh_offset(LE).checked_add(size).is_none_or(|e| e > len));
        if overflow {
            return Err(ElfError::BadSection {
                name: elf.section_name(i)?,
                problem: "its range overflows or leaves the file".into(),
            }
            .into());
        }
    }
    Ok(())
}

/// The `.hip_fatbin` section, and the start offset (in the section) and
/// index of each of its bundles (the inner bundles of a compressed bundle
/// share its start: a pointer there names the first of them).
fn find_fatbin(elf: &ElfView) -> Result<(Fatbin, Vec<(usize, usize)>), TransformError> {
    let index = elf
        .section_index(FATBIN_SECTION)
        .ok_or(SectionError::NotFat(Container::Elf))?;
    let sh = &elf.shdrs()[index];
    if sh.sh_type(LE) == elf::SHT_NOBITS {
        return Err(TransformError::HalfOffloaded);
    }
    let fatbin = Fatbin {
        index,
        addr: sh.sh_addr(LE),
        offset: sh.sh_offset(LE),
        size: sh.sh_size(LE),
    };
    let end = fatbin
        .offset
        .checked_add(fatbin.size)
        .ok_or(TransformError::FatbinNotLoaded)?;
    let data = elf
        .bytes()
        .get(fatbin.offset as usize..end as usize)
        .ok_or(TransformError::FatbinNotLoaded)?;
    let starts: Vec<_> = list_fatbin(data)?
        .iter()
        .map(|bundle| (bundle.range.start, bundle.index))
        .collect();
    if starts.is_empty() {
        // Zeros only: a host-only binary (`binary::classify`).
        return Err(TransformError::NoBundles);
    }
    Ok((fatbin, starts))
}

/// The `PT_LOAD`s after X in the table must start at or after its end, as
/// the part of X after the removed pages will (an empty one at a lower
/// address, which the verifier lets pass, would then be out of order).
fn check_loads_after(elf: &ElfView, xi: usize, x: &ProgramHeader) -> Result<(), TransformError> {
    let x_end = x.p_vaddr(LE) + x.p_memsz(LE);
    match elf.phdrs()[xi + 1..]
        .iter()
        .position(|p| p.is_load() && p.p_vaddr(LE) < x_end)
    {
        Some(i) => Err(ElfError::Malformed(format!(
            "program header {}: a PT_LOAD after the one holding {FATBIN_SECTION} starts below its end",
            xi + 1 + i
        ))
        .into()),
        None => Ok(()),
    }
}

/// The `PT_LOAD` (X) whose file-backed part holds the section at its
/// address.
fn holding_segment(elf: &ElfView, f: &Fatbin) -> Result<(usize, ProgramHeader), TransformError> {
    let xi = elf
        .phdrs()
        .iter()
        .position(|p| {
            p.is_load()
                && p.file_contains(f.offset, f.size)
                && p.p_offset(LE).wrapping_sub(p.p_vaddr(LE)) == f.offset.wrapping_sub(f.addr)
        })
        .ok_or(TransformError::FatbinNotLoaded)?;
    Ok((xi, elf.phdrs()[xi]))
}

fn page_unit(elf: &ElfView) -> Result<u64, TransformError> {
    let unit = elf
        .phdrs()
        .iter()
        .filter(|p| p.is_load())
        .map(|p| p.p_align(LE))
        .max()
        .unwrap_or(4096)
        .max(4096);
    if !unit.is_power_of_two() {
        return Err(ElfError::Malformed(format!(
            "PT_LOAD alignment {unit:#x} is not a power of two"
        ))
        .into());
    }
    Ok(unit)
}

/// Every wrapper must be HIPF and point at the start of a bundle; its
/// `co_index` is that bundle's index.
fn resolve_wrappers(
    table: &WrapperTable,
    f: &Fatbin,
    bundle_starts: &[(usize, usize)],
) -> Result<Wrappers, TransformError> {
    let range = BundleRange {
        section: FATBIN_SECTION,
        start: f.addr,
        end: f.end(),
        starts: bundle_starts,
        address: Address::Virtual,
    };
    let mut out = Wrappers::default();
    for slot in &table.slots {
        check_hipf(slot)?;
        let p = resolved(slot)?;
        let co_index = bundle_index(slot, p, &range)?;
        out.push(slot, p, co_index);
        out.targets.push(p.value - f.addr);
    }
    Ok(out)
}

/// No relocation other than the wrappers' may apply to, or point into, the
/// section's bytes: they leave the file.
fn check_relocations(
    elf: &ElfView,
    relocs: &Relocations,
    kinds: RelocKinds,
    f: &Fatbin,
    wrapper_ptrs: &[u64],
) -> Result<(), TransformError> {
    let hit = |r_offset: u64, what: &'static str| -> TransformError {
        SectionError::RelocationIntoRemoved {
            reloc: Reloc::Elf(r_offset),
            what,
            start: f.addr,
            end: f.end(),
        }
        .into()
    };
    let in_headers = in_headers(elf);
    for r in relocs.relas(elf) {
        if f.contains(r.r_offset) {
            return Err(hit(r.r_offset, "applies to bytes"));
        }
        if in_headers(r.r_offset) {
            return Err(TransformError::RelocationIntoHeaders(r.r_offset));
        }
        if r.r_type == kinds.relative
            && f.contains(r.r_addend as u64)
            && !wrapper_ptrs.contains(&r.r_offset)
        {
            return Err(hit(r.r_offset, "points"));
        }
    }
    for a in relocs.relr(elf) {
        if f.contains(a) {
            return Err(hit(a, "applies to bytes"));
        }
        if in_headers(a) {
            return Err(TransformError::RelocationIntoHeaders(a));
        }
        if !wrapper_ptrs.contains(&a) {
            let value = elf.relr_value(a);
            if value.is_some_and(|v| f.contains(v)) {
                return Err(hit(a, "points"));
            }
        }
    }
    Ok(())
}

/// Whether the word relocated at an address overlaps the ELF header or the
/// program header table, which the transform rewrites.
fn in_headers<'a>(elf: &'a ElfView) -> impl Fn(u64) -> bool + 'a {
    let start = elf.header().e_phoff(LE);
    let end = start.saturating_add((elf.phdrs().len() * PHDR_SIZE) as u64);
    move |addr| {
        elf.addr_to_offset(addr, 1)
            .is_some_and(|o| o < 64 || (o < end && o.saturating_add(8) > start))
    }
}

/// Read an offloaded binary for restore: the checks of [`analyze`] on its
/// headers, the HIPK wrappers (their code object indices), the read-only
/// segment X1 whose zero-filled tail is the removed pages, and the free
/// range the bundles may take ([`Hole`]).
pub(crate) fn analyze_offloaded(elf: ElfView<'_>) -> Result<(Input<'_>, Hole), TransformError> {
    let kinds = rewritable(&elf)?;
    let (fatbin, meta) = offloaded_sections(&elf)?;
    let (mi, m) = holding_segment(&elf, &meta)?;
    // The metadata is read-only (formats.md §4.2); kpack never writes it
    // elsewhere.
    if m.p_flags(LE) & elf::PF_W != 0 {
        return Err(not_restorable(
            "its metadata lies in a writable segment (not a binary kpack offloaded)",
        ));
    }
    // The metadata in the section's first page, or in a segment of its own
    // after the rest (the section was in the middle of a writable one):
    // then the bundles go back where the section is, after that segment's
    // file bytes.
    let (xi, x, start_at) = match segment_ending_at(&elf, &fatbin, &m) {
        Some((i, x)) => (i, x, Fatbin { size: 0, ..fatbin }),
        None => (mi, m, meta),
    };
    let (x, gap) = with_gap_as_tail(&elf, x, &fatbin);
    let unit = page_unit(&elf)?;
    let x2 = segment_after_tail(&elf, &x, unit)?;
    let x_end = x.p_vaddr(LE) + x.p_memsz(LE);
    let (start, end) = free_range(&elf, &fatbin, &start_at, x_end)?;
    let table = HostBinary::Elf(elf)
        .wrappers()
        .map_err(WrapperError::Table)?;
    let wrappers = hipk_wrappers(&table)?;
    let hole = Hole {
        meta,
        start,
        end,
        x2,
        gap,
    };
    let input = Input {
        elf,
        kinds,
        fatbin,
        bundles: 0,
        xi,
        x,
        writable: false,
        unit,
        relocs: table.relocs,
        wrappers,
    };
    Ok((input, hole))
}

/// The segment whose file bytes end where `.hip_fatbin` (NOBITS) starts,
/// when that is not the metadata's segment `m`: offload put the metadata in
/// a segment of its own.
fn segment_ending_at(
    elf: &ElfView,
    fatbin: &Fatbin,
    m: &ProgramHeader,
) -> Option<(usize, ProgramHeader)> {
    let ends_at = |p: &ProgramHeader| p.p_vaddr(LE) + p.p_filesz(LE) == fatbin.addr;
    if ends_at(m) {
        return None;
    }
    elf.phdrs()
        .iter()
        .position(|p| p.is_load() && ends_at(p))
        .map(|i| (i, elf.phdrs()[i]))
}

/// X1 (`x`) with the unmapped gap offload left after it as its tail (an
/// empty NOBITS `.hip_fatbin` at its end marks one): up to the next
/// `PT_LOAD`'s page, or, with none, to the next unit boundary; `x` as it is
/// otherwise. Whether there was a gap.
fn with_gap_as_tail(elf: &ElfView, x: ProgramHeader, fatbin: &Fatbin) -> (ProgramHeader, bool) {
    let end = x.p_vaddr(LE) + x.p_memsz(LE);
    // The empty section at X1's end, or over the zeroed end of the range
    // after the gap.
    if x.p_memsz(LE) != x.p_filesz(LE)
        || fatbin.addr < end
        || (fatbin.size == 0) != (fatbin.addr == end)
    {
        return (x, false);
    }
    let unit = x.p_align(LE).max(4096);
    let next = elf
        .phdrs()
        .iter()
        .filter(|p| p.is_load() && p.p_vaddr(LE) >= end)
        .map(|p| p.p_vaddr(LE) / unit * unit)
        .min();
    let Some(gap_end) = next.filter(|&n| n > end) else {
        return (x, false);
    };
    let mut joined = x;
    joined.p_memsz.set(LE, gap_end - x.p_vaddr(LE));
    (joined, true)
}

/// Why an offloaded binary cannot be restored.
fn not_restorable(why: &str) -> TransformError {
    TransformError::NotRestorable(why.to_owned())
}

/// X2 of an offloaded binary: the `PT_LOAD` right after the zero-filled
/// tail of X1 (`x`) in memory and right after X1's bytes in the file, with
/// X1's alignment; none when X1 has no tail. The tail (the removed pages)
/// must be whole pages of `unit`.
fn segment_after_tail(
    elf: &ElfView,
    x: &ProgramHeader,
    unit: u64,
) -> Result<Option<usize>, TransformError> {
    let (x_end, x_file_end) = (
        x.p_vaddr(LE) + x.p_memsz(LE),
        x.p_vaddr(LE) + x.p_filesz(LE),
    );
    if !(x.p_memsz(LE) - x.p_filesz(LE)).is_multiple_of(unit) {
        return Err(not_restorable("the zero-filled tail of the segment holding the metadata is not a whole number of pages"));
    }
    Ok((x_end > x_file_end)
        .then(|| {
            elf.phdrs().iter().position(|p| {
                p.is_load()
                    && p.p_vaddr(LE) == x_end
                    && p.p_offset(LE) == x.p_offset(LE) + x.p_filesz(LE)
                    && p.p_align(LE) == x.p_align(LE)
            })
        })
        .flatten())
}

/// The wrappers of an offloaded binary: every one HIPK, its code object
/// index (in `reserved1`) fitting in 32 bits.
fn hipk_wrappers(table: &WrapperTable) -> Result<Wrappers, TransformError> {
    if !table.all_hipk() {
        return Err(not_restorable("its wrappers are not all HIPK"));
    }
    let mut wrappers = Wrappers::default();
    for slot in &table.slots {
        let p = resolved(slot)?;
        let co_index = u32::try_from(slot.wrapper.reserved1)
            .map_err(|_| not_restorable("a wrapper's code object index does not fit in 32 bits"))?;
        wrappers.push(slot, p, co_index);
    }
    Ok(wrappers)
}

/// The NOBITS `.hip_fatbin` and the `.rocm_kpack_ref` of an offloaded
/// binary; the metadata's header must be the last (as offload writes it),
/// so that dropping it renumbers no section.
fn offloaded_sections(elf: &ElfView) -> Result<(Fatbin, Fatbin), TransformError> {
    let refuse = |why: String| TransformError::NotRestorable(why);
    let describe = |index: usize| {
        let sh = &elf.shdrs()[index];
        Fatbin {
            index,
            addr: sh.sh_addr(LE),
            offset: sh.sh_offset(LE),
            size: sh.sh_size(LE),
        }
    };
    let fi = elf
        .section_index(FATBIN_SECTION)
        .ok_or_else(|| refuse(format!("no {FATBIN_SECTION} section")))?;
    if elf.shdrs()[fi].sh_type(LE) != elf::SHT_NOBITS {
        return Err(refuse(format!(
            "{FATBIN_SECTION} still holds device code: not an offloaded binary"
        )));
    }
    let mi = elf
        .section_index(METADATA_SECTION)
        .ok_or_else(|| refuse(format!("no {METADATA_SECTION} section")))?;
    let m = &elf.shdrs()[mi];
    if m.sh_type(LE) == elf::SHT_NOBITS || m.sh_flags(LE) & u64::from(elf::SHF_ALLOC) == 0 {
        return Err(refuse(format!(
            "{METADATA_SECTION} is not an allocated section with bytes (a debug-info file?)"
        )));
    }
    if mi + 1 != elf.shdrs().len() {
        return Err(refuse(format!(
            "{METADATA_SECTION} is not the last section header (restore handles binaries kpack offloaded)"
        )));
    }
    Ok((describe(fi), describe(mi)))
}

/// The addresses the bundles may take: from the metadata, or from the end
/// of the allocated sections placed after it (a block moved there by
/// offload), to the next allocated section after the NOBITS range (or the
/// end of the memory of X1 and what follows it).
fn free_range(
    elf: &ElfView,
    fatbin: &Fatbin,
    meta: &Fatbin,
    x_end: u64,
) -> Result<(u64, u64), TransformError> {
    let others: Vec<&SectionHeader> = elf
        .shdrs()
        .iter()
        .enumerate()
        .skip(1)
        .filter(|&(i, s)| {
            i != fatbin.index
                && i != meta.index
                && s.sh_flags(LE) & u64::from(elf::SHF_ALLOC) != 0
                && s.sh_size(LE) > 0
        })
        .map(|(_, s)| s)
        .collect();
    let nobits_end = fatbin.end().max(meta.end());
    // Without a next section: the end of the segments holding the range.
    let limit = elf
        .phdrs()
        .iter()
        .filter(|p| p.is_load() && p.p_vaddr(LE) <= nobits_end)
        .map(|p| p.p_vaddr(LE) + p.p_memsz(LE))
        .max()
        .unwrap_or(x_end)
        .max(x_end);
    // Nor past the segments that hold the range: beyond them lies another
    // segment's page, or none.
    let end = others
        .iter()
        .map(|s| s.sh_addr(LE))
        .filter(|&a| a >= nobits_end)
        .min()
        .unwrap_or(limit)
        .min(limit);
    let start = others
        .iter()
        .filter(|s| (meta.addr..nobits_end).contains(&s.sh_addr(LE)))
        .map(|s| s.sh_addr(LE) + s.sh_size(LE))
        .fold(meta.addr, u64::max);
    if start > end {
        return Err(TransformError::NotRestorable(
            "the sections after the metadata overlap the next section".into(),
        ));
    }
    Ok((start, end))
}
