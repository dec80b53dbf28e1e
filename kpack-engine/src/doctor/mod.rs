//! `kpack doctor PATH...`: what is wrong with an installation on this
//! machine, and what to install. Every offloaded binary found under the
//! paths (a `site-packages`, an install prefix, an application folder,
//! single files) is resolved for every target of this machine's GPUs
//! ([`gpus`]: the kernel driver's topology, no ROCm needed) the way the
//! runtime resolves it: the loader's own search, `ROCM_KPACK_*` honoured,
//! each device's ISA then its generic target, as CLR passes them. Each
//! failure gets a fix ([`diagnose`]): the device extra of the wheel that
//! owns the binary ([`dists`]), an archive present elsewhere among the
//! paths and where it must go, or none when the binary was never built for
//! the target (its `kpack_targets`, or failing that the archives present,
//! say so). Fat binaries without code for a target, and what `verify
//! --tree` finds in each tree of archives (fat binaries where offloaded
//! ones belong, code objects of another build, invalid files), are
//! reported too.

mod diagnose;
pub mod dists;
pub mod gpus;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use crate::install_tree::{verify_tree, ProblemKind as TreeKind};
use crate::target::{TargetId, AGENT_ISA_PREFIX};
use crate::{ArtifactError, Observer, Result, Silent};
use kpack_format::processors::generic_target;
use kpack_host::binary::{classify_parsed, could_be_binary, Class};
use kpack_host::fatbin::{device_code, DeviceCode};
use kpack_host::offload::verify_shipped;

pub use gpus::{choose_targets, detect_targets, xnack_from_env};

/// What to check.
#[derive(Debug, Clone)]
pub struct DoctorOptions {
    pub paths: Vec<PathBuf>,
    /// The devices' target IDs (`gfx942:sramecc+:xnack-`), as CLR passes
    /// them: detected ([`detect_targets`]) or given.
    pub targets: Vec<String>,
}

/// What a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// No archive the binary's search reaches serves the target.
    MissingArchive,
    /// The binary has no code for the target: it was never built for it.
    NoCodeForTarget,
    /// An archive lists the target but lacks the binary's code object.
    CodeObjectMissing,
    /// An archive holds the code object, which does not read.
    DamagedArchive,
    /// A fat binary where the tree's archives expect an offloaded one.
    FatBinary,
    /// Code objects of another build under the binary's key.
    ForeignCodeObject,
    /// A binary the verifier refuses.
    InvalidBinary,
    /// An archive that does not open.
    InvalidArchive,
}

/// One problem: the binary (as found under the paths), the target (empty
/// for a problem of the file itself), what is wrong and what was looked
/// for, and the fix (empty when none is known).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Problem {
    pub binary: String,
    pub target: String,
    pub message: String,
    pub fix: String,
    pub kind: ProblemKind,
}

/// A note that is not a problem: a code object of a binary with no code
/// for the target because its bundle was built without it (the binary's
/// `kpack_co_targets`), as in the original fat binary; nothing to install.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct DoctorNote {
    pub binary: String,
    pub target: String,
    pub message: String,
}

/// What doctor found (`--json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct DoctorReport {
    pub targets: Vec<String>,
    pub problems: Vec<Problem>,
    /// Present when there are any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<DoctorNote>,
    /// Host binaries with device code (fat and offloaded).
    pub binaries: usize,
    pub offloaded: usize,
    pub archives: usize,
}

impl DoctorReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The failure the problems make, if any ([`ArtifactError::ProblemsFound`]).
    pub fn check(&self) -> Result<()> {
        match self.problems.len() {
            0 => Ok(()),
            problems => Err(ArtifactError::ProblemsFound { problems }),
        }
    }
}

/// A device target and what the runtime tries for it.
pub(crate) struct Device {
    pub name: String,
    /// Its ISA, then its generic target (CLR's order).
    pub archs: Vec<String>,
    /// Every code-object target the runtime would load for it.
    pub accepts: Vec<TargetId>,
}

