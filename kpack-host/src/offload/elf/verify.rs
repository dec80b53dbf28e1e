//! The verifier of rewritten host binaries (`kpack verify-elf`): checks an
//! ELF file natively against every requirement of formats.md §4.3 that can be
//! seen in the file itself. [`verify_elf`] checks offloaded binaries,
//! [`verify_fat`] fat ones (what prune and restore write); both share the
//! segment and program header checks. The transform runs them on its own
//! output before renaming it into place.
//!
//! Each check is one function that adds what it finds wrong to a list, so
//! that a report names every problem at once.

use object::elf;
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _};
use serde::Serialize;

use crate::binary::HostBinary;
use crate::bundle::{check_fatbin, list_fatbin};
use crate::elf::{
    offset_mapping_problems, ElfView, PhdrExt, ProgramHeader, RelocKinds, Relocations,
    FATBIN_SECTION, LE, METADATA_SECTION, PHDR_SIZE, WRAPPER_SECTION,
};
use crate::hipk::{HipkMetadata, HIPF_MAGIC, MAX_METADATA_SIZE};
use crate::offload::verify::{check_hipk_wrapper, Verified, VerifyError};

/// Which binaries [`verify_elf_with`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// Every rule of formats.md §4.3, to the letter: what kpack writes (its
    /// self-check before an output is renamed into place).
    Own,
    /// Also binaries the reference tools wrote with one of the two defects
    /// they shipped, which load and run (formats.md §4.3): a
    /// `.hip_fatbin` with no whole page left PROGBITS with its bytes, and
    /// a `PT_PHDR` larger than the program header table. Each is accepted
    /// with a warning; anything else (a wrong magic, overwritten
    /// metadata) is still a problem.
    Shipped,
}

/// What a check found: problems (the binary is refused) and, under
/// [`Rules::Shipped`], warnings.
struct Findings {
    rules: Rules,
    problems: Vec<String>,
    warnings: Vec<String>,
}

impl Findings {
    fn new(rules: Rules) -> Findings {
        Findings {
            rules,
            problems: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// A defect the reference tools ship: a warning under
    /// [`Rules::Shipped`], else a problem.
    fn quirk(&mut self, warning: String, problem: String) {
        match self.rules {
            Rules::Shipped => self.warnings.push(warning),
            Rules::Own => self.problems.push(problem),
        }
    }
}

type Loads<'a> = Vec<(usize, &'a ProgramHeader)>;

/// The `PT_LOAD`s (with their indices), after the segment and program
/// header table rules that every rewritten binary keeps.
fn check_loads<'a>(elf: &ElfView<'a>, found: &mut Findings) -> Loads<'a> {
    let loads: Loads = elf
        .phdrs()
        .iter()
        .enumerate()
        .filter(|(_, p)| p.is_load())
        .collect();
    check_segments(elf, &loads, &mut found.problems);
    check_program_header_table(elf, &loads, found);
    loads
}

/// The sections kpack writes (`.hip_fatbin` made NOBITS, the metadata) map
/// by their file offsets to the segments that hold them, as eu-elflint,
/// objcopy and strip map sections ([`offset_mapping_problems`]).
fn check_offset_mapping(elf: &ElfView, found: &mut Findings) {
    for (i, p) in offset_mapping_problems(elf.phdrs(), elf.shdrs()) {
        let Ok(name) = elf.section_name(i) else {
            continue;
        };
        if name == FATBIN_SECTION || name == METADATA_SECTION {
            let what = format!("section {name}: {}", p.describe());
            found.quirk(
                format!("{what} (readers that map sections by file offset complain)"),
                what,
            );
        }
    }
}

/// Check an offloaded host binary against every rule ([`Rules::Own`]).
/// With `bundles`, also that every wrapper's code object index names one
/// of that many bundles.
pub fn verify_elf(b: &[u8], bundles: Option<usize>) -> Result<Verified, VerifyError> {
    verify_elf_with(b, bundles, Rules::Own)
}

