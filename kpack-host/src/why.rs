//! `kpack why`: for each wrapper of an offloaded binary, what the runtime
//! would load for a device with the given ISAs, and why. Each wrapper's
//! load runs through the loader's own search ([`Loader::explain`]: the same
//! code as `kpack_load_code_object`, reporting to a trace), so the answer
//! can never disagree with the runtime: the candidate archives in order
//! (embedded paths with `@GFXARCH@` expanded, `ROCM_KPACK_PATH` /
//! `ROCM_KPACK_PATH_PREFIX` applied), whether each exists, opens, lists a
//! compatible target and holds the key, and the winner or the error code.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::binary::{classify_parsed, Class};
use crate::built_for::{any_taken, built_for, built_without_note, BuiltFor};
use crate::error::{Error, Result, WithPath};
use crate::fatbin::{device_code, DeviceCode};
use crate::input::map_file;
use crate::loader::{Loader, Trace};

/// What the runtime would do for one wrapper.
#[derive(Debug, Clone, Serialize)]
pub struct WrapperWhy {
    pub wrapper: usize,
    pub co_index: u64,
    #[serde(flatten)]
    pub trace: Trace,
    #[serde(flatten)]
    pub result: Outcome,
    /// Set when the load fails because this code object index's bundle
    /// was built without the device's targets (the binary's other bundles
    /// have code for it): nothing is missing, the fat binary had no code
    /// for it either ([`crate::built_for`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The load's result: the code object found, or the error code.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    Loaded {
        archive: PathBuf,
        target: String,
        size: u64,
    },
    Failed {
        /// The `kpack_error_t` value and name `kpack_load_code_object`
        /// returns.
        code: u32,
        error: &'static str,
        message: String,
    },
}

/// The report for a binary.
#[derive(Debug, Clone, Serialize)]
pub struct Why {
    pub binary: PathBuf,
    /// The path the runtime discovers (the mapped file's real path).
    pub binary_path: PathBuf,
    pub kernel_name: String,
    pub search_paths: Vec<String>,
    /// The targets the binary was split for (`kpack_targets`), when it
    /// records them.
    pub targets: Option<Vec<String>>,
    /// Whether one of them runs on a device with these ISAs (`null` when
    /// the binary records no targets): when not, no archive can help.
    pub has_code: Option<bool>,
    /// The device digest of the code it was split from
    /// (`kpack_device_sha256`), when it records one.
    pub device_digest: Option<String>,
    pub archs: Vec<String>,
    pub wrappers: Vec<WrapperWhy>,
}

impl Why {
    /// Whether every wrapper's code object is found, but for those whose
    /// bundle was built without the device's targets (their `note`).
    pub fn all_resolve(&self) -> bool {
        self.wrappers
            .iter()
            .all(|w| matches!(w.result, Outcome::Loaded { .. }) || w.note.is_some())
    }
}

/// Explain every wrapper of the offloaded binary `binary` for `archs` (in
/// priority order, as the HIP runtime passes a device's ISA names), with
/// the loader configured from the environment.
pub fn why(binary: &Path, archs: &[String]) -> Result<Why> {
    why_with(&Loader::from_env(), binary, archs)
}

