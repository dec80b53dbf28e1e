//! The verifier of offloaded host binaries (`kpack verify-elf`): checks an
//! ELF file natively against every requirement of SPEC §2.3 that can be
//! seen in the file itself. The transform runs it on its own output before
//! renaming it into place.

use object::elf;
use serde::Serialize;

use crate::elf::{
    pointer_at, read_relas, read_relr, ElfError, Headers, RelocKinds, FATBIN_SECTION,
    METADATA_SECTION, PHDR_SIZE, WRAPPER_SECTION,
};
use crate::hipk::{HipkMetadata, Wrapper, HIPK_MAGIC, MAX_METADATA_SIZE, WRAPPER_SIZE};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error("not a valid offloaded binary: {}", .0.join("; "))]
    Problems(Vec<String>),
}

/// What a valid offloaded binary holds.
#[derive(Debug, Clone, Serialize)]
pub struct Verified {
    pub metadata: HipkMetadata,
    pub metadata_addr: u64,
    /// `reserved1` (the code object index) of each wrapper.
    pub co_indices: Vec<u64>,
}

/// Check an offloaded host binary. With `bundles`, also that every
/// wrapper's code object index names one of that many bundles.
pub fn verify_elf(b: &[u8], bundles: Option<usize>) -> Result<Verified, VerifyError> {
    let h = Headers::parse(b)?;
    let mut problems = Vec::new();
    let mut bad = |s: String| problems.push(s);
    let len = b.len() as u64;
    let is_exec =
        h.file.e_type == elf::ET_EXEC || h.phdrs.iter().any(|p| p.p_type == elf::PT_INTERP);

    // Segments.
    let loads: Vec<_> = h
        .phdrs
        .iter()
        .enumerate()
        .filter(|(_, p)| p.is_load())
        .collect();
    for &(i, p) in &loads {
        if p.p_filesz > p.p_memsz {
            bad(format!(
                "PT_LOAD {i}: file size {:#x} exceeds memory size {:#x}",
                p.p_filesz, p.p_memsz
            ));
        }
        if p.p_offset.checked_add(p.p_filesz).is_none_or(|e| e > len) {
            bad(format!(
                "PT_LOAD {i}: file range runs past the end of the file"
            ));
        }
        if p.p_align > 1 && !p.p_align.is_power_of_two() {
            bad(format!(
                "PT_LOAD {i}: alignment {:#x} is not a power of two",
                p.p_align
            ));
        }
        for a in [p.p_align.max(1), 4096] {
            if p.p_align > 1 && p.p_offset % a != p.p_vaddr % a {
                bad(format!(
                    "PT_LOAD {i}: offset {:#x} and address {:#x} differ modulo {a:#x}",
                    p.p_offset, p.p_vaddr
                ));
            }
        }
    }
    for w in loads.windows(2) {
        let ((i, a), (j, c)) = (w[0], w[1]);
        if c.p_vaddr < a.p_vaddr {
            bad(format!(
                "PT_LOAD {j} comes before PT_LOAD {i} in memory: segments out of order"
            ));
        }
    }
    for (x, &(i, a)) in loads.iter().enumerate() {
        for &(j, c) in &loads[x + 1..] {
            if a.p_filesz > 0 && c.p_filesz > 0 {
                let (s1, e1) = (a.p_offset, a.p_offset + a.p_filesz);
                let (s2, e2) = (c.p_offset, c.p_offset + c.p_filesz);
                if s1 < e2 && s2 < e1 {
                    bad(format!("PT_LOAD {i} and {j} overlap in the file"));
                }
            } else if (a.p_filesz == 0 || c.p_filesz == 0) && a.p_offset == c.p_offset {
                bad(format!(
                    "PT_LOAD {i} and {j} share file offset {:#x} and one has no file bytes",
                    a.p_offset
                ));
            }
            let (s1, e1) = (a.p_vaddr, a.p_vaddr + a.p_memsz);
            let (s2, e2) = (c.p_vaddr, c.p_vaddr + c.p_memsz);
            if s1 < e2 && s2 < e1 {
                bad(format!("PT_LOAD {i} and {j} overlap in memory"));
            }
        }
    }
    let table = (h.phdrs.len() * PHDR_SIZE) as u64;
    if let Some(ph) = h.phdrs.iter().find(|p| p.p_type == elf::PT_PHDR) {
        if ph.p_offset != h.file.e_phoff || ph.p_filesz != table {
            bad(format!(
                "PT_PHDR ({:#x}, {:#x} bytes) does not describe the program header table ({:#x}, {table:#x} bytes)",
                ph.p_offset, ph.p_filesz, h.file.e_phoff
            ));
        }
        let covered = loads.iter().any(|(_, l)| {
            l.file_contains(ph.p_offset, ph.p_filesz)
                && ph.p_vaddr.wrapping_sub(l.p_vaddr) == ph.p_offset.wrapping_sub(l.p_offset)
        });
        if !covered {
            bad("PT_PHDR is not inside a PT_LOAD at a consistent address".into());
        }
        if is_exec {
            if let Some((_, first)) = loads.first() {
                let at_phdr = first
                    .p_vaddr
                    .wrapping_sub(first.p_offset)
                    .wrapping_add(h.file.e_phoff);
                if at_phdr != ph.p_vaddr {
                    bad(format!(
                        "executable: Linux kernels before 5.18 would put AT_PHDR at {at_phdr:#x}, not at the table's address {:#x}",
                        ph.p_vaddr
                    ));
                }
            }
        }
    }

    // Metadata.
    let mut metadata = None;
    let mut metadata_addr = 0;
    match h.section_index(METADATA_SECTION).map(|i| h.shdrs[i]) {
        None => bad(format!("no {METADATA_SECTION} section")),
        Some(s) => {
            metadata_addr = s.sh_addr;
            if s.sh_flags & elf::SHF_ALLOC as u64 == 0 || s.sh_type == elf::SHT_NOBITS {
                bad(format!(
                    "{METADATA_SECTION} is not an allocated section with file bytes"
                ));
            }
            let seg = loads.iter().find(|(_, l)| {
                l.file_contains(s.sh_offset, s.sh_size)
                    && s.sh_addr.wrapping_sub(l.p_vaddr) == s.sh_offset.wrapping_sub(l.p_offset)
            });
            match seg {
                None => bad(format!(
                    "{METADATA_SECTION} is not inside a PT_LOAD at its address"
                )),
                Some((i, l)) if l.p_flags & elf::PF_W != 0 => {
                    bad(format!("{METADATA_SECTION} is in writable PT_LOAD {i}"))
                }
                Some(_) => {}
            }
            let end = s
                .sh_offset
                .saturating_add(s.sh_size.min(MAX_METADATA_SIZE as u64));
            match b
                .get(s.sh_offset as usize..end.min(len) as usize)
                .map(HipkMetadata::decode)
            {
                Some(Ok(m)) => metadata = Some(m),
                Some(Err(e)) => bad(format!("{METADATA_SECTION} does not decode: {e}")),
                None => bad(format!("{METADATA_SECTION} lies outside the file")),
            }
        }
    }

    // The device code is gone.
    let removed = match h.section_index(FATBIN_SECTION).map(|i| h.shdrs[i]) {
        Some(s) if s.sh_type != elf::SHT_NOBITS => {
            bad(format!(
                "{FATBIN_SECTION} still holds device code (not NOBITS)"
            ));
            None
        }
        Some(s) => {
            let r = s.sh_addr..s.sh_addr.saturating_add(s.sh_size);
            // Any file bytes under the NOBITS range must be zero.
            for (_, l) in &loads {
                let lo = r.start.max(l.p_vaddr);
                let hi = r.end.min(l.p_vaddr + l.p_filesz);
                if lo < hi {
                    let off = (lo - l.p_vaddr + l.p_offset) as usize;
                    let n = (hi - lo) as usize;
                    if b.get(off..off + n)
                        .is_none_or(|x| x.iter().any(|&c| c != 0))
                    {
                        bad(format!(
                            "bytes of {FATBIN_SECTION} remain in the file at {off:#x}"
                        ));
                    }
                }
            }
            Some(r)
        }
        None => None,
    };

    // Relocations must not reach the removed range.
    let relas = read_relas(b, &h)?;
    let relr = read_relr(b, &h)?;
    if let Some(r) = &removed {
        let kinds = RelocKinds::for_machine(h.file.e_machine);
        for x in &relas {
            if r.contains(&x.r_offset) {
                bad(format!(
                    "relocation at {:#x} applies to bytes of {FATBIN_SECTION}",
                    x.r_offset
                ));
            }
            if kinds.is_some_and(|k| x.r_type == k.relative) && r.contains(&(x.r_addend as u64)) {
                bad(format!(
                    "relocation at {:#x} points into {FATBIN_SECTION}",
                    x.r_offset
                ));
            }
        }
        for &a in &relr {
            if r.contains(&a) {
                bad(format!(
                    "packed relocation at {a:#x} applies to bytes of {FATBIN_SECTION}"
                ));
            } else if let Some(v) = h
                .addr_to_offset(a, 8)
                .and_then(|o| b.get(o as usize..o as usize + 8))
            {
                let v = u64::from_le_bytes(v.try_into().expect("8 bytes"));
                if r.contains(&v) {
                    bad(format!(
                        "packed relocation at {a:#x} points into {FATBIN_SECTION}"
                    ));
                }
            }
        }
    }

    // Wrappers.
    let mut co_indices = Vec::new();
    match h.section_index(WRAPPER_SECTION).map(|i| h.shdrs[i]) {
        None => bad(format!("no {WRAPPER_SECTION} section")),
        Some(s) if s.sh_size % WRAPPER_SIZE as u64 != 0 || s.sh_type == elf::SHT_NOBITS => bad(
            format!("{WRAPPER_SECTION} is not an array of {WRAPPER_SIZE}-byte wrappers"),
        ),
        Some(s) => {
            for k in 0..s.sh_size / WRAPPER_SIZE as u64 {
                let off = s.sh_offset + k * WRAPPER_SIZE as u64;
                let Some(raw) = b.get(off as usize..off as usize + WRAPPER_SIZE) else {
                    bad(format!("wrapper {k} lies outside the file"));
                    continue;
                };
                let w = Wrapper::parse(raw.try_into().expect("24 bytes"));
                if w.magic != HIPK_MAGIC {
                    bad(format!("wrapper {k}: magic {:#010x} is not HIPK", w.magic));
                }
                if w.version != 1 {
                    bad(format!("wrapper {k}: version {} is not 1", w.version));
                }
                if w.reserved1 > u32::MAX as u64 || bundles.is_some_and(|n| w.reserved1 >= n as u64)
                {
                    bad(format!(
                        "wrapper {k}: code object index {} names no bundle",
                        w.reserved1
                    ));
                }
                co_indices.push(w.reserved1);
                match pointer_at(b, &h, &relas, &relr, s.sh_addr + k * WRAPPER_SIZE as u64 + 8, off + 8) {
                    Ok(p) if metadata.is_some() && p.value != metadata_addr => bad(format!(
                        "wrapper {k}: binary pointer resolves to {:#x}, not the metadata at {metadata_addr:#x}",
                        p.value
                    )),
                    Ok(_) => {}
                    Err(e) => bad(format!("wrapper {k}: {e}")),
                }
            }
        }
    }

    match metadata {
        Some(metadata) if problems.is_empty() => Ok(Verified {
            metadata,
            metadata_addr,
            co_indices,
        }),
        _ => Err(VerifyError::Problems(problems)),
    }
}