/// [`verify_elf`] under the given [`Rules`].
pub fn verify_elf_with(
    b: &[u8],
    bundles: Option<usize>,
    rules: Rules,
) -> Result<Verified, VerifyError> {
    let elf = &ElfView::parse(b)?;
    let bin = HostBinary::Elf(*elf);
    elf.check_sections()?;
    let relocs = Relocations::read(elf)?;
    let mut found = Findings::new(rules);
    let loads = check_loads(elf, &mut found);
    check_offset_mapping(elf, &mut found);
    let metadata = check_metadata(elf, &loads, &mut found.problems);
    if let Some(removed) = check_device_code_gone(elf, &loads, &mut found) {
        check_relocations(elf, &relocs, &removed, &mut found.problems);
    }
    let metadata_addr = metadata.as_ref().map(|(_, a)| *a);
    let co_indices = check_wrappers(&bin, metadata_addr, bundles, &mut found.problems);
    match metadata {
        Some((metadata, metadata_addr)) if found.problems.is_empty() => Ok(Verified {
            metadata,
            metadata_addr,
            co_indices,
            warnings: found.warnings,
        }),
        _ => Err(VerifyError::Problems(found.problems)),
    }
}

/// Every `PT_LOAD` is sound, congruent, in order, and none overlaps another.
fn check_segments(elf: &ElfView, loads: &Loads, bad: &mut Vec<String>) {
    let len = elf.bytes().len() as u64;
    for &(i, p) in loads {
        let (off, vaddr, filesz, memsz, align) = (
            p.p_offset(LE),
            p.p_vaddr(LE),
            p.p_filesz(LE),
            p.p_memsz(LE),
            p.p_align(LE),
        );
        if filesz > memsz {
            bad.push(format!(
                "PT_LOAD {i}: file size {filesz:#x} exceeds memory size {memsz:#x}"
            ));
        }
        // A segment without file bytes reads nothing: its offset may lie
        // past the end (offload puts a detached zero-filled range there).
        if filesz > 0 && off.checked_add(filesz).is_none_or(|e| e > len) {
            bad.push(format!(
                "PT_LOAD {i}: file range runs past the end of the file"
            ));
        }
        if align > 1 && !align.is_power_of_two() {
            bad.push(format!(
                "PT_LOAD {i}: alignment {align:#x} is not a power of two"
            ));
        }
        for a in [align.max(1), 4096] {
            if align > 1 && off % a != vaddr % a {
                bad.push(format!(
                    "PT_LOAD {i}: offset {off:#x} and address {vaddr:#x} differ modulo {a:#x}"
                ));
            }
        }
    }
    for w in loads.windows(2) {
        let ((i, a), (j, c)) = (w[0], w[1]);
        if c.p_vaddr(LE) < a.p_vaddr(LE) {
            bad.push(format!(
                "PT_LOAD {j} comes before PT_LOAD {i} in memory: segments out of order"
            ));
        }
    }
    for (x, &(i, a)) in loads.iter().enumerate() {
        for &(j, c) in &loads[x + 1..] {
            check_pair(i, a, j, c, bad);
        }
    }
}

/// Two `PT_LOAD`s overlap neither in the file nor in memory, and a
/// zero-filesz one shares no file offset with the other.
fn check_pair(i: usize, a: &ProgramHeader, j: usize, c: &ProgramHeader, bad: &mut Vec<String>) {
    let overlap = |s1: u64, e1: u64, s2: u64, e2: u64| s1 < e2 && s2 < e1;
    let (a_off, a_fsz, c_off, c_fsz) = (
        a.p_offset(LE),
        a.p_filesz(LE),
        c.p_offset(LE),
        c.p_filesz(LE),
    );
    if a_fsz > 0 && c_fsz > 0 {
        if overlap(a_off, a_off + a_fsz, c_off, c_off + c_fsz) {
            bad.push(format!("PT_LOAD {i} and {j} overlap in the file"));
        }
    } else if a_off == c_off {
        bad.push(format!(
            "PT_LOAD {i} and {j} share file offset {a_off:#x} and one has no file bytes"
        ));
    }
    let (a_va, c_va) = (a.p_vaddr(LE), c.p_vaddr(LE));
    if overlap(a_va, a_va + a.p_memsz(LE), c_va, c_va + c.p_memsz(LE)) {
        bad.push(format!("PT_LOAD {i} and {j} overlap in memory"));
    }
}

