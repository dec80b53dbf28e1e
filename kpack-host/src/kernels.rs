//! Kernels: the ones a code object defines, and whether a host binary
//! names them (formats.md §6.7, install trees that mix builds).
//!
//! A code object defines a kernel `K` with a kernel descriptor, the symbol
//! `K.kd`. The host binary that launches it registers it with
//! `__hipRegisterFunction`, passing `K` as a NUL-terminated string, which
//! lies in one of its allocated sections and survives strip, hidden
//! visibility and LTO. A code object found under a binary's key whose
//! kernels the binary does not name comes from another build.

use std::collections::{BTreeSet, HashSet};

use object::read::elf::ElfFile64;
use object::{LittleEndian, Object, ObjectSymbol};

use crate::binary::{HostBinary, Role};
use crate::elf::ElfError;

/// The kernels `code_object` (an AMDGPU ELF code object) defines: the
/// names of its `*.kd` symbols (static or dynamic), without the suffix.
pub fn defined_kernels(code_object: &[u8]) -> Result<BTreeSet<String>, ElfError> {
    let file = ElfFile64::<LittleEndian>::parse(code_object)
        .map_err(|e| ElfError::Malformed(format!("code object: {e}")))?;
    let mut out = BTreeSet::new();
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if let Some(kernel) = sym.name().ok().and_then(|n| n.strip_suffix(".kd")) {
            if !kernel.is_empty() {
                out.insert(kernel.to_owned());
            }
        }
    }
    Ok(out)
}

/// How many of the names not found as whole strings are looked for as the
/// tail of a longer string (linkers may merge a string into the end of
/// another); past that, they count as missing.
const TAIL_SEARCHES: usize = 64;

/// The names of `kernels` that `bin` does not carry as a NUL-terminated
/// string in any allocated section with bytes in the file (ELF: every
/// `SHF_ALLOC` section but the device code's own; PE: every section but
/// `.hip_fat`). One pass over the binary for all of them: gather the
/// kernels of every code object first.
pub fn unnamed_kernels(bin: &HostBinary, kernels: &BTreeSet<String>) -> BTreeSet<String> {
    if kernels.is_empty() {
        return BTreeSet::new();
    }
    let sections = host_sections(bin);
    let mut missing: HashSet<&[u8]> = kernels.iter().map(|k| k.as_bytes()).collect();
    for_each_string(&sections, |s| {
        missing.remove(&s);
        !missing.is_empty()
    });
    // Tails of longer strings, for at most TAIL_SEARCHES names.
    let mut tails: Vec<&[u8]> = missing.iter().copied().take(TAIL_SEARCHES).collect();
    if !tails.is_empty() {
        for_each_string(&sections, |s| {
            tails.retain(|t| !s.ends_with(t));
            !tails.is_empty()
        });
        let found: Vec<&[u8]> = missing
            .iter()
            .copied()
            .take(TAIL_SEARCHES)
            .filter(|m| !tails.contains(m))
            .collect();
        for f in found {
            missing.remove(&f);
        }
    }
    missing
        .into_iter()
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .collect()
}

/// The bytes of the host binary's allocated sections, device code left out.
fn host_sections<'a>(bin: &HostBinary<'a>) -> Vec<&'a [u8]> {
    let fatbin = bin.section_name(Role::Fatbin);
    match bin {
        HostBinary::Elf(e) => e
            .sections()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| {
                s.flags & u64::from(object::elf::SHF_ALLOC) != 0
                    && !s.is_nobits()
                    && s.name != fatbin
            })
            .map(|s| s.data)
            .collect(),
        HostBinary::Pe(p) => p
            .sections()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s.name != fatbin)
            .map(|s| s.data)
            .collect(),
    }
}

/// Calls `f` with every NUL-terminated string of `sections` (the bytes
/// before each NUL, back to the previous NUL), until it returns false.
fn for_each_string<'a>(sections: &[&'a [u8]], mut f: impl FnMut(&'a [u8]) -> bool) {
    for &data in sections {
        let mut start = 0;
        for (i, &b) in data.iter().enumerate() {
            if b == 0 {
                if i > start && !f(&data[start..i]) {
                    return;
                }
                start = i + 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_tails() {
        let data = b"\0abc\0_Z4vaddv\0x_Z3fooi\0tail".as_slice();
        let mut seen = Vec::new();
        for_each_string(&[data], |s| {
            seen.push(s.to_vec());
            true
        });
        assert_eq!(
            seen,
            vec![b"abc".to_vec(), b"_Z4vaddv".to_vec(), b"x_Z3fooi".to_vec()]
        );
    }
}