/// [`why`] with a given loader (and so configuration).
pub(crate) fn why_with(loader: &Loader, binary: &Path, archs: &[String]) -> Result<Why> {
    let request = |what: &str| Error::request(binary, what);
    if archs.is_empty() {
        return Err(request("no architecture given (--arch)"));
    }
    let mapped = map_file(binary)?;
    let file = classify_parsed(&mapped);
    match file.class {
        Class::Offloaded => {}
        Class::Fat => return Err(request(
            "a fat binary: its code objects are inside it (the runtime loads them without kpack)",
        )),
        _ => return Err(request("not an offloaded host binary")),
    }
    let DeviceCode::Offloaded(o) = device_code(binary, &file)? else {
        return Err(request("not an offloaded host binary"));
    };
    let binary_path = std::fs::canonicalize(binary).with_path(binary)?;
    let arch_refs: Vec<&str> = archs.iter().map(String::as_str).collect();
    let mut wrappers = Vec::with_capacity(o.wrappers.len());
    for (i, w) in o.wrappers.iter().enumerate() {
        // The runtime casts reserved1 to a uint32_t.
        let co = w.reserved1 as u32;
        let (result, trace) = loader.explain(&o.metadata, &binary_path, co, &arch_refs);
        let note = match (&result, built_for(&o.metadata, w.reserved1, archs)) {
            (Err(_), BuiltFor::NotInBundle) => Some(built_without_note(w.reserved1, &archs[0])),
            _ => None,
        };
        let result = match result {
            Ok((size, hit)) => Outcome::Loaded {
                archive: hit.archive,
                target: hit.target,
                size,
            },
            Err(e) => Outcome::Failed {
                code: e.code() as u32,
                error: e.code().name(),
                message: e.to_string(),
            },
        };
        wrappers.push(WrapperWhy {
            wrapper: i,
            co_index: w.reserved1,
            trace,
            result,
            note,
        });
    }
    Ok(Why {
        binary: binary.into(),
        binary_path,
        has_code: o.metadata.targets.as_ref().map(|t| any_taken(t, archs)),
        kernel_name: o.metadata.kernel_name,
        search_paths: o.metadata.search_paths,
        targets: o.metadata.targets,
        device_digest: o.metadata.device_digest,
        archs: archs.to_vec(),
        wrappers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::{AttemptOutcome, CandidateStatus, Config};
    use crate::ArchiveWriter;

    fn archive(path: &Path, target: &str, keys: &[&str]) {
        let mut w = ArchiveWriter::new("lib", target, vec![target.into()]);
        for k in keys {
            w.add(*k, target, format!("{k} {target}").into_bytes(), None)
                .unwrap();
        }
        w.write(path).unwrap();
    }

    /// The PyTorch case: the xnack- archive lacks key #1, the plain gfx90a
    /// one has it. The trace shows the fall-through, and a missing archive.
    #[test]
    fn explains_the_xnack_fall_through() {
        let dir = tempfile::tempdir().unwrap();
        let kp = dir.path().join(".kpack");
        std::fs::create_dir_all(&kp).unwrap();
        std::fs::create_dir_all(dir.path().join("lib")).unwrap();
        archive(
            &kp.join("lib_gfx90a:xnack-.kpack"),
            "gfx90a:xnack-",
            &["lib/x.so#0"],
        );
        archive(
            &kp.join("lib_gfx90a.kpack"),
            "gfx90a",
            &["lib/x.so#0", "lib/x.so#1"],
        );
        let meta = crate::hipk::HipkMetadata::new(
            "lib/x.so",
            vec!["../.kpack/lib_@GFXARCH@.kpack".into()],
        );
        let bin = dir.path().join("lib/x.so");
        let loader = Loader::new(Config::default());
        let (r, t) = loader.explain(&meta, &bin, 1, &["amdgcn-amd-amdhsa--gfx90a:xnack-"]);
        let (size, hit) = r.unwrap();
        assert_eq!(size, "lib/x.so#1 gfx90a".len() as u64);
        assert_eq!(hit.target, "gfx90a");
        assert_eq!(t.key, "lib/x.so#1");
        assert_eq!(t.agents[0].targets, ["gfx90a:xnack-", "gfx90a"]);
        assert_eq!(t.candidates.len(), 2);
        assert!(
            matches!(&t.candidates[0].status, CandidateStatus::Opened { targets, .. } if targets == &["gfx90a:xnack-"])
        );
        let tries: Vec<(&str, usize, &AttemptOutcome)> = t
            .attempts
            .iter()
            .map(|a| (a.target.as_str(), a.candidate, &a.outcome))
            .collect();
        assert_eq!(
            tries,
            [
                ("gfx90a:xnack-", 0, &AttemptOutcome::KeyMissing),
                ("gfx90a", 1, &AttemptOutcome::Loaded { size })
            ]
        );
        // No archive for gfx1100: every candidate missing, ARCHIVE_NOT_FOUND.
        let (r, t) = loader.explain(&meta, &bin, 0, &["gfx1100"]);
        assert_eq!(
            r.unwrap_err().code().name(),
            "KPACK_ERROR_ARCHIVE_NOT_FOUND"
        );
        assert!(matches!(
            t.candidates[0].status,
            CandidateStatus::Missing { .. }
        ));
        // A key no archive has: KERNEL_NOT_FOUND after trying both.
        let (r, t) = loader.explain(&meta, &bin, 7, &["gfx90a:xnack-"]);
        assert_eq!(r.unwrap_err().code() as u32, 5);
        assert_eq!(t.attempts.len(), 2);
    }
}