/// `PT_PHDR` describes the table, a `PT_LOAD` maps it at its address, and
/// in an executable it lies where Linux kernels before 5.18 compute
/// `AT_PHDR`: (first `PT_LOAD`'s `p_vaddr - p_offset`) + `e_phoff`. A
/// `PT_PHDR` that starts at the table but is larger (the reference tools
/// reserve room for more headers; ld.so and the kernel read `e_phnum`
/// entries) is a quirk ([`Findings::quirk`]).
fn check_program_header_table(elf: &ElfView, loads: &Loads, found: &mut Findings) {
    let phoff = elf.header().e_phoff(LE);
    let table = (elf.phdrs().len() * PHDR_SIZE) as u64;
    let Some(ph) = elf.phdrs().iter().find(|p| p.p_type(LE) == elf::PT_PHDR) else {
        return;
    };
    let (ph_off, ph_size, ph_addr) = (ph.p_offset(LE), ph.p_filesz(LE), ph.p_vaddr(LE));
    let describes = format!(
        "PT_PHDR ({ph_off:#x}, {ph_size:#x} bytes) does not describe the program header table ({phoff:#x}, {table:#x} bytes)"
    );
    if ph_off == phoff && ph_size > table && ph.p_memsz(LE) >= ph_size {
        found.quirk(
            format!(
                "PT_PHDR covers {ph_size:#x} bytes, the program header table {table:#x} (room the reference tools reserve for more headers; loaders read e_phnum entries)"
            ),
            describes,
        );
    } else if ph_off != phoff || ph_size != table {
        found.problems.push(describes);
    }
    let bad = &mut found.problems;
    let covered = loads.iter().any(|(_, l)| {
        l.file_contains(ph_off, ph_size)
            && ph_addr.wrapping_sub(l.p_vaddr(LE)) == ph_off.wrapping_sub(l.p_offset(LE))
    });
    if !covered {
        bad.push("PT_PHDR is not inside a PT_LOAD at a consistent address".into());
    }
    let is_exec =
        elf.e_type() == elf::ET_EXEC || elf.phdrs().iter().any(|p| p.p_type(LE) == elf::PT_INTERP);
    if let (true, Some((_, first))) = (is_exec, loads.first()) {
        let at_phdr = first
            .p_vaddr(LE)
            .wrapping_sub(first.p_offset(LE))
            .wrapping_add(phoff);
        if at_phdr != ph_addr {
            bad.push(format!(
                "executable: Linux kernels before 5.18 would put AT_PHDR at {at_phdr:#x}, not at the table's address {ph_addr:#x}"
            ));
        }
    }
}

/// `.rocm_kpack_ref` is allocated, inside a read-only `PT_LOAD` at its
/// address, and decodes. Returns the metadata and its address.
fn check_metadata(
    elf: &ElfView,
    loads: &Loads,
    bad: &mut Vec<String>,
) -> Option<(HipkMetadata, u64)> {
    let Some(i) = elf.section_index(METADATA_SECTION) else {
        bad.push(format!("no {METADATA_SECTION} section"));
        return None;
    };
    let s = &elf.shdrs()[i];
    let (addr, off, size) = (s.sh_addr(LE), s.sh_offset(LE), s.sh_size(LE));
    if s.sh_flags(LE) & u64::from(elf::SHF_ALLOC) == 0 || s.sh_type(LE) == elf::SHT_NOBITS {
        bad.push(format!(
            "{METADATA_SECTION} is not an allocated section with file bytes"
        ));
    }
    let seg = loads.iter().find(|(_, l)| {
        l.file_contains(off, size)
            && addr.wrapping_sub(l.p_vaddr(LE)) == off.wrapping_sub(l.p_offset(LE))
    });
    match seg {
        None => bad.push(format!(
            "{METADATA_SECTION} is not inside a PT_LOAD at its address"
        )),
        Some((i, l)) if l.p_flags(LE) & elf::PF_W != 0 => {
            bad.push(format!("{METADATA_SECTION} is in writable PT_LOAD {i}"))
        }
        Some(_) => {}
    }
    let len = elf.bytes().len() as u64;
    let end = off.saturating_add(size.min(MAX_METADATA_SIZE as u64));
    match elf
        .bytes()
        .get(off as usize..end.min(len) as usize)
        .map(HipkMetadata::decode)
    {
        Some(Ok(m)) => Some((m, addr)),
        Some(Err(e)) => {
            bad.push(format!("{METADATA_SECTION} does not decode: {e}"));
            None
        }
        None => {
            bad.push(format!("{METADATA_SECTION} lies outside the file"));
            None
        }
    }
}