impl Device {
    fn new(target: &str) -> Result<Device> {
        let bad = |e: String| ArtifactError::NothingToCheck {
            reason: format!("--arch {target}: {e}"),
        };
        let name = target.strip_prefix(AGENT_ISA_PREFIX).unwrap_or(target);
        let id = TargetId::parse(name).map_err(|e| bad(e.to_string()))?;
        let mut archs = vec![id.to_string()];
        archs.extend(generic_target(&id));
        let mut accepts = Vec::new();
        for a in &archs {
            accepts.extend(
                TargetId::parse(a)
                    .map(|t| t.compatible_targets())
                    .unwrap_or_default(),
            );
        }
        Ok(Device {
            name: id.to_string(),
            archs,
            accepts,
        })
    }

    /// Would the runtime load code built for `target` on this device?
    pub fn takes(&self, target: &str) -> bool {
        TargetId::parse(target).is_ok_and(|t| self.accepts.contains(&t))
    }

    /// The processor (`gfx942`): what device extras are named after.
    pub fn processor(&self) -> &str {
        self.name.split(':').next().unwrap_or(&self.name)
    }
}

/// Check the installation under `opts.paths` for `opts.targets`.
pub fn doctor(opts: &DoctorOptions, observer: &dyn Observer) -> Result<DoctorReport> {
    let devices = devices(opts)?;
    let files = walk(&opts.paths, observer)?;
    let found: Vec<Found> = files.par_iter().map(|p| look_at(p)).collect();
    let mut report = DoctorReport {
        targets: devices.iter().map(|d| d.name.clone()).collect(),
        ..DoctorReport::default()
    };
    let index = diagnose::ArchiveIndex::new(&found, &mut report.problems);
    report.archives = index.len();
    let dists = dists::Dists::read(&dists::site_dirs(&opts.paths));
    let ctx = diagnose::Ctx::new(&devices, &index, &dists);
    let (problems, notes): (Vec<Vec<Problem>>, Vec<Vec<DoctorNote>>) =
        found.par_iter().map(|f| ctx.check(f)).unzip();
    report.notes = notes.into_iter().flatten().collect();
    report.notes.sort();
    report.notes.dedup();
    for f in &found {
        report.binaries += usize::from(matches!(f, Found::Fat { .. } | Found::Offloaded { .. }));
        report.offloaded += usize::from(matches!(f, Found::Offloaded { .. }));
    }
    report.problems.extend(problems.into_iter().flatten());
    report.problems.extend(tree_problems(&found, observer));
    report.problems.sort();
    report
        .problems
        .dedup_by(|a, b| a.binary == b.binary && a.message == b.message);
    observer.note(&format!(
        "doctor: {} binar{} with device code ({} offloaded), {} archive(s), targets {}",
        report.binaries,
        if report.binaries == 1 { "y" } else { "ies" },
        report.offloaded,
        report.archives,
        report.targets.join(", ")
    ));
    Ok(report)
}

/// The devices to check for; the paths must exist.
fn devices(opts: &DoctorOptions) -> Result<Vec<Device>> {
    for p in &opts.paths {
        if std::fs::symlink_metadata(p).is_err() {
            return Err(ArtifactError::NothingToCheck {
                reason: format!("{}: no such file or directory", p.display()),
            });
        }
    }
    if opts.targets.is_empty() {
        return Err(ArtifactError::NothingToCheck {
            reason: "no GPU target to check for".into(),
        });
    }
    let mut out: Vec<Device> = Vec::new();
    for t in &opts.targets {
        let d = Device::new(t)?;
        if !out.iter().any(|o| o.name == d.name) {
            out.push(d);
        }
    }
    Ok(out)
}

/// What a file under the paths is, for doctor.
pub(crate) enum Found {
    /// An offloaded binary: its metadata and code object indices, or why
    /// the verifier refuses it.
    Offloaded {
        path: PathBuf,
        checked: std::result::Result<kpack_host::offload::Verified, String>,
    },
    /// A fat binary and the targets its bundles hold.
    Fat {
        path: PathBuf,
        targets: Vec<String>,
    },
    /// A binary whose device-code parts contradict each other.
    Invalid {
        path: PathBuf,
        why: String,
    },
    /// A `.kpack` archive.
    Archive {
        path: PathBuf,
    },
    Other,
}

