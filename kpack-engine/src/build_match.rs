//! Whether the code objects an installed binary resolves to come from its
//! own build: the one rule of `verify`, `verify --tree` and `doctor`
//! (formats.md §6.7).
//!
//! - A code object loaded for a target must be what the target runs: a
//!   SPIR-V module for SPIR-V targets (it names no kernels kpack reads),
//!   an ELF file for every other, whose kernels are its `<name>.kd`
//!   symbols ([`kernels_of`]).
//! - Where the binary and an archive entry both carry provenance digests,
//!   they decide: an entry whose binary digest is not the binary's device
//!   digest is another build's. The loader passes over such entries (as
//!   over a missing key); [`other_builds`] reads them from its trace. An
//!   entry with the binary's own digest is of its build, whatever it
//!   defines.
//! - Without digests, a code object none of whose kernels the host binary
//!   names (as a NUL-terminated string in its allocated sections) is
//!   another build's ([`unnamed_only`]). Not "every kernel must be named":
//!   real builds define kernels their host code never registers (Debian's
//!   librocsparse: up to half of a code object's kernels), while a code
//!   object of another build shares no kernel with the binary.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::loader::{AttemptOutcome, CandidateStatus, Trace};
use crate::target::TargetId;
use kpack_host::binary::HostBinary;
use kpack_host::elf::ElfError;
use kpack_host::kernels::{defined_kernels, unnamed_kernels};

/// The first word of a SPIR-V module (0x07230203), as stored.
const SPIRV_MAGIC: [u8; 4] = 0x0723_0203u32.to_le_bytes();

/// Why loaded bytes are not a code object for their target.
#[derive(Debug)]
pub(crate) enum NotCodeObject {
    /// Not the kind of file the target runs ("a SPIR-V module", "an ELF
    /// file").
    Kind(&'static str),
    /// An ELF file whose symbols do not read.
    Elf(ElfError),
}

impl std::fmt::Display for NotCodeObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotCodeObject::Kind(what) => write!(f, "is not {what}"),
            NotCodeObject::Elf(e) => write!(f, "{e}"),
        }
    }
}

/// The kernels of a code object loaded for `target`: those an ELF file
/// defines, none for a SPIR-V module.
pub(crate) fn kernels_of(bytes: &[u8], target: &str) -> Result<BTreeSet<String>, NotCodeObject> {
    let spirv = TargetId::parse(target).is_ok_and(|t| t.is_spirv());
    match (spirv, bytes) {
        (true, b) if b.starts_with(&SPIRV_MAGIC) => Ok(BTreeSet::new()),
        (true, _) => Err(NotCodeObject::Kind("a SPIR-V module")),
        (false, b) if b.starts_with(b"\x7fELF") => defined_kernels(b).map_err(NotCodeObject::Elf),
        (false, _) => Err(NotCodeObject::Kind("an ELF file")),
    }
}

/// A code object a binary resolved to, as the kernel rule sees it.
pub(crate) struct Resolved<'a> {
    pub kernels: &'a BTreeSet<String>,
    /// Its entry records the binary's own device digest.
    pub same_build: bool,
}

/// For each of `cos` (code objects `bin` resolved to), whether it is
/// another build's by its kernels: it defines some, and `bin` names none of
/// them. Those whose digests prove them the binary's own are not looked at;
/// `bin`'s strings are scanned once for all the others' kernels.
pub(crate) fn unnamed_only(bin: &HostBinary, cos: &[Resolved]) -> Vec<bool> {
    let all: BTreeSet<String> = cos
        .iter()
        .filter(|c| !c.same_build)
        .flat_map(|c| c.kernels.iter().cloned())
        .collect();
    if all.is_empty() {
        return vec![false; cos.len()];
    }
    let missing = unnamed_kernels(bin, &all);
    cos.iter()
        .map(|c| {
            !c.same_build && !c.kernels.is_empty() && c.kernels.iter().all(|k| missing.contains(k))
        })
        .collect()
}

/// An archive entry the loader passed over: split from another build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OtherBuild {
    /// The archive (its canonical path).
    pub archive: PathBuf,
    /// The target tried.
    pub target: String,
    /// The binary's device digest.
    pub binary: String,
    /// The device digest the entry records.
    pub entry: String,
}

impl OtherBuild {
    /// The two builds in words (shortened digests).
    pub fn builds(&self) -> String {
        kpack_format::provenance::builds(&self.binary, &self.entry)
    }
}

/// The entries of another build a load passed over, from its trace.
pub(crate) fn other_builds(trace: &Trace) -> Vec<OtherBuild> {
    trace
        .attempts
        .iter()
        .filter_map(|a| {
            let AttemptOutcome::OtherBuild { binary, archive } = &a.outcome else {
                return None;
            };
            let c = trace.candidates.get(a.candidate)?;
            let path = match &c.status {
                CandidateStatus::Opened { canonical, .. } => canonical.clone(),
                _ => c.path.clone(),
            };
            Some(OtherBuild {
                archive: path,
                target: a.target.clone(),
                binary: binary.clone(),
                entry: archive.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_objects_are_what_their_target_runs() {
        let spirv = SPIRV_MAGIC.to_vec();
        assert!(kernels_of(&spirv, "amdgcnspirv").unwrap().is_empty());
        let e = kernels_of(&spirv, "gfx942").unwrap_err();
        assert_eq!(e.to_string(), "is not an ELF file");
        let e = kernels_of(b"\x7fELF\x02\x01", "amdgcnspirv").unwrap_err();
        assert_eq!(e.to_string(), "is not a SPIR-V module");
        assert!(matches!(
            kernels_of(b"\x7fELF\x02\x01", "gfx942"),
            Err(NotCodeObject::Elf(_))
        ));
    }
}