/// `.hip_fatbin` is NOBITS and no byte of it is left in the file. Returns
/// its address range, for the relocation checks.
///
/// A PROGBITS `.hip_fatbin` that holds no whole 4 KiB page of the file is
/// what the reference tools leave (they remove whole pages only): a quirk
/// ([`Findings::quirk`]), the warning naming the leftover device bytes.
fn check_device_code_gone(
    elf: &ElfView,
    loads: &Loads,
    found: &mut Findings,
) -> Option<std::ops::Range<u64>> {
    let s = &elf.shdrs()[elf.section_index(FATBIN_SECTION)?];
    let r = s.sh_addr(LE)..s.sh_addr(LE).saturating_add(s.sh_size(LE));
    if s.sh_type(LE) != elf::SHT_NOBITS {
        let (off, size) = (s.sh_offset(LE), s.sh_size(LE));
        let problem = format!("{FATBIN_SECTION} still holds device code (not NOBITS)");
        if off.next_multiple_of(4096).saturating_add(4096) > off.saturating_add(size) {
            found.quirk(
                format!(
                    "{FATBIN_SECTION} is left in the file with its device code: {size} bytes at file offset {off:#x} (the reference tools remove whole pages only; the wrappers do not use them)"
                ),
                problem,
            );
            return Some(r);
        }
        found.problems.push(problem);
        return None;
    }
    let bad = &mut found.problems;
    // Any file bytes under the NOBITS range must be zero.
    for (_, l) in loads {
        let lo = r.start.max(l.p_vaddr(LE));
        let hi = r.end.min(l.p_vaddr(LE) + l.p_filesz(LE));
        if lo < hi {
            let off = (lo - l.p_vaddr(LE) + l.p_offset(LE)) as usize;
            let n = (hi - lo) as usize;
            let bytes = elf.bytes().get(off..off + n);
            if bytes.is_none_or(|x| x.iter().any(|&c| c != 0)) {
                bad.push(format!(
                    "bytes of {FATBIN_SECTION} remain in the file at {off:#x}"
                ));
            }
        }
    }
    Some(r)
}

/// No relocation applies to, or points into, the removed range.
fn check_relocations(
    elf: &ElfView,
    relocs: &Relocations,
    removed: &std::ops::Range<u64>,
    bad: &mut Vec<String>,
) {
    check_relocations_into(elf, relocs, removed, FATBIN_SECTION, bad)
}

/// No relocation applies to, or points into, `range` (named `what`).
fn check_relocations_into(
    elf: &ElfView,
    relocs: &Relocations,
    removed: &std::ops::Range<u64>,
    what: &str,
    bad: &mut Vec<String>,
) {
    let kinds = RelocKinds::for_machine(elf.machine());
    for x in relocs.relas(elf) {
        if removed.contains(&x.r_offset) {
            bad.push(format!(
                "relocation at {:#x} applies to bytes of {what}",
                x.r_offset
            ));
        }
        if kinds.is_some_and(|k| x.r_type == k.relative) && removed.contains(&(x.r_addend as u64)) {
            bad.push(format!(
                "relocation at {:#x} points into {what}",
                x.r_offset
            ));
        }
    }
    for a in relocs.relr(elf) {
        if removed.contains(&a) {
            bad.push(format!(
                "packed relocation at {a:#x} applies to bytes of {what}"
            ));
            continue;
        }
        let value = elf.relr_value(a);
        if value.is_some_and(|v| removed.contains(&v)) {
            bad.push(format!("packed relocation at {a:#x} points into {what}"));
        }
    }
}

