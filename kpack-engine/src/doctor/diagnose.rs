//! One binary's problems for each device, and what fixes each: the
//! loader's search for every code object (the runtime's own), then, for
//! what does not load, why and what to do.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::dists::{lexical, Dists};
use super::{Device, DoctorNote, Found, Problem, ProblemKind};
use crate::hipk::HipkMetadata;
use crate::loader::{AttemptOutcome, CandidateStatus, LoadError, Loader, Trace};
use kpack_host::built_for::{built_for, built_without_note, BuiltFor};

/// An archive found under the paths.
pub(crate) struct Indexed {
    pub path: PathBuf,
    /// Its real path (the loader's candidates are real paths).
    pub real: PathBuf,
    pub targets: Vec<String>,
    pub keys: HashSet<String>,
}

/// Every archive found under the paths.
pub(crate) struct ArchiveIndex(Vec<Indexed>);

impl ArchiveIndex {
    /// Open every archive of `found`; one that does not open is a problem.
    pub fn new(found: &[Found], problems: &mut Vec<Problem>) -> ArchiveIndex {
        let mut out = Vec::new();
        for f in found {
            let Found::Archive { path } = f else { continue };
            match kpack_loader::open_archive(path) {
                Ok(a) => out.push(Indexed {
                    real: std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()),
                    path: path.clone(),
                    targets: a.gfx_arches().to_vec(),
                    keys: a.binaries().map(str::to_owned).collect(),
                }),
                Err(e) => problems.push(Problem {
                    binary: path.display().to_string(),
                    target: String::new(),
                    message: e.to_string(),
                    fix: "reinstall the archive".into(),
                    kind: ProblemKind::InvalidArchive,
                }),
            }
        }
        ArchiveIndex(out)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// An archive holding `key` for a target `device` takes, other than
    /// those at `except` (real paths).
    fn holding(&self, key: &str, device: &Device, except: &[PathBuf]) -> Option<&Indexed> {
        self.0.iter().find(|a| {
            a.keys.contains(key)
                && a.targets.iter().any(|t| device.takes(t))
                && !except.contains(&a.real)
        })
    }
}

/// What every binary's check shares.
pub(crate) struct Ctx<'a> {
    loader: Loader,
    devices: &'a [Device],
    archives: &'a ArchiveIndex,
    dists: &'a Dists,
}

/// One failed load: the code object index, the error, the trace.
struct Failure {
    co: u32,
    error: LoadError,
    trace: Trace,
}