/// Classify one file (a file that cannot be read is nothing doctor
/// checks: it is not a binary the runtime can load either).
fn look_at(path: &Path) -> Found {
    let mut head = Vec::with_capacity(8);
    let opened = std::fs::File::open(path).and_then(|f| f.take(8).read_to_end(&mut head));
    if opened.is_err() {
        return Found::Other;
    }
    if head.starts_with(crate::archive::MAGIC) {
        return Found::Archive { path: path.into() };
    }
    if !could_be_binary(&head) {
        return Found::Other;
    }
    let Ok(mapped) = kpack_loader::map_file(path) else {
        return Found::Other;
    };
    let file = classify_parsed(&mapped);
    match &file.class {
        Class::Offloaded => Found::Offloaded {
            path: path.into(),
            checked: verify_shipped(file.bytes).map_err(|e| e.to_string()),
        },
        Class::Fat => match device_code(path, &file) {
            Ok(DeviceCode::Fat(f)) => Found::Fat {
                path: path.into(),
                targets: f
                    .bundles
                    .iter()
                    .flat_map(|b| b.entries.iter().filter(|e| !e.is_host()))
                    .map(|e| e.target().to_string())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
            },
            Ok(_) => Found::Other,
            Err(e) => Found::Invalid {
                path: path.into(),
                why: e.to_string(),
            },
        },
        Class::Inconsistent(why) => Found::Invalid {
            path: path.into(),
            why: why.to_string(),
        },
        _ => Found::Other,
    }
}

/// Every regular file under `paths` (a path that is a file: itself),
/// symlinks not followed, in sorted order; unreadable directories are
/// skipped with a warning.
fn walk(paths: &[PathBuf], observer: &dyn Observer) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::symlink_metadata(p).map_err(|e| ArtifactError::io(p, e))?;
        if meta.is_dir() {
            walk_dir(p, &mut out, observer);
        } else if meta.is_file() || meta.file_type().is_symlink() && p.is_file() {
            out.push(p.clone());
        }
    }
    // Paths that overlap give a file once.
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| seen.insert(dists::lexical(p)));
    Ok(out)
}

fn walk_dir(dir: &Path, out: &mut Vec<PathBuf>, observer: &dyn Observer) {
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => return observer.warn(&format!("{}: skipped: {e}", dir.display())),
    };
    let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        match e.file_type() {
            Ok(t) if t.is_dir() => walk_dir(&e.path(), out, observer),
            Ok(t) if t.is_file() => out.push(e.path()),
            _ => {}
        }
    }
}

/// What `verify --tree` finds in each tree of archives among the files
/// (the directory holding a `.kpack` directory, or the archives' own):
/// fat binaries where offloaded ones belong, code objects of another
/// build, invalid binaries. (Its `unresolved` and `missing_target` are
/// doctor's own checks, per target;
/// invalid archives doctor reports itself.)
fn tree_problems(found: &[Found], observer: &dyn Observer) -> Vec<Problem> {
    let mut roots: BTreeSet<PathBuf> = BTreeSet::new();
    for f in found {
        let Found::Archive { path } = f else { continue };
        let Some(dir) = path.parent() else { continue };
        let root = match dir.file_name() {
            Some(n) if n == ".kpack" => dir.parent().unwrap_or(dir),
            _ => dir,
        };
        roots.insert(root.to_path_buf());
    }
    let mut out = Vec::new();
    for root in roots {
        let report = match verify_tree(&root, &Silent) {
            Ok(r) => r,
            Err(e) => {
                observer.warn(&format!("{}: not checked as a tree: {e}", root.display()));
                continue;
            }
        };
        for p in report.problems {
            let (kind, fix) = match p.kind {
                TreeKind::Unresolved | TreeKind::MissingTarget | TreeKind::InvalidArchive => continue,
                TreeKind::FatBinary => (
                    ProblemKind::FatBinary,
                    "reinstall the package: its host files and its archives must come from one build",
                ),
                TreeKind::ForeignCodeObject => (
                    ProblemKind::ForeignCodeObject,
                    "reinstall the package: the binary and its archives come from different builds",
                ),
                TreeKind::InvalidBinary => (ProblemKind::InvalidBinary, "reinstall the file"),
            };
            out.push(Problem {
                binary: root.join(&p.binary).display().to_string(),
                target: String::new(),
                message: p.message,
                fix: fix.to_string(),
                kind,
            });
        }
    }
    out
}