/// Every wrapper is HIPK version 1 with a code object index in range, and
/// its pointer resolves to the metadata. Returns the code object indices.
fn check_wrappers(
    bin: &HostBinary,
    metadata_addr: Option<u64>,
    bundles: Option<usize>,
    bad: &mut Vec<String>,
) -> Vec<u64> {
    let HostBinary::Elf(elf) = bin else {
        return Vec::new();
    };
    match elf.section(WRAPPER_SECTION) {
        Ok(None) => {
            bad.push(format!("no {WRAPPER_SECTION} section"));
            return Vec::new();
        }
        Ok(Some(s)) if s.is_nobits() => {
            bad.push(format!("{WRAPPER_SECTION} has no bytes in the file"));
            return Vec::new();
        }
        Ok(Some(_)) => {}
        Err(e) => {
            bad.push(e.to_string());
            return Vec::new();
        }
    }
    let table = match bin.wrappers() {
        Ok(t) => t,
        Err(e) => {
            bad.push(e.to_string());
            return Vec::new();
        }
    };
    let mut co_indices = Vec::with_capacity(table.len());
    for slot in &table.slots {
        let k = slot.index;
        co_indices.push(check_hipk_wrapper(slot, bundles, bad));
        match (&slot.pointer, metadata_addr) {
            (Ok(p), Some(m)) if p.value != m => bad.push(format!(
                "wrapper {k}: binary pointer resolves to {:#x}, not the metadata at {m:#x}",
                p.value
            )),
            (Ok(_), _) => {}
            (Err(e), _) => bad.push(format!("wrapper {k}: {e}")),
        }
    }
    co_indices
}

/// What a valid fat binary (a pruned or restored one) holds.
#[derive(Debug, Clone, Serialize)]
pub struct VerifiedFat {
    /// Bundles in `.hip_fatbin`.
    pub bundles: usize,
    /// Device targets of those bundles, sorted.
    pub targets: Vec<String>,
    /// Per wrapper: the index of the bundle its pointer names.
    pub wrapper_bundles: Vec<usize>,
}

/// Check a fat binary: the segment and program header rules of
/// [`verify_elf`]; `.hip_fatbin` PROGBITS inside a read-only `PT_LOAD` at
/// its address, holding valid bundles; no `.rocm_kpack_ref` left with
/// bytes; every wrapper HIPF version 1 whose pointer resolves to the start
/// of one of those bundles; no relocation applying to, or pointing into,
/// the zero-filled part of a read-only `PT_LOAD` (pages removed by prune).
pub fn verify_fat(b: &[u8]) -> Result<VerifiedFat, VerifyError> {
    verify_fat_as(b, true)
}

/// [`verify_fat`] that reads compressed bundles only as far as their entry
/// tables ([`crate::bundle::list_fatbin`]) instead of decompressing them
/// whole: for a tool checking bundles it has just compressed itself
/// (restore), which would otherwise hold a decompression window of up to
/// 128 MiB next to the whole output. `kpack verify-elf` checks everything.
pub fn verify_fat_layout(b: &[u8]) -> Result<VerifiedFat, VerifyError> {
    verify_fat_as(b, false)
}

fn verify_fat_as(b: &[u8], whole: bool) -> Result<VerifiedFat, VerifyError> {
    let elf = &ElfView::parse(b)?;
    let bin = HostBinary::Elf(*elf);
    elf.check_sections()?;
    let relocs = Relocations::read(elf)?;
    let mut found = Findings::new(Rules::Own);
    let loads = check_loads(elf, &mut found);
    let mut problems = found.problems;
    if matches!(elf.section(METADATA_SECTION), Ok(Some(m)) if !m.is_nobits()) {
        problems.push(format!("a {METADATA_SECTION} section is left"));
    }
    for (i, l) in &loads {
        let (start, end) = (
            l.p_vaddr(LE) + l.p_filesz(LE),
            l.p_vaddr(LE) + l.p_memsz(LE),
        );
        if l.p_flags(LE) & elf::PF_W == 0 && start < end {
            check_relocations_into(
                elf,
                &relocs,
                &(start..end),
                &format!("the zero-filled part of PT_LOAD {i}"),
                &mut problems,
            );
        }
    }
    let found = check_bundles(elf, &loads, whole, &mut problems);
    let wrapper_bundles = match &found {
        Some((addr, starts, _)) => check_fat_wrappers(&bin, *addr, starts, &mut problems),
        None => Vec::new(),
    };
    match found {
        Some((_, starts, targets)) if problems.is_empty() => Ok(VerifiedFat {
            bundles: starts.len(),
            targets,
            wrapper_bundles,
        }),
        _ => Err(VerifyError::FatProblems(problems)),
    }
}

