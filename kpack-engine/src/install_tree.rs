//! `kpack verify --tree DIR` (formats.md §6.7): an install tree (host-only
//! binaries plus `.kpack` archives, as pack-tree and flattened TheRock
//! installs lay them out) checked, without a GPU, for what makes a GPU
//! program fail at run time when builds get mixed:
//!
//! - a fat binary whose tree-relative path is a key of the tree's archives
//!   (the host artifact was replaced by a build that was not offloaded: HIP
//!   loads its embedded code, for the wrong targets);
//! - an offloaded binary that resolves for no target at all (one missing
//!   target among several is not a problem: components ship different
//!   target sets);
//! - code objects of another build under a binary's keys, by the rule of
//!   [`crate::build_match`]: entries whose provenance digest is not the
//!   binary's (the runtime passes them over; a runtime that does not check
//!   digests would load them), and, without digests, code objects none of
//!   whose kernels (`<name>.kd` symbols) the host binary names;
//! - a code object index whose bundle was built without a target while
//!   others were (`kpack_co_targets`, [`kpack_host::built_for`]) is a
//!   note, not a problem: the fat binary had no code for it either;
//! - and what the binary verifier checks of each offloaded binary, and that
//!   every archive reads.
//!
//! Each code object a binary's wrappers resolve to is read once, through
//! the runtime's own search ([`Loader::load_target`] for each target the
//! tree's archives serve), and its symbol table read; each binary's
//! strings are scanned once for all the kernels of its code objects. A code
//! object must be what its target runs (a SPIR-V module for SPIR-V, else an
//! ELF file); one that is not is an invalid archive.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use rayon::prelude::*;
use serde::Serialize;

use crate::build_match::{kernels_of, other_builds, unnamed_only, OtherBuild, Resolved};
use crate::loader::{Config, Loader, Trace};
use crate::target::TargetId;
use crate::tree::{rel_string, scan, NodeKind};
use crate::{ArtifactError, Observer, Result};
use kpack_host::binary::{classify_parsed, could_be_binary, Class, HostBinary};
use kpack_host::built_for::{built_for, built_without_note, BuiltFor};
use kpack_host::fatbin::{device_code, DeviceCode};
use kpack_host::offload::verify_shipped;

/// What a problem is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// A fat binary at a path the tree's archives hold code objects for.
    FatBinary,
    /// An offloaded binary whose code objects no archive serves, for any
    /// target.
    Unresolved,
    /// A target the binary records (`kpack_targets`) and the tree's
    /// archives serve, for which none of its code objects resolves.
    MissingTarget,
    /// A code object under the binary's key defines only kernels the
    /// binary does not name: another build's.
    ForeignCodeObject,
    /// The binary verifier refuses the binary.
    InvalidBinary,
    /// An archive that does not read, or a code object that does not.
    InvalidArchive,
}

/// One problem: the binary (or archive) by its path in the tree.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct TreeProblem {
    pub binary: String,
    pub kind: ProblemKind,
    pub message: String,
}

/// A note on a binary: a code object index not looked for in a target's
/// archives, its bundle built without that target.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct TreeNote {
    pub binary: String,
    pub message: String,
}

/// What `verify --tree` found (`--json`: the problems, and the notes when
/// there are any).
#[derive(Debug, Clone, Default, Serialize)]
pub struct TreeReport {
    pub problems: Vec<TreeProblem>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<TreeNote>,
    /// Host binaries with device code looked at (fat and offloaded).
    #[serde(skip)]
    pub binaries: usize,
    #[serde(skip)]
    pub offloaded: usize,
    #[serde(skip)]
    pub archives: usize,
    /// Code objects read through the loader.
    #[serde(skip)]
    pub code_objects: usize,
    /// Targets the tree's archives serve.
    #[serde(skip)]
    pub targets: Vec<String>,
    /// The reference tools' defects accepted (see the binary verifier).
    #[serde(skip)]
    pub warnings: Vec<String>,
}

impl TreeReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The failure the problems make, if any ([`ArtifactError::VerifyFailed`]).
    pub fn check(&self) -> Result<()> {
        ArtifactError::verify_failed(self.problems.len())
    }
}

/// What the tree's archives hold.
#[derive(Default)]
struct Archives {
    /// Kernel names (keys without `#N`).
    names: BTreeSet<String>,
    targets: BTreeSet<String>,
}

impl Archives {
    /// The kernel name of the archives that the binary at `rel` has: `rel`
    /// itself (pack-tree, wheels), or a name ending in `/rel` (split: the
    /// artifact's install prefix comes first).
    fn key_of(&self, rel: &str) -> Option<&String> {
        let tail = format!("/{rel}");
        self.names.iter().find(|n| *n == rel || n.ends_with(&tail))
    }
}

