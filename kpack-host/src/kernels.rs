//! Kernels: the ones a code object defines, and whether a host binary
//! names them (formats.md §6.7, install trees that mix builds).
//!
//! A code object defines a kernel `K` with a kernel descriptor, the symbol
//! `K.kd`. The host binary that launches it registers it with
//! `__hipRegisterFunction`, passing `K` as a NUL-terminated string, which
//! lies in one of its allocated sections and survives strip, hidden
//! visibility and LTO. A code object found under a binary's key whose
//! kernels the binary does not name comes from another build.

use std::collections::{BTreeSet, HashMap};

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

/// The target ID a code object was built for, as its AMDGPU metadata note
/// records it (`amdhsa.target`, e.g. `amdgcn-amd-amdhsa--gfx90a:xnack-`;
/// the part after `--`); `None` when it has no such note (code object
/// version 2 and older).
pub fn code_object_target(code_object: &[u8]) -> Option<String> {
    use object::read::elf::{FileHeader as _, SectionHeader as _};
    let header = object::elf::FileHeader64::<LittleEndian>::parse(code_object).ok()?;
    let sections = header.sections(LittleEndian, code_object).ok()?;
    for section in sections.iter() {
        let Ok(Some(mut notes)) = section.notes(LittleEndian, code_object) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == b"AMDGPU" && note.n_type(LittleEndian) == NT_AMDGPU_METADATA {
                let md = crate::msgpack::decode(note.desc()).ok()?;
                let target = crate::msgpack::get(&md, "amdhsa.target")?.as_str()?;
                return target.split_once("--").map(|(_, t)| t.to_owned());
            }
        }
    }
    None
}

/// The note type of an AMDGPU code object's metadata (MessagePack).
const NT_AMDGPU_METADATA: u32 = 32;

/// The names of `kernels` that `bin` does not carry as a NUL-terminated
/// string in any allocated section with bytes in the file (ELF: every
/// `SHF_ALLOC` section but the device code's own; PE: every section but
/// `.hip_fat`). A name may be the tail of a longer run of bytes: linkers
/// merge a string into the end of another, and a merged string section
/// can follow other data with no NUL in between. One pass over the binary
/// for all of them: gather the kernels of every code object first.
pub fn unnamed_kernels(bin: &HostBinary, kernels: &BTreeSet<String>) -> BTreeSet<String> {
    if kernels.is_empty() {
        return BTreeSet::new();
    }
    let names: Vec<&[u8]> = kernels.iter().map(|k| k.as_bytes()).collect();
    let trie = Suffixes::new(&names);
    let mut found = vec![false; names.len()];
    let mut left = names.len();
    for data in host_sections(bin) {
        for (i, _) in data.iter().enumerate().filter(|&(_, &b)| b == 0) {
            trie.ending_at(&data[..i], |k| {
                if !found[k] {
                    found[k] = true;
                    left -= 1;
                }
            });
            if left == 0 {
                return BTreeSet::new();
            }
        }
    }
    kernels
        .iter()
        .zip(found)
        .filter(|(_, f)| !f)
        .map(|(k, _)| k.clone())
        .collect()
}

/// The names, reversed, in a trie: which of them a run of bytes ends with.
struct Suffixes {
    /// The root's children by byte (0: none).
    root: [u32; 256],
    /// Every other edge: (node, byte) -> node.
    edges: HashMap<(u32, u8), u32>,
    /// Per node, the name that ends there (is spelled by the path to it).
    ends: Vec<Option<usize>>,
}

impl Suffixes {
    fn new(names: &[&[u8]]) -> Suffixes {
        let mut t = Suffixes {
            root: [0; 256],
            edges: HashMap::new(),
            ends: vec![None],
        };
        for (k, name) in names.iter().enumerate() {
            let mut node = 0u32;
            for &b in name.iter().rev() {
                let next = t.child(node, b).unwrap_or_else(|| {
                    t.ends.push(None);
                    let n = (t.ends.len() - 1) as u32;
                    if node == 0 {
                        t.root[b as usize] = n;
                    } else {
                        t.edges.insert((node, b), n);
                    }
                    n
                });
                node = next;
            }
            t.ends[node as usize] = Some(k);
        }
        t
    }

    fn child(&self, node: u32, b: u8) -> Option<u32> {
        if node == 0 {
            Some(self.root[b as usize]).filter(|&n| n != 0)
        } else {
            self.edges.get(&(node, b)).copied()
        }
    }

    /// Calls `f` with every name `bytes` ends with.
    fn ending_at(&self, bytes: &[u8], mut f: impl FnMut(usize)) {
        let mut node = 0;
        for &b in bytes.iter().rev() {
            match self.child(node, b) {
                Some(n) => node = n,
                None => return,
            }
            if let Some(k) = self.ends[node as usize] {
                f(k);
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_ending_runs_of_bytes() {
        let names: [&[u8]; 4] = [b"_Z4vaddv", b"vaddv", b"_Z3fooi", b"_ZL3bari"];
        let t = Suffixes::new(&names);
        let hits = |bytes: &[u8]| {
            let mut v = Vec::new();
            t.ending_at(bytes, |k| v.push(k));
            v
        };
        // A whole string, and the tail it shares with another name.
        assert_eq!(hits(b"\0_Z4vaddv"), vec![1, 0]);
        // After other data with no NUL in between (a jump table).
        assert_eq!(hits(b"\x88\xff_ZL3bari"), vec![3]);
        assert_eq!(hits(b"x_Z3fooi"), vec![2]);
        assert!(hits(b"_Z3fooix").is_empty());
        assert!(hits(b"").is_empty());
    }
}