/// `.hip_fatbin` with bytes, in a read-only `PT_LOAD` at its address,
/// parsing as bundles: its address, the offset of each bundle's start in
/// it (with the bundle's index), and the device targets, sorted.
type Bundles = (u64, Vec<(usize, usize)>, Vec<String>);

fn check_bundles(
    elf: &ElfView,
    loads: &Loads,
    whole: bool,
    bad: &mut Vec<String>,
) -> Option<Bundles> {
    let s = match elf.section(FATBIN_SECTION) {
        Ok(Some(s)) if !s.is_nobits() => s,
        Ok(_) => {
            bad.push(format!("no {FATBIN_SECTION} section with bytes"));
            return None;
        }
        Err(e) => {
            bad.push(e.to_string());
            return None;
        }
    };
    let seg = loads.iter().find(|(_, l)| {
        l.file_contains(s.offset, s.size)
            && s.addr.wrapping_sub(l.p_vaddr(LE)) == s.offset.wrapping_sub(l.p_offset(LE))
    });
    // A writable segment may hold it (linker scripts put it after .bss):
    // the bundles are read, never written.
    if seg.is_none() {
        bad.push(format!(
            "{FATBIN_SECTION} is not inside a PT_LOAD at its address"
        ));
    }
    // Compressed bundles are decompressed to be checked, as a stream: only
    // their entry tables are kept (or, not `whole`, only those are read).
    let (mut starts, mut targets) = (Vec::new(), Vec::new());
    let listed = if whole {
        check_fatbin(s.data)
    } else {
        list_fatbin(s.data)
    };
    match listed {
        Ok(bundles) => {
            for b in bundles {
                starts.push((b.range.start, b.index));
                targets.extend(b.device_entries().map(|e| e.target().to_string()));
            }
        }
        Err(e) => {
            bad.push(format!("{FATBIN_SECTION}: {e}"));
            return None;
        }
    }
    targets.sort();
    targets.dedup();
    Some((s.addr, starts, targets))
}

/// Every wrapper is HIPF version 1 and its pointer resolves to the start of
/// a bundle. Returns the bundle index of each.
fn check_fat_wrappers(
    bin: &HostBinary,
    fatbin_addr: u64,
    starts: &[(usize, usize)],
    bad: &mut Vec<String>,
) -> Vec<usize> {
    let table = match bin.wrappers() {
        Ok(t) if !t.is_empty() => t,
        Ok(_) => {
            bad.push(format!("no wrappers in {WRAPPER_SECTION}"));
            return Vec::new();
        }
        Err(e) => {
            bad.push(e.to_string());
            return Vec::new();
        }
    };
    let mut out = Vec::with_capacity(table.len());
    for slot in &table.slots {
        let (k, w) = (slot.index, slot.wrapper);
        if w.magic != HIPF_MAGIC {
            bad.push(format!("wrapper {k}: magic {:#010x} is not HIPF", w.magic));
        }
        if w.version != 1 {
            bad.push(format!("wrapper {k}: version {} is not 1", w.version));
        }
        let value = match &slot.pointer {
            Ok(p) => p.value,
            Err(e) => {
                bad.push(format!("wrapper {k}: {e}"));
                continue;
            }
        };
        let hit = value
            .checked_sub(fatbin_addr)
            .and_then(|rel| starts.iter().find(|&&(s, _)| s as u64 == rel));
        match hit {
            Some(&(_, index)) => out.push(index),
            None => bad.push(format!(
                "wrapper {k}: binary pointer {value:#x} is not the start of a bundle in {FATBIN_SECTION}"
            )),
        }
    }
    out
}