/// One file's findings.
#[derive(Default)]
struct Checked {
    problems: Vec<TreeProblem>,
    notes: Vec<TreeNote>,
    warnings: Vec<String>,
    binary: bool,
    offloaded: bool,
    code_objects: usize,
}

/// Verify the install tree `root`.
pub fn verify_tree(root: &Path, observer: &dyn Observer) -> Result<TreeReport> {
    let files: Vec<String> = scan(root)?
        .into_iter()
        .filter(|n| matches!(n.kind, NodeKind::File { .. }))
        .filter_map(|n| rel_string(&n.rel))
        .collect();
    let (archive_files, others): (Vec<&String>, Vec<&String>) =
        files.iter().partition(|f| f.ends_with(".kpack"));
    let mut report = TreeReport {
        archives: archive_files.len(),
        ..TreeReport::default()
    };
    let mut archives = Archives::default();
    for rel in &archive_files {
        match kpack_loader::open_archive(root.join(rel)) {
            Ok(a) => {
                archives.targets.extend(a.gfx_arches().iter().cloned());
                archives.names.extend(
                    a.binaries()
                        .map(|k| k.rsplit_once('#').map_or(k, |(n, _)| n).to_string()),
                );
            }
            Err(e) => report.problems.push(TreeProblem {
                binary: rel.to_string(),
                kind: ProblemKind::InvalidArchive,
                message: e.to_string(),
            }),
        }
    }
    observer.note(&format!(
        "{}: {} archive(s), targets {}",
        root.display(),
        archive_files.len(),
        archives
            .targets
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let targets: Vec<TargetId> = archives
        .targets
        .iter()
        .filter_map(|t| TargetId::parse(t).ok())
        .collect();
    let loader = Loader::new(Config::default());
    // Archives are named by their path in the tree (the loader gives real
    // paths).
    let real_root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let checked: Vec<Checked> = others
        .par_iter()
        .map(|rel| check_file(root, &real_root, rel, &archives, &targets, &loader))
        .collect();
    for c in checked {
        report.binaries += usize::from(c.binary);
        report.offloaded += usize::from(c.offloaded);
        report.code_objects += c.code_objects;
        report.problems.extend(c.problems);
        report.notes.extend(c.notes);
        report.warnings.extend(c.warnings);
    }
    for w in &report.warnings {
        observer.warn(w);
    }
    report.problems.sort();
    report.notes.sort();
    report.targets = archives.targets.into_iter().collect();
    Ok(report)
}

/// The checks of one file of the tree (nothing for a file that is not a
/// host binary with device code).
fn check_file(
    root: &Path,
    real_root: &Path,
    rel: &str,
    archives: &Archives,
    targets: &[TargetId],
    loader: &Loader,
) -> Checked {
    let mut out = Checked::default();
    let path = root.join(rel);
    let Ok(mapped) = kpack_loader::map_file(&path) else {
        return out;
    };
    if !could_be_binary(&mapped[..mapped.len().min(8)]) {
        return out;
    }
    let file = classify_parsed(&mapped);
    let problem = |kind, message: String| tree_problem(rel, kind, message);
    match &file.class {
        Class::Fat => {
            out.binary = true;
            // MIOpen's per-target CK libraries: wheels archive their code
            // objects and install the fat library as it is too.
            let claimed = crate::databases::classify(&[crate::Database::Miopen], rel).is_some();
            if let Some(key) = archives.key_of(rel).filter(|_| !claimed) {
                let fat_targets = match device_code(&path, &file) {
                    Ok(DeviceCode::Fat(f)) => {
                        let t: BTreeSet<String> = f
                            .bundles
                            .iter()
                            .flat_map(|b| b.device_entries().map(|e| e.target().to_string()))
                            .collect();
                        t.into_iter().collect::<Vec<_>>().join(", ")
                    }
                    _ => "unknown targets".into(),
                };
                out.problems.push(problem(
                    ProblemKind::FatBinary,
                    format!(
                        "a fat binary (HIPF wrappers, device code for {fat_targets}) where the tree's archives hold code objects for {key}: a build that was not offloaded replaced the offloaded one, and HIP loads its embedded code instead"
                    ),
                ));
            }
        }
        Class::Offloaded => {
            out.binary = true;
            out.offloaded = true;
            check_offloaded(&mut out, &path, real_root, rel, &file, targets, loader);
        }
        Class::Inconsistent(why) => {
            out.binary = true;
            out.problems
                .push(problem(ProblemKind::InvalidBinary, why.to_string()));
        }
        _ => {}
    }
    out
}

/// An offloaded binary: valid, resolving for some target, and its code
/// objects of its own build ([`crate::build_match`]).
fn check_offloaded(
    out: &mut Checked,
    path: &Path,
    real_root: &Path,
    rel: &str,
    file: &kpack_host::binary::Classified,
    targets: &[TargetId],
    loader: &Loader,
) {
    let v = match verify_shipped(file.bytes) {
        Ok(v) => v,
        Err(e) => {
            out.problems
                .push(tree_problem(rel, ProblemKind::InvalidBinary, e.to_string()));
            return;
        }
    };
    out.warnings
        .extend(v.warnings.iter().map(|w| format!("{rel}: {w}")));
    let Ok(bin) = &file.binary else {
        return;
    };
    let shown = |archive: &Path| {
        archive
            .strip_prefix(real_root)
            .unwrap_or(archive)
            .display()
            .to_string()
    };
    let (found, others) = resolve_all(out, rel, loader, &v, path, targets, &shown);
    other_build_archives(out, rel, &others, &shown);
    if found.is_empty() {
        let t: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
        out.problems.push(tree_problem(
            rel,
            ProblemKind::Unresolved,
            format!(
                "resolves for no target: no archive its search paths ({}) reach holds {}#N for any of {}",
                v.metadata.search_paths.join(", "),
                v.metadata.kernel_name,
                if t.is_empty() { "the tree's targets (it has no archive)".into() } else { t.join(", ") }
            ),
        ));
        return;
    }
    missing_targets(out, rel, &v.metadata, targets, &found);
    unnamed_kernel_archives(out, rel, bin, &found);
}

/// A problem of the binary (or archive) at `rel`.
fn tree_problem(rel: &str, kind: ProblemKind, message: String) -> TreeProblem {
    TreeProblem {
        binary: rel.to_string(),
        kind,
        message,
    }
}

/// (target, co_index) -> what was found for it.
type FoundMap = BTreeMap<(String, u64), Found>;

/// Every (target, code object) of the binary through the loader, in
/// parallel (one big binary has hundreds): what resolved, and the entries
/// of another build passed over on the way. Read failures are problems.
fn resolve_all(
    out: &mut Checked,
    rel: &str,
    loader: &Loader,
    v: &kpack_host::offload::Verified,
    path: &Path,
    targets: &[TargetId],
    shown: &(dyn Fn(&Path) -> String + Sync),
) -> (FoundMap, Vec<OtherBuild>) {
    let mut cos = v.co_indices.clone();
    cos.sort_unstable();
    cos.dedup();
    let pairs: Vec<(&TargetId, u64)> = targets
        .iter()
        .flat_map(|t| cos.iter().map(move |&co| (t, co)))
        .filter(|&(_, co)| u32::try_from(co).is_ok())
        .filter(|&(t, co)| {
            let name = t.to_string();
            let built = built_for(&v.metadata, co, &[&name]) != BuiltFor::NotInBundle;
            if !built {
                out.notes.push(TreeNote {
                    binary: rel.to_string(),
                    message: built_without_note(co, &name),
                });
            }
            built
        })
        .collect();
    let loaded: Vec<(Loaded, Vec<OtherBuild>)> = pairs
        .par_iter()
        .map(|&(t, co)| load_one(loader, &v.metadata, path, t, co, shown))
        .collect();
    let mut found = FoundMap::new();
    let mut others = Vec::new();
    for (&(t, co), (l, passed)) in pairs.iter().zip(loaded) {
        others.extend(passed.into_iter().map(|o| (co, o)));
        match l {
            Loaded::Found(f) => {
                out.code_objects += 1;
                found.insert((t.to_string(), co), f);
            }
            Loaded::Missing => {}
            Loaded::Failed(kind, message) => out.problems.push(tree_problem(rel, kind, message)),
        }
    }
    let others = others
        .into_iter()
        .map(|(co, mut o)| {
            o.target = format!("#{co} for {}", o.target);
            o
        })
        .collect();
    (found, others)
}

/// One problem per archive holding entries of another build by their
/// digests (`others`: each target given as `#co for target`).
fn other_build_archives(
    out: &mut Checked,
    rel: &str,
    others: &[OtherBuild],
    shown: &dyn Fn(&Path) -> String,
) {
    let mut by_archive: BTreeMap<(String, String), Vec<&str>> = BTreeMap::new();
    for o in others {
        by_archive
            .entry((shown(&o.archive), o.builds()))
            .or_default()
            .push(&o.target);
    }
    for ((archive, builds), cos) in by_archive {
        out.problems.push(tree_problem(
            rel,
            ProblemKind::ForeignCodeObject,
            format!(
                "code objects of another build in {archive}: {} ({builds}): the runtime passes them over, and a runtime that does not check digests would load them",
                cos.join(", ")
            ),
        ));
    }
}

/// One problem per archive holding code objects none of whose kernels the
/// binary names (the rule without digests).
fn unnamed_kernel_archives(out: &mut Checked, rel: &str, bin: &HostBinary, found: &FoundMap) {
    let resolved: Vec<Resolved> = found
        .values()
        .map(|f| Resolved {
            kernels: &f.kernels,
            same_build: f.same_build,
        })
        .collect();
    let foreign = unnamed_only(bin, &resolved);
    let mut by_archive: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut example = None;
    for (((t, co), f), _) in found.iter().zip(&foreign).filter(|(_, &x)| x) {
        if let Some(k) = f.kernels.first() {
            example.get_or_insert_with(|| k.clone());
        }
        let n = f.kernels.len();
        by_archive
            .entry(&f.archive)
            .or_default()
            .push(format!("#{co} for {t} ({n} kernels)"));
    }
    for (archive, list) in by_archive {
        out.problems.push(tree_problem(
            rel,
            ProblemKind::ForeignCodeObject,
            format!(
                "code objects of another build in {archive}: {} define only kernels this binary does not name (e.g. {}): HIP would not find the binary's kernels there",
                list.join(", "),
                example.as_deref().unwrap_or("?")
            ),
        ));
    }
}

/// The targets the binary records that the tree's archives serve, but for
/// which none of its code objects resolves (`found`: by target and code
/// object index). Targets no archive of the tree serves are not a problem:
/// an install may hold some targets only.
fn missing_targets<V>(
    out: &mut Checked,
    rel: &str,
    metadata: &kpack_format::hipk::HipkMetadata,
    targets: &[TargetId],
    found: &BTreeMap<(String, u64), V>,
) {
    let Some(recorded) = &metadata.targets else {
        return;
    };
    for t in targets {
        let name = t.to_string();
        let recorded_here = recorded
            .iter()
            .any(|r| TargetId::parse(r).as_ref() == Ok(t));
        if recorded_here && !found.keys().any(|(ft, _)| *ft == name) {
            out.problems.push(tree_problem(
                rel,
                ProblemKind::MissingTarget,
                format!(
                    "split for {name} (kpack_targets), and the tree's archives serve {name}, but none its search paths ({}) reach holds {}#N for it",
                    metadata.search_paths.join(", "),
                    metadata.kernel_name
                ),
            ));
        }
    }
}

/// A code object found for one (target, code object) of a binary.
struct Found {
    /// The archive (shown path).
    archive: String,
    /// The kernels it defines.
    kernels: BTreeSet<String>,
    /// Its entry records the binary's own device digest.
    same_build: bool,
}

/// What the loader gave for one (target, code object) of a binary.
enum Loaded {
    Found(Found),
    /// No archive has it for that target.
    Missing,
    Failed(ProblemKind, String),
}

/// Load code object `co` of the binary at `path` for exactly `t` and list
/// the kernels it defines (none for a SPIR-V module), with the entries of
/// another build the search passed over.
fn load_one(
    loader: &Loader,
    metadata: &kpack_format::hipk::HipkMetadata,
    path: &Path,
    t: &TargetId,
    co: u64,
    shown: &dyn Fn(&Path) -> String,
) -> (Loaded, Vec<OtherBuild>) {
    let key = format!("{}#{co}", metadata.kernel_name);
    let mut trace = Trace::default();
    let r = loader.load_target_traced(metadata, path, co as u32, t, Some(&mut trace));
    let loaded = match r {
        Ok(Some((bytes, hit))) => {
            let archive = shown(&hit.archive);
            match kernels_of(&bytes, &t.to_string()) {
                Ok(kernels) => Loaded::Found(Found {
                    archive,
                    kernels,
                    same_build: hit.same_build,
                }),
                Err(e) => Loaded::Failed(
                    ProblemKind::InvalidArchive,
                    format!("{key} for {t} in {archive}: {e}"),
                ),
            }
        }
        Ok(None) => Loaded::Missing,
        Err(e) => Loaded::Failed(ProblemKind::InvalidArchive, format!("{key} for {t}: {e}")),
    };
    (loaded, other_builds(&trace))
}