impl<'a> Ctx<'a> {
    pub fn new(devices: &'a [Device], archives: &'a ArchiveIndex, dists: &'a Dists) -> Ctx<'a> {
        Ctx {
            loader: Loader::from_env(),
            devices,
            archives,
            dists,
        }
    }

    /// The problems of one file, and its notes.
    pub fn check(&self, f: &Found) -> (Vec<Problem>, Vec<DoctorNote>) {
        let problems = match f {
            Found::Offloaded { path, checked } => match checked {
                Ok(v) => return self.offloaded(path, &v.metadata, &v.co_indices),
                Err(why) => vec![invalid(path, why)],
            },
            Found::Fat { path, targets } => self.fat(path, targets),
            Found::Invalid { path, why } => vec![invalid(path, why)],
            Found::Archive { .. } | Found::Other => Vec::new(),
        };
        (problems, Vec::new())
    }

    /// A fat binary: the runtime loads its own code, which must include
    /// each device's.
    fn fat(&self, path: &Path, targets: &[String]) -> Vec<Problem> {
        let has = if targets.is_empty() {
            "none".to_string()
        } else {
            targets.join(", ")
        };
        self.devices
            .iter()
            .filter(|d| !targets.iter().any(|t| d.takes(t)))
            .map(|d| Problem {
                binary: path.display().to_string(),
                target: d.name.clone(),
                message: format!(
                    "a fat binary without code for {} (it carries {has}): its package has no code for this GPU",
                    d.name
                ),
                fix: String::new(),
                kind: ProblemKind::NoCodeForTarget,
            })
            .collect()
    }

    /// An offloaded binary: every code object through the loader, for each
    /// device; one problem per device with failures. A code object whose
    /// bundle was built without the device's targets (while others were)
    /// is a note: the fat binary had no code for it either.
    fn offloaded(
        &self,
        path: &Path,
        meta: &HipkMetadata,
        cos: &[u64],
    ) -> (Vec<Problem>, Vec<DoctorNote>) {
        let mut cos: Vec<u32> = cos.iter().filter_map(|&c| u32::try_from(c).ok()).collect();
        cos.sort_unstable();
        cos.dedup();
        let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut out = Vec::new();
        let mut notes = Vec::new();
        for d in self.devices {
            let archs: Vec<&str> = d.archs.iter().map(String::as_str).collect();
            let (without, failures): (Vec<Failure>, Vec<Failure>) = cos
                .iter()
                .filter_map(|&co| {
                    let (r, trace) = self.loader.explain(meta, &real, co, &archs);
                    r.err().map(|error| Failure { co, error, trace })
                })
                .partition(|f| built_for(meta, f.co.into(), &archs) == BuiltFor::NotInBundle);
            notes.extend(without.iter().map(|f| DoctorNote {
                binary: path.display().to_string(),
                target: d.name.clone(),
                message: built_without_note(f.co.into(), &d.name),
            }));
            if let Some(first) = failures.first() {
                let what = Problem {
                    binary: path.display().to_string(),
                    target: d.name.clone(),
                    message: String::new(),
                    fix: String::new(),
                    kind: ProblemKind::MissingArchive,
                };
                let n = (failures.len(), cos.len());
                out.push(self.diagnose(what, d, meta, &real, first, n));
            }
        }
        (out, notes)
    }

    /// Why `first` (one of `n.0` failing code objects of `n.1`) does not
    /// load on `d`, and the fix.
    fn diagnose(
        &self,
        mut p: Problem,
        d: &Device,
        meta: &HipkMetadata,
        real: &Path,
        first: &Failure,
        n: (usize, usize),
    ) -> Problem {
        let of = format!("{} of {} code object(s) do not load", n.0, n.1);
        if let LoadError::Disabled = first.error {
            p.message = format!("{of}: {}", first.error);
            p.fix = format!("unset {}", kpack_loader::ENV_DISABLE);
            return p;
        }
        if let Some(t) = meta
            .targets
            .as_ref()
            .filter(|t| !t.iter().any(|t| d.takes(t)))
        {
            p.kind = ProblemKind::NoCodeForTarget;
            p.message = format!(
                "{of}: the binary has no code for {}: it was split for {} only (its package has no code for this GPU)",
                d.name,
                if t.is_empty() { "no target".to_string() } else { t.join(", ") }
            );
            return p;
        }
        if let Some((tried, outcome)) = tried(&first.trace) {
            return self.in_archive(p, &of, meta, first, (&tried, outcome));
        }
        self.missing(p, &of, d, meta, real, first)
    }

    /// An archive listing the target was tried: it lacks the code object,
    /// or it does not read.
    fn in_archive(
        &self,
        mut p: Problem,
        of: &str,
        meta: &HipkMetadata,
        first: &Failure,
        (tried, outcome): (&Path, &AttemptOutcome),
    ) -> Problem {
        let key = format!("{}#{}", meta.kernel_name, first.co);
        let reinstall = match self.dists.owner(tried) {
            Some(dist) => format!("pip install --force-reinstall \"{}\"", dist.name),
            None => format!(
                "reinstall {} from the build of this binary",
                tried.display()
            ),
        };
        p.fix = reinstall;
        if let AttemptOutcome::OtherBuild { binary, archive } = outcome {
            p.kind = ProblemKind::ForeignCodeObject;
            p.message = format!(
                "{of}: {} holds {key} of another build: {}",
                tried.display(),
                kpack_format::provenance::builds(binary, archive)
            );
        } else if let LoadError::Read { .. } = first.error {
            p.kind = ProblemKind::DamagedArchive;
            p.message = format!(
                "{of}: {} holds {key} but it does not read: {}",
                tried.display(),
                first.error
            );
        } else {
            p.kind = ProblemKind::CodeObjectMissing;
            p.message = format!(
                "{of}: {} serves this GPU but holds no {key}: an archive of another build, or an incomplete one",
                tried.display()
            );
        }
        p
    }

    /// No archive serving the device was found: which fix applies.
    fn missing(
        &self,
        mut p: Problem,
        of: &str,
        d: &Device,
        meta: &HipkMetadata,
        real: &Path,
        first: &Failure,
    ) -> Problem {
        let candidates: Vec<PathBuf> = first
            .trace
            .candidates
            .iter()
            .map(|c| lexical(&c.path))
            .collect();
        let looked = looked_for(&candidates);
        p.message = format!("{of}: no archive for {}: looked for {looked}", d.name);
        let key = format!("{}#{}", meta.kernel_name, first.co);
        if let Some(fix) = self.wheel_fix(&p.binary, d, &candidates) {
            p.fix = fix;
            return p;
        }
        let real_candidates: Vec<PathBuf> = (first.trace.candidates.iter())
            .filter_map(|c| std::fs::canonicalize(&c.path).ok())
            .collect();
        if let Some(a) = self.archives.holding(&key, d, &real_candidates) {
            let to = destination(&candidates, &a.path);
            p.fix = format!(
                "copy {} to {} (or `kpack bundle` the binary)",
                a.path.display(),
                to.display()
            );
            return p;
        }
        if let Some(msg) = self.no_extra(&p.binary, d) {
            p.kind = ProblemKind::NoCodeForTarget;
            p.message = format!("{of}: {msg}");
            return p;
        }
        if meta.targets.is_some() {
            let to = candidates.first().cloned().unwrap_or_default();
            p.fix = format!(
                "install the archive of this build for {} at {}",
                d.name,
                to.display()
            );
            return p;
        }
        self.by_archives_present(p, of, d, meta, real, &looked)
    }

    /// Without recorded targets: what the archives present say.
    fn by_archives_present(
        &self,
        mut p: Problem,
        of: &str,
        d: &Device,
        meta: &HipkMetadata,
        real: &Path,
        looked: &str,
    ) -> Problem {
        let present: Vec<String> = self
            .loader
            .available_archives(meta, real)
            .into_iter()
            .flat_map(|(_, t)| t)
            .collect();
        if present.is_empty() {
            p.fix =
                "install the package's archives (.kpack files) where its search paths point".into();
            return p;
        }
        p.kind = ProblemKind::NoCodeForTarget;
        p.message = format!(
            "{of}: no archive for {} (looked for {looked}); the archives present serve {} only, and the binary does not record its targets: its package most likely has no code for this GPU",
            d.name,
            present.join(", ")
        );
        p
    }

    /// The fix from the installed wheels: a reinstall of the one whose
    /// RECORD lists a missing candidate archive, else `pip install
    /// "<dist>[device-<gfx>]"` when the wheel that owns the binary offers
    /// that extra.
    fn wheel_fix(&self, binary: &str, d: &Device, candidates: &[PathBuf]) -> Option<String> {
        if let Some(owner) = candidates.iter().find_map(|c| self.dists.owner(c)) {
            return Some(format!("pip install --force-reinstall \"{}\"", owner.name));
        }
        let dist = self.dists.owner(Path::new(binary))?;
        let extra = format!("device-{}", d.processor());
        dist.extras.get(&extra)?;
        Some(format!("pip install \"{}[{extra}]\"", dist.name))
    }

    /// When the owning wheel offers device extras, none of them for this
    /// device: say so (installing one would not help).
    fn no_extra(&self, binary: &str, d: &Device) -> Option<String> {
        let dist = self.dists.owner(Path::new(binary))?;
        let extras: Vec<&str> = dist
            .extras
            .keys()
            .filter(|e| e.starts_with("device-") && *e != "device-all")
            .map(String::as_str)
            .collect();
        if extras.is_empty() {
            return None;
        }
        Some(format!(
            "{} offers no device-{} extra (it offers {}): its package has no code for this GPU",
            dist.name,
            d.processor(),
            extras.join(", ")
        ))
    }
}

/// The binary's file itself is refused.
fn invalid(path: &Path, why: &str) -> Problem {
    Problem {
        binary: path.display().to_string(),
        target: String::new(),
        message: why.to_string(),
        fix: "reinstall the file".into(),
        kind: ProblemKind::InvalidBinary,
    }
}

/// The first candidate archive on which a target was tried (it opened and
/// listed a target the device takes), and what the try gave.
fn tried(trace: &Trace) -> Option<(PathBuf, &AttemptOutcome)> {
    let a = trace.attempts.iter().find(|a| {
        matches!(
            a.outcome,
            AttemptOutcome::KeyMissing
                | AttemptOutcome::ReadFailed { .. }
                | AttemptOutcome::OtherBuild { .. }
        )
    })?;
    let c = trace.candidates.get(a.candidate)?;
    let path = match &c.status {
        CandidateStatus::Opened { canonical, .. } => canonical.clone(),
        _ => c.path.clone(),
    };
    Some((path, &a.outcome))
}

/// The candidates, at most three of them shown.
fn looked_for(candidates: &[PathBuf]) -> String {
    let shown: Vec<String> = candidates
        .iter()
        .take(3)
        .map(|c| c.display().to_string())
        .collect();
    match candidates.len() {
        0 => "no path (the binary names none)".into(),
        n if n > 3 => format!("{} and {} more", shown.join(", "), n - 3),
        _ => shown.join(", "),
    }
}

/// Where a copy of `archive` must go for the binary to find it: the
/// candidate of the same file name, else its name in the first
/// candidate's directory.
fn destination(candidates: &[PathBuf], archive: &Path) -> PathBuf {
    let name = archive.file_name();
    if let Some(c) = candidates.iter().find(|c| c.file_name() == name) {
        return c.clone();
    }
    match (candidates.first().and_then(|c| c.parent()), name) {
        (Some(dir), Some(n)) => dir.join(n),
        _ => archive.to_path_buf(),
    }
}
