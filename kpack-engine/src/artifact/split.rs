//! `kpack split` (formats.md §6.2, map phase): an artifact into
//! `<ap>_generic` (host code, fat binaries replaced by offloaded ones) and
//! `<ap>_<target>` per target (`<P>/.kpack/<ap>_<target>.kpack` plus that
//! target's database files).
//!
//! Staging ([`StagedDir::in_dir`]): all outputs of one input artifact are
//! assembled in one hidden directory `OUT/.kpack-staging-*`, then renamed
//! into `OUT` one by one, the per-target artifacts first and the generic
//! artifact last (verify rejects per-target artifacts without their generic
//! artifact, so an interrupted commit is never accepted). Replaced outputs
//! (`--overwrite`) and stale per-target outputs of an earlier run are
//! retired (moved into a staging directory) before the new ones are renamed
//! in, and deleted with it. Staging and scratch directories left in `OUT`
//! by a killed run are removed by the next split into `OUT`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use super::manifest::{
    self, artifact_prefix, generic_name, read_manifest, OutputName, Suffix, MANIFEST,
};
use crate::archive::{Scheme, DEFAULT_ZSTD_LEVEL};
use crate::databases::{classify, is_artifact_key, Database};
use crate::pack::{self, search_path, Done, FileJob, Offloaded, Packer, TreeCounts};
use crate::target::{base_arch, normalize_name, TargetSelector};
use crate::tree::{
    copy_dir_modes, copy_mode, make_dirs, owner_writable, scan, tree_bytes, Node, NodeKind,
};
use crate::{leftover_removed, note, ArchiveInfo, ArtifactError, Observer, Result};
use kpack_host::offload::archive_file_name;
use kpack_host::output::{ScratchDir, StagedDir};

/// How to split.
#[derive(Debug, Clone)]
pub struct SplitOptions {
    pub output_dir: PathBuf,
    /// Enabled database handlers.
    pub databases: Vec<Database>,
    pub scheme: Scheme,
    pub level: i32,
    /// Replace output artifacts that exist already (and remove per-target
    /// artifacts of the same prefix that this run no longer produces).
    pub overwrite: bool,
    /// Batch mode: finish the other artifacts when one fails.
    pub keep_going: bool,
    /// Scratch space (default: the output directory).
    pub tmp_dir: Option<PathBuf>,
    /// `--gpu-targets`: keep only code objects and database files of these
    /// base targets (formats.md §6.3); `None`: keep everything.
    pub gpu_targets: Option<GpuTargets>,
    /// `--expect-targets`: targets each of which must have code objects in
    /// the input (those `gpu_targets` keeps), checked before anything is
    /// written ([`crate::expect`]).
    pub expect_targets: Vec<String>,
}

/// The set S of `--gpu-targets` (formats.md §6.3): the [`base_arch`] of each target
/// given, each a [`TargetSelector`] (whole target IDs: `gfx1250` keeps no
/// `gfx1250-strict` code object or file). Code objects and database files
/// whose base target S does not select are dropped (the job for that
/// target emits them); every fat binary is still offloaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTargets {
    set: BTreeSet<TargetSelector>,
}

impl GpuTargets {
    /// The set of the base targets of `targets`: each a target ID (the
    /// `-xnack`/`-sramecc` and `_strict` spellings accepted), a family
    /// wildcard (`gfx110X`) or a database family key. An empty list is
    /// refused (no filtering is `None`).
    pub fn new<S: AsRef<str>>(targets: &[S]) -> Result<GpuTargets> {
        if targets.is_empty() {
            return Err(ArtifactError::BadGpuTargets {
                what: "no target given".into(),
            });
        }
        let mut set = BTreeSet::new();
        for t in targets {
            let t = t.as_ref();
            let selector = TargetSelector::parse(&base_arch(&normalize_name(t))).map_err(|_| {
                ArtifactError::BadGpuTargets {
                    what: format!("{t:?} is not a target ID (such as gfx942 or gfx90a:xnack-)"),
                }
            })?;
            set.insert(selector);
        }
        Ok(GpuTargets { set })
    }

    /// Does S select the base target of `target` (a target ID or database
    /// key)?
    pub fn keeps(&self, target: &str) -> bool {
        let base = base_arch(&normalize_name(target));
        self.set.iter().any(|s| s.selects_name(&base))
    }

    /// The base targets, sorted.
    pub fn bases(&self) -> impl Iterator<Item = String> + '_ {
        self.set.iter().map(|s| s.to_string())
    }
}

impl SplitOptions {
    pub fn new(output_dir: impl Into<PathBuf>) -> Self {
        SplitOptions {
            output_dir: output_dir.into(),
            databases: Vec::new(),
            scheme: Scheme::ZstdPerKernel,
            level: DEFAULT_ZSTD_LEVEL,
            overwrite: false,
            keep_going: false,
            tmp_dir: None,
            gpu_targets: None,
            expect_targets: Vec::new(),
        }
    }
}

/// What split did (`--json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct SplitSummary {
    pub output_dir: String,
    /// `--gpu-targets`: the base targets kept, sorted.
    pub gpu_targets: Option<Vec<String>>,
    pub artifacts: Vec<ArtifactSummary>,
    /// Batch mode: subdirectories that are not artifacts.
    pub skipped_directories: Vec<Skipped>,
    pub failed: usize,
    pub totals: Totals,
    /// Per target: archives, code objects and bytes over all artifacts.
    pub targets: BTreeMap<String, TargetTotals>,
    pub seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub artifacts: usize,
    pub output_artifacts: usize,
    pub files: usize,
    pub binaries: usize,
    pub code_objects: usize,
    pub database_files: usize,
    pub archives: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Code objects stored once for several binaries (see
    /// [`crate::ArchiveInfo::shared_code_objects`]).
    pub shared_code_objects: usize,
    /// Uncompressed bytes not stored again thanks to them.
    pub bytes_saved: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TargetTotals {
    pub archives: usize,
    pub code_objects: usize,
    pub archive_bytes: u64,
    pub database_files: usize,
    pub shared_code_objects: usize,
    pub bytes_saved: u64,
}

/// One input artifact.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ArtifactSummary {
    pub input: String,
    pub artifact_prefix: String,
    /// `ok` or `failed`.
    pub status: String,
    pub error: Option<String>,
    /// Output artifact directory names, sorted.
    pub outputs: Vec<String>,
    /// Output artifacts of an earlier run replaced or removed
    /// (`--overwrite`).
    pub replaced: Vec<String>,
    pub prefixes: Vec<String>,
    /// Manifest prefixes whose directory does not exist: left out.
    pub skipped_prefixes: Vec<String>,
    /// What the walk and phase 1 counted.
    #[serde(flatten)]
    pub counts: TreeCounts,
    pub database_files: usize,
    /// `--gpu-targets`: database files (and symlinks) of other targets,
    /// left out of every output.
    pub dropped_database_files: usize,
    pub archives: Vec<ArchiveInfo>,
    /// Per target: database files.
    pub database_targets: BTreeMap<String, usize>,
    pub notes: Vec<String>,
}

impl SplitSummary {
    /// The failure of a batch with failed artifacts, if any
    /// ([`ArtifactError::ArtifactsFailed`]; the summary says which).
    pub fn check(&self) -> Result<()> {
        match self.failed {
            0 => Ok(()),
            failed => Err(ArtifactError::ArtifactsFailed {
                failed,
                total: self.artifacts.len(),
            }),
        }
    }
}

/// What to split: one artifact (its prefix given, or derived from its
/// directory's name: [`manifest::split_prefix`]), or every artifact of a
/// shard directory.
#[derive(Debug, Clone, Copy)]
pub enum SplitInput<'a> {
    Artifact {
        dir: &'a Path,
        prefix: Option<&'a str>,
    },
    Batch(&'a Path),
}

impl<'a> SplitInput<'a> {
    /// The input the options name: an artifact directory (with its
    /// prefix, optional) or a batch parent directory, exactly one.
    pub fn new(
        artifact_dir: Option<&'a Path>,
        prefix: Option<&'a str>,
        batch_parent: Option<&'a Path>,
    ) -> Result<Self> {
        let bad = |what: &str| ArtifactError::BadOption {
            option: "split",
            what: what.into(),
        };
        match (artifact_dir, batch_parent) {
            (Some(dir), None) => Ok(SplitInput::Artifact { dir, prefix }),
            (None, Some(_)) if prefix.is_some() => Err(bad(
                "an artifact prefix goes with an artifact directory, not a batch",
            )),
            (None, Some(parent)) => Ok(SplitInput::Batch(parent)),
            (Some(_), Some(_)) => Err(bad(
                "give an artifact directory or a batch parent directory, not both",
            )),
            (None, None) => Err(bad(
                "give an artifact directory or a batch parent directory",
            )),
        }
    }
}

/// Split what `input` names ([`split_artifact`] or [`split_batch`]).
pub fn split(
    input: SplitInput<'_>,
    opts: &SplitOptions,
    observer: &dyn Observer,
) -> Result<SplitSummary> {
    match input {
        SplitInput::Artifact { dir, prefix } => {
            let prefix = manifest::split_prefix(dir, prefix)?;
            split_artifact(dir, &prefix, opts, observer)
        }
        SplitInput::Batch(parent) => split_batch(parent, opts, observer),
    }
}

/// An artifact to split, checked before any work starts.
struct Plan {
    dir: PathBuf,
    prefix: String,
    /// Manifest prefixes that exist, in manifest order.
    prefixes: Vec<String>,
    skipped: Vec<String>,
    bytes: u64,
}

/// Split one artifact (`--artifact-dir`, `--artifact-prefix`).
pub fn split_artifact(
    artifact_dir: &Path,
    artifact_prefix: &str,
    opts: &SplitOptions,
    observer: &dyn Observer,
) -> Result<SplitSummary> {
    let start = Instant::now();
    check_prefix_name(artifact_dir, artifact_prefix)?;
    let plan = plan(artifact_dir, artifact_prefix, opts)?;
    check_expected(&[&plan], opts, artifact_dir)?;
    let created = check_output_dir(opts)?;
    observer.add_work(plan.bytes);
    let a = run(&plan, opts, observer).inspect_err(|_| created.undo())?;
    let mut s = SplitSummary {
        output_dir: opts.output_dir.display().to_string(),
        gpu_targets: gpu_target_list(opts),
        artifacts: vec![a],
        ..Default::default()
    };
    finish(&mut s, start);
    Ok(s)
}

/// Split every artifact of a shard directory
/// (`--batch-artifact-parent-dir`): each subdirectory with a manifest, its
/// prefix taken from its name. All artifacts are checked before any is
/// split. Without `keep_going`, the first failure stops artifacts that
/// have not started and is returned; with it, failures are listed in the
/// summary (`failed`, and `status`/`error` per artifact).
pub fn split_batch(
    parent: &Path,
    opts: &SplitOptions,
    observer: &dyn Observer,
) -> Result<SplitSummary> {
    let start = Instant::now();
    let mut summary = SplitSummary {
        output_dir: opts.output_dir.display().to_string(),
        gpu_targets: gpu_target_list(opts),
        ..Default::default()
    };
    let inputs = batch_inputs(parent, opts, &mut summary, observer)?;
    let plans = plan_batch(&inputs, opts, observer)?;
    let planned: Vec<&Plan> = plans.iter().filter_map(|p| p.as_ref().ok()).collect();
    check_expected(&planned, opts, parent)?;
    let created = check_output_dir(opts)?;
    observer.add_work(plans.iter().flatten().map(|p| p.bytes).sum());
    let results = run_batch(plans, opts, observer);
    for (r, (path, prefix)) in results.into_iter().zip(&inputs) {
        match r {
            Some(Ok(a)) => summary.artifacts.push(a),
            Some(Err(e)) if opts.keep_going => {
                summary.failed += 1;
                summary.artifacts.push(ArtifactSummary {
                    input: path.display().to_string(),
                    artifact_prefix: prefix.clone(),
                    status: "failed".into(),
                    error: Some(e.to_string()),
                    ..Default::default()
                });
            }
            Some(Err(e)) => {
                created.undo();
                return Err(e);
            }
            None => {}
        }
    }
    finish(&mut summary, start);
    Ok(summary)
}

/// The artifacts of a shard directory and their prefixes, in name order
/// (subdirectories without a manifest are listed as skipped).
fn batch_inputs(
    parent: &Path,
    opts: &SplitOptions,
    summary: &mut SplitSummary,
    observer: &dyn Observer,
) -> Result<Vec<(PathBuf, String)>> {
    let out_canon = fs::canonicalize(&opts.output_dir).ok();
    let mut inputs: Vec<(PathBuf, String)> = Vec::new();
    for (name, path) in manifest::subdirs(parent)? {
        if out_canon.is_some() && fs::canonicalize(&path).ok() == out_canon {
            continue;
        }
        if !path.join(MANIFEST).is_file() {
            let reason = format!("no {MANIFEST}: not an artifact");
            observer.note(&format!("{}: {reason}: skipped", path.display()));
            summary.skipped_directories.push(Skipped {
                path: path.display().to_string(),
                reason,
            });
            continue;
        }
        let Some(prefix) = artifact_prefix(&name) else {
            return Err(ArtifactError::input(
                &path,
                "cannot derive the artifact prefix: the name has no `_<family>` part",
            ));
        };
        inputs.push((path.clone(), prefix.to_string()));
    }
    // Two artifacts with the same prefix would write the same outputs.
    let mut seen: BTreeMap<&str, &Path> = BTreeMap::new();
    for (path, prefix) in &inputs {
        if let Some(other) = seen.insert(prefix, path) {
            return Err(ArtifactError::input(
                path,
                format!(
                    "artifact prefix {prefix:?} is also that of {}: both would write {prefix}_generic",
                    other.display()
                ),
            ));
        }
    }
    Ok(inputs)
}

/// A plan per input, or (with `keep_going`) the error that stops it.
type BatchPlan = std::result::Result<Plan, ArtifactError>;

fn plan_batch(
    inputs: &[(PathBuf, String)],
    opts: &SplitOptions,
    observer: &dyn Observer,
) -> Result<Vec<BatchPlan>> {
    let mut plans = Vec::new();
    for (path, prefix) in inputs {
        match plan(path, prefix, opts) {
            Ok(p) => plans.push(Ok(p)),
            Err(e) if opts.keep_going => {
                observer.warn(&format!("{}: {e}", path.display()));
                plans.push(Err(e));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(plans)
}

/// Split the planned artifacts in parallel; results in input order, `None`
/// for those not started because an earlier one failed.
fn run_batch(
    plans: Vec<BatchPlan>,
    opts: &SplitOptions,
    observer: &dyn Observer,
) -> Vec<Option<Result<ArtifactSummary>>> {
    let stop = AtomicBool::new(false);
    plans
        .into_par_iter()
        .map(|p| {
            let plan = match p {
                Ok(plan) => plan,
                Err(e) => return Some(Err(e)),
            };
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            let r = run(&plan, opts, observer);
            if let Err(e) = &r {
                if opts.keep_going {
                    observer.warn(&format!("{}: {e}", plan.dir.display()));
                } else {
                    stop.store(true, Ordering::Relaxed);
                }
            }
            Some(r)
        })
        .collect()
}

fn gpu_target_list(opts: &SplitOptions) -> Option<Vec<String>> {
    let g = opts.gpu_targets.as_ref()?;
    Some(g.bases().collect())
}

fn finish(s: &mut SplitSummary, start: Instant) {
    let mut t = Totals::default();
    for a in &s.artifacts {
        if a.status != "ok" {
            continue;
        }
        t.artifacts += 1;
        t.output_artifacts += a.outputs.len();
        t.files += a.counts.files;
        t.binaries += a.counts.binaries;
        t.code_objects += a.counts.code_objects;
        t.database_files += a.database_files;
        t.archives += a.archives.len();
        t.bytes_in += a.counts.bytes_in;
        t.bytes_out += a.counts.bytes_out;
        for ar in &a.archives {
            t.shared_code_objects += ar.shared_code_objects;
            t.bytes_saved += ar.bytes_saved;
            let e = s.targets.entry(ar.target.clone()).or_default();
            e.archives += 1;
            e.code_objects += ar.code_objects;
            e.archive_bytes += ar.bytes_out;
            e.shared_code_objects += ar.shared_code_objects;
            e.bytes_saved += ar.bytes_saved;
        }
        for (target, n) in &a.database_targets {
            s.targets.entry(target.clone()).or_default().database_files += n;
        }
    }
    s.totals = t;
    s.seconds = start.elapsed().as_secs_f64();
}

/// Create the output (and scratch) directory; what was created, so that a
/// refused split can leave nothing behind.
fn check_output_dir(opts: &SplitOptions) -> Result<Created> {
    let mut created = Created(Vec::new());
    for dir in [Some(&opts.output_dir), opts.tmp_dir.as_ref()]
        .into_iter()
        .flatten()
    {
        if fs::symlink_metadata(dir).is_err() {
            created.0.push(dir.clone());
        }
        make_dirs(dir)?;
    }
    Ok(created)
}

/// Directories a split created (not their missing parents).
struct Created(Vec<PathBuf>);

impl Created {
    /// Remove them again if they are empty.
    fn undo(&self) {
        for dir in self.0.iter().rev() {
            let _ = fs::remove_dir(dir);
        }
    }
}

fn check_prefix_name(dir: &Path, prefix: &str) -> Result<()> {
    if prefix.is_empty() || prefix.contains('/') || prefix.starts_with('.') {
        return Err(ArtifactError::input(
            dir,
            format!("invalid artifact prefix {prefix:?}"),
        ));
    }
    Ok(())
}

fn plan(dir: &Path, prefix: &str, opts: &SplitOptions) -> Result<Plan> {
    let prefixes = read_manifest(dir)?;
    let canon = fs::canonicalize(dir).map_err(|e| ArtifactError::io(dir, e))?;
    if resolve(&opts.output_dir)?.starts_with(&canon) {
        return Err(ArtifactError::input(
            dir,
            format!(
                "the output directory {} lies inside the artifact",
                opts.output_dir.display()
            ),
        ));
    }
    let mut present = Vec::new();
    let mut skipped = Vec::new();
    let mut bytes = 0;
    for p in prefixes {
        let path = dir.join(&p);
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => skipped.push(p),
            Err(e) => return Err(ArtifactError::io(&path, e)),
            Ok(_) => {
                bytes += prefix_bytes(&path, &canon)?;
                present.push(p);
            }
        }
    }
    let existing = existing_outputs(&opts.output_dir, prefix)?;
    if !opts.overwrite {
        if let Some(name) = existing.first() {
            return Err(ArtifactError::OutputExists {
                path: opts.output_dir.join(name),
            });
        }
    }
    Ok(Plan {
        dir: dir.to_path_buf(),
        prefix: prefix.to_string(),
        prefixes: present,
        skipped,
        bytes,
    })
}

/// The bytes of the files below a manifest prefix, after checking that it
/// is a directory inside the artifact (`artifact` canonical).
fn prefix_bytes(path: &Path, artifact: &Path) -> Result<u64> {
    let real = fs::canonicalize(path).map_err(|e| ArtifactError::io(path, e))?;
    if !real.starts_with(artifact) {
        return Err(ArtifactError::input(
            path,
            "prefix resolves outside the artifact (symlink)",
        ));
    }
    if !real.is_dir() {
        return Err(ArtifactError::input(
            path,
            "manifest prefix is not a directory",
        ));
    }
    tree_bytes(path)
}

/// `path` made absolute, its longest existing ancestor with symlinks
/// resolved.
fn resolve(path: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(path).map_err(|e| ArtifactError::io(path, e))?;
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    while fs::symlink_metadata(existing).is_err() {
        match (existing.file_name(), existing.parent()) {
            (Some(n), Some(p)) => {
                rest.push(n.to_os_string());
                existing = p;
            }
            _ => break,
        }
    }
    let mut out = fs::canonicalize(existing).map_err(|e| ArtifactError::io(existing, e))?;
    out.extend(rest.iter().rev());
    Ok(out)
}

/// Output artifacts of `prefix` already in `out`.
fn existing_outputs(out: &Path, prefix: &str) -> Result<Vec<String>> {
    let mut v = Vec::new();
    if !out.is_dir() {
        return Ok(v);
    }
    for (name, _) in manifest::subdirs(out)? {
        if let Some(n) = OutputName::parse(&name) {
            if n.component == prefix && matches!(n.suffix, Suffix::Generic | Suffix::Target(_)) {
                v.push(name);
            }
        }
    }
    Ok(v)
}

/// Where the outputs of one artifact are assembled: `<root>/<ap>_generic`
/// and `<root>/<ap>_<target>`.
struct Layout {
    root: PathBuf,
    ap: String,
}

impl Layout {
    fn generic(&self) -> PathBuf {
        self.root.join(generic_name(&self.ap))
    }

    fn target(&self, t: &str) -> PathBuf {
        self.root.join(format!("{}_{t}", self.ap))
    }
}

/// Per target: the prefixes its artifact gets something in.
type TargetPrefixes = BTreeMap<String, BTreeSet<String>>;

/// `--expect-targets`: every target expected has code objects in the
/// prefixes of the planned artifacts (those `--gpu-targets` keeps), before
/// the output directory is touched.
fn check_expected(plans: &[&Plan], opts: &SplitOptions, input: &Path) -> Result<()> {
    if opts.expect_targets.is_empty() {
        return Ok(());
    }
    crate::expect::parse(&opts.expect_targets)?;
    let keep = |t: &str| opts.gpu_targets.as_ref().is_none_or(|g| g.keeps(t));
    let mut present = crate::expect::Present::default();
    for plan in plans {
        for p in &plan.prefixes {
            present.add_tree(&plan.dir.join(p), &opts.databases, &keep)?;
        }
    }
    crate::expect::check(&opts.expect_targets, &present, "split artifact set", input)
}

/// Split one planned artifact. The plan:
/// 1. stage: a staging directory in the output directory, scratch space;
/// 2. walk the input's prefixes: directories and symlinks are created in
///    the staged outputs, every regular file becomes a job;
/// 3. phase 1 ([`Packer::run`]): fat binaries offloaded, other files copied
///    (database files to their target's artifact);
/// 4. phase 2: one archive per target;
/// 5. manifests and directory modes of the staged outputs;
/// 6. commit: the outputs renamed into the output directory.
fn run(plan: &Plan, opts: &SplitOptions, observer: &dyn Observer) -> Result<ArtifactSummary> {
    let out = &opts.output_dir;
    let stage = StagedDir::in_dir(out)?;
    let scratch = ScratchDir::new(opts.tmp_dir.as_deref().unwrap_or(out))?;
    let mut a = start_summary(plan, &stage, observer);
    let layout = Layout {
        root: stage.path().to_path_buf(),
        ap: plan.prefix.clone(),
    };

    let (jobs, mut target_prefixes) = walk_input(plan, opts, &layout, &mut a, observer)?;
    let keep = |t: &str| opts.gpu_targets.as_ref().is_none_or(|g| g.keeps(t));
    let packer = Packer {
        scheme: opts.scheme,
        level: opts.level,
        scratch: scratch.path(),
        observer,
        keep_target: opts.gpu_targets.as_ref().map(|_| &keep as _),
    };
    let done = packer.run(&jobs)?;
    let binaries = record_outcomes(&done, &jobs, &mut target_prefixes, &mut a, observer);
    check_targets_matched(plan, opts, &a)?;
    a.archives = write_archives(&packer, &binaries, &layout)?;
    record_archives(&mut a, &mut target_prefixes);
    drop(binaries);
    drop(done);
    drop(scratch);

    let outputs = finish_outputs(plan, &layout, &target_prefixes)?;
    commit(stage, plan, opts, outputs, &mut a, observer)?;
    observer.note(&format!(
        "{}: {} -> {} ({} binaries, {} code objects, {} database files)",
        plan.dir.display(),
        plan.prefix,
        a.outputs.join(", "),
        a.counts.binaries,
        a.counts.code_objects,
        a.database_files
    ));
    Ok(a)
}

/// Step 1's summary: nothing done yet but the notes on leftovers of an
/// interrupted run (removed) and on manifest prefixes that do not exist.
fn start_summary(plan: &Plan, stage: &StagedDir, observer: &dyn Observer) -> ArtifactSummary {
    let mut a = ArtifactSummary {
        input: plan.dir.display().to_string(),
        artifact_prefix: plan.prefix.clone(),
        status: "ok".into(),
        prefixes: plan.prefixes.clone(),
        skipped_prefixes: plan.skipped.clone(),
        ..Default::default()
    };
    for leftover in stage.swept() {
        note(observer, &mut a.notes, leftover_removed(leftover));
    }
    for p in &plan.skipped {
        let msg = format!(
            "{}: manifest prefix {p} does not exist: skipped (left out of the output manifests)",
            plan.dir.display()
        );
        note(observer, &mut a.notes, msg);
    }
    a
}

/// Count the bytes of the archives of step 4; each archive also marks its
/// prefix in its target's artifact.
fn record_archives(a: &mut ArtifactSummary, target_prefixes: &mut TargetPrefixes) {
    for ar in &a.archives {
        a.counts.bytes_out += ar.bytes_out;
        let p = ar.prefix.clone().unwrap_or_default();
        target_prefixes
            .entry(ar.target.clone())
            .or_default()
            .insert(p);
    }
}

/// formats.md §6.3: with `--gpu-targets`, fat binaries of which not one code
/// object matched are refused (TheRock would otherwise publish a generic
/// artifact whose device code is nowhere).
fn check_targets_matched(plan: &Plan, opts: &SplitOptions, a: &ArtifactSummary) -> Result<()> {
    let Some(g) = &opts.gpu_targets else {
        return Ok(());
    };
    if a.counts.binaries == 0 || a.counts.code_objects > 0 {
        return Ok(());
    }
    let set: Vec<String> = g.bases().collect();
    Err(ArtifactError::input(
        &plan.dir,
        format!(
            "Found {} fat binaries, but no device code objects matched --gpu-targets ({}). Refusing to emit an untransformed generic artifact.",
            a.counts.binaries,
            set.join(", ")
        ),
    ))
}

/// Step 2: create the directories and symlinks of every prefix in the
/// staged outputs (a symlink a database handler claims goes to its target's
/// artifact), and make a job of every regular file.
fn walk_input(
    plan: &Plan,
    opts: &SplitOptions,
    layout: &Layout,
    a: &mut ArtifactSummary,
    observer: &dyn Observer,
) -> Result<(Vec<FileJob>, TargetPrefixes)> {
    let mut walk = Walk {
        layout,
        generic: layout.generic(),
        jobs: Vec::new(),
        target_prefixes: TargetPrefixes::new(),
    };
    make_dirs(&walk.generic)?;
    for p in &plan.prefixes {
        let root = plan.dir.join(p);
        make_dirs(&walk.generic.join(p))?;
        for n in &scan(&root)? {
            let rel = n.rel_str(&root)?;
            let target = match &n.kind {
                NodeKind::Dir => None,
                _ => database_target(&opts.databases, &root, n, &rel)?,
            };
            let dropped = target
                .as_ref()
                .is_some_and(|t| opts.gpu_targets.as_ref().is_some_and(|g| !g.keeps(t)));
            if dropped {
                // Another job's target: neither generic nor per-target.
                a.dropped_database_files += 1;
                if let NodeKind::File { size } = n.kind {
                    a.counts.files += 1;
                    a.counts.bytes_in += size;
                    observer.advance(size);
                }
                continue;
            }
            walk.node(a, p, &root, n, &rel, target)?;
        }
    }
    Ok((walk.jobs, walk.target_prefixes))
}

/// Step 2 under way: where it puts things (the staged outputs) and what
/// it collects.
struct Walk<'l> {
    layout: &'l Layout,
    generic: PathBuf,
    /// Phase 1's jobs, one per regular file.
    jobs: Vec<FileJob>,
    target_prefixes: TargetPrefixes,
}

impl Walk<'_> {
    /// Put node `n` of prefix `p` (at `root`; `rel`, its path there) in the
    /// staged outputs: a directory or symlink made (a symlink a database
    /// handler claims for `target` in that target's artifact), a regular
    /// file made a job.
    fn node(
        &mut self,
        a: &mut ArtifactSummary,
        p: &str,
        root: &Path,
        n: &Node,
        rel: &str,
        target: Option<String>,
    ) -> Result<()> {
        let base = match (&n.kind, &target) {
            (NodeKind::Symlink(_), Some(t)) => {
                self.target_prefixes
                    .entry(t.clone())
                    .or_default()
                    .insert(p.to_string());
                self.layout.target(t)
            }
            _ => self.generic.clone(),
        };
        let dst = base.join(p).join(&n.rel);
        if let Some(size) = pack::place(&mut a.counts, n, &dst)? {
            self.jobs.push(FileJob {
                src: root.join(&n.rel),
                size,
                mode: n.mode,
                dst,
                kernel_name: Some(format!("{p}/{rel}")),
                search_path: search_path(rel, &self.layout.ap),
                source_prefix: Some(p.to_string()),
                database: target.map(|t| {
                    let dst = self.layout.target(&t).join(p).join(&n.rel);
                    (t, dst)
                }),
            });
        }
        Ok(())
    }
}

/// The per-target artifact a database handler puts the file or symlink
/// `n` in (the claim's base key), if any. A key that can name no artifact
/// is refused.
fn database_target(
    enabled: &[Database],
    root: &Path,
    n: &Node,
    rel: &str,
) -> Result<Option<String>> {
    let Some(claim) = classify(enabled, rel) else {
        return Ok(None);
    };
    if !is_artifact_key(&claim.base) {
        return Err(ArtifactError::input(
            root.join(&n.rel),
            format!(
                "database handler {} gives this file the key {:?}, which names no artifact (neither a target ID nor a family key)",
                claim.handler, claim.key
            ),
        ));
    }
    Ok(Some(claim.base))
}

/// Count what phase 1 did to each file (database files also mark their
/// prefix in their target's artifact); returns the offloaded binaries.
fn record_outcomes<'d>(
    done: &'d [Done],
    jobs: &[FileJob],
    target_prefixes: &mut TargetPrefixes,
    a: &mut ArtifactSummary,
    observer: &dyn Observer,
) -> Vec<&'d Offloaded> {
    let mut notes = Vec::new();
    let r = pack::record_outcomes(done, jobs, &mut a.counts, |msg| notes.push(msg));
    for (i, target) in r.databases {
        a.database_files += 1;
        *a.database_targets.entry(target.to_string()).or_default() += 1;
        let p = jobs[i].source_prefix.clone().unwrap_or_default();
        target_prefixes
            .entry(target.to_string())
            .or_default()
            .insert(p);
    }
    for msg in notes {
        note(observer, &mut a.notes, msg);
    }
    r.binaries
}

/// Step 4: one archive per target, in
/// `<ap>_<target>/<P>/.kpack/<ap>_<target>.kpack` where `P` is the first
/// (sorted) prefix that contributed code objects.
fn write_archives(
    packer: &Packer<'_>,
    binaries: &[&Offloaded],
    layout: &Layout,
) -> Result<Vec<ArchiveInfo>> {
    let ap = &layout.ap;
    let place = |target: &str, prefixes: &[String]| {
        let p = prefixes.first().cloned().unwrap_or_default();
        let name = archive_file_name(ap, target);
        let path = layout.target(target).join(&p).join(".kpack").join(&name);
        (path, format!("{ap}_{target}/{p}/.kpack/{name}"))
    };
    let family = |target: &str| target.to_string();
    packer.write_archives(binaries, ap, &family, &place)
}

/// Step 5: prune the directories of the generic output that only held
/// files of per-target outputs, write every output's manifest (the input's
/// prefixes it has something in, in manifest order) and give its
/// directories the input's modes. Returns the output names, sorted.
fn finish_outputs(
    plan: &Plan,
    layout: &Layout,
    target_prefixes: &TargetPrefixes,
) -> Result<Vec<String>> {
    let generic = layout.generic();
    prune_emptied(&generic, &plan.dir, &plan.prefixes)?;
    manifest::write_manifest(&generic, &plan.prefixes)?;
    copy_dir_modes(&generic, &plan.dir)?;
    owner_writable(&generic)?;
    let mut outputs = vec![generic_name(&layout.ap)];
    for (t, ps) in target_prefixes {
        let dir = layout.target(t);
        let listed: Vec<String> = plan
            .prefixes
            .iter()
            .filter(|p| ps.contains(*p))
            .cloned()
            .collect();
        manifest::write_manifest(&dir, &listed)?;
        copy_dir_modes(&dir, &plan.dir)?;
        owner_writable(&dir)?;
        outputs.push(format!("{}_{t}", layout.ap));
    }
    outputs.sort();
    Ok(outputs)
}

/// Step 6: outputs of an earlier run of this prefix out of the way
/// (`--overwrite`: replaced, or removed when this run does not produce
/// them), the per-target outputs in, the generic output last.
fn commit(
    mut stage: StagedDir,
    plan: &Plan,
    opts: &SplitOptions,
    outputs: Vec<String>,
    a: &mut ArtifactSummary,
    observer: &dyn Observer,
) -> Result<()> {
    let out = &opts.output_dir;
    if !opts.overwrite {
        for name in &outputs {
            if out.join(name).exists() {
                return Err(ArtifactError::OutputExists {
                    path: out.join(name),
                });
            }
        }
    }
    for name in existing_outputs(out, &plan.prefix)? {
        stage.retire(&name)?;
        let msg = if outputs.contains(&name) {
            format!("{}: replaced", out.join(&name).display())
        } else {
            format!(
                "{}: removed (not produced by this run)",
                out.join(&name).display()
            )
        };
        note(observer, &mut a.notes, msg);
        a.replaced.push(name);
    }
    let generic = generic_name(&plan.prefix);
    let order: Vec<&String> = outputs
        .iter()
        .filter(|n| **n != generic)
        .chain([&generic])
        .collect();
    stage.commit_entries(&order)?;
    // Now the artifact directories may take the input's mode (renaming a
    // directory into another needs write permission on it, even for its
    // owner; see `finish_outputs`).
    for name in &outputs {
        copy_mode(&plan.dir, &out.join(name))?;
    }
    a.outputs = outputs;
    Ok(())
}

/// Remove directories below the prefixes of `generic` that are empty now
/// but were not in the input (everything in them went to per-target
/// artifacts). Prefix directories themselves stay.
fn prune_emptied(generic: &Path, input: &Path, prefixes: &[String]) -> Result<()> {
    for p in prefixes {
        let root = generic.join(p);
        let mut dirs: Vec<PathBuf> = scan(&root)?
            .into_iter()
            .filter(|n| n.kind == NodeKind::Dir)
            .map(|n| n.rel)
            .collect();
        dirs.reverse();
        for rel in dirs {
            let d = root.join(&rel);
            let empty = fs::read_dir(&d)
                .map_err(|e| ArtifactError::io(&d, e))?
                .next()
                .is_none();
            let was_empty = fs::read_dir(input.join(p).join(&rel))
                .map(|mut r| r.next().is_none())
                .unwrap_or(false);
            if empty && !was_empty {
                fs::remove_dir(&d).map_err(|e| ArtifactError::io(&d, e))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::artifact::test_util::{
        child_dir, entries, hidden_entries, killed_run_leftovers, run_killed_child, small_artifact,
        snapshot, DieOnAdvance,
    };
    use crate::Silent;

    fn options(out: &Path) -> SplitOptions {
        let mut o = SplitOptions::new(out);
        o.databases = vec![Database::Rocblas];
        o
    }

    /// Staging and scratch directories that a killed split left in the
    /// output directory are removed by the next split into it, which
    /// writes the same output as a split into a clean directory.
    #[test]
    fn leftovers_of_a_killed_split_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("in/blas_lib_gfx110X");
        small_artifact(&input, &["gfx1100", "gfx942"]);
        let clean = t.path().join("clean");
        split_artifact(&input, "blas_lib", &options(&clean), &Silent).unwrap();
        let want = snapshot(&clean);
        assert_eq!(
            want.keys().filter(|k| !k.contains('/')).collect::<Vec<_>>(),
            ["blas_lib_generic", "blas_lib_gfx1100", "blas_lib_gfx942"]
        );

        let out = t.path().join("out");
        killed_run_leftovers(&out);
        let s = split_artifact(&input, "blas_lib", &options(&out), &Silent).unwrap();
        assert!(
            hidden_entries(&out).is_empty(),
            "{:?}",
            hidden_entries(&out)
        );
        assert_eq!(snapshot(&out), want);
        let notes = &s.artifacts[0].notes;
        assert_eq!(
            notes
                .iter()
                .filter(|n| n.contains("removed (left by an interrupted run)"))
                .count(),
            2,
            "{notes:?}"
        );
    }

    /// A split that dies in the middle (after its first file) leaves only
    /// hidden staging and scratch directories; the next split removes them
    /// and writes what a split into a clean directory writes.
    #[test]
    fn a_split_killed_mid_run_is_cleaned_up_by_the_next() {
        if let Some(dir) = child_dir() {
            let input = dir.join("in/blas_lib_x");
            let r = split_artifact(
                &input,
                "blas_lib",
                &options(&dir.join("out")),
                &DieOnAdvance,
            );
            panic!("not killed: {:?}", r.map(|_| ()));
        }
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("in/blas_lib_x");
        small_artifact(&input, &["gfx1100", "gfx942"]);
        let clean = t.path().join("clean");
        split_artifact(&input, "blas_lib", &options(&clean), &Silent).unwrap();

        run_killed_child(
            "artifact::split::tests::a_split_killed_mid_run_is_cleaned_up_by_the_next",
            t.path(),
        );
        let out = t.path().join("out");
        let left = entries(&out);
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(
            left[0].starts_with(kpack_host::output::SCRATCH_PREFIX),
            "{left:?}"
        );
        assert!(
            left[1].starts_with(kpack_host::output::STAGING_PREFIX),
            "{left:?}"
        );
        assert!(out.join(&left[1]).join("blas_lib_generic").is_dir());

        split_artifact(&input, "blas_lib", &options(&out), &Silent).unwrap();
        assert!(
            hidden_entries(&out).is_empty(),
            "{:?}",
            hidden_entries(&out)
        );
        assert_eq!(snapshot(&out), snapshot(&clean));
    }

    /// `--overwrite` replaces the outputs of an earlier split of the same
    /// prefix (and removes those this run does not produce); other
    /// prefixes' outputs stay.
    #[test]
    fn overwrite_replaces_and_removes_earlier_outputs() {
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("in/blas_lib_gfx110X");
        small_artifact(&input, &["gfx1100", "gfx942"]);
        let out = t.path().join("out");
        for stale in ["blas_lib_gfx90a", "blas_lib_generic", "other_generic"] {
            fs::create_dir_all(out.join(stale)).unwrap();
            fs::write(out.join(stale).join("old"), b"o").unwrap();
        }
        let e = split_artifact(&input, "blas_lib", &options(&out), &Silent).unwrap_err();
        assert!(e.to_string().contains("already exists"), "{e}");
        let mut o = options(&out);
        o.overwrite = true;
        let s = split_artifact(&input, "blas_lib", &o, &Silent).unwrap();
        assert_eq!(
            s.artifacts[0].replaced,
            ["blas_lib_generic", "blas_lib_gfx90a"]
        );
        assert_eq!(
            entries(&out),
            [
                "blas_lib_generic",
                "blas_lib_gfx1100",
                "blas_lib_gfx942",
                "other_generic"
            ]
        );
        assert!(!out.join("blas_lib_generic/old").exists());
        assert!(out.join("other_generic/old").exists());
        assert_eq!(
            fs::read_to_string(out.join(format!("blas_lib_gfx942/{MANIFEST}"))).unwrap(),
            "stage\n"
        );
    }

    /// Database files go to the artifact of their base target: features
    /// in file names (`-xnack+`) are dropped, `-strict` is kept, family
    /// keys are artifact keys of their own.
    #[test]
    fn database_artifacts_are_keyed_by_base_target() {
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("in/blas_lib_x");
        small_artifact(&input, &["gfx90a-xnack+", "gfx90a", "gfx1250-strict"]);
        let stage = input.join("stage");
        let images = stage.join("lib/aotriton.images/amd-gfx120x");
        fs::create_dir_all(&images).unwrap();
        fs::write(images.join("flash.aks2"), b"img").unwrap();
        let out = t.path().join("out");
        let mut o = options(&out);
        o.databases = vec![Database::Rocblas, Database::Aotriton];
        let s = split_artifact(&input, "blas_lib", &o, &Silent).unwrap();
        assert_eq!(
            s.artifacts[0].outputs,
            [
                "blas_lib_generic",
                "blas_lib_gfx1250-strict",
                "blas_lib_gfx12_0",
                "blas_lib_gfx90a"
            ]
        );
        let lib = "stage/lib/rocblas/library";
        for (artifact, file) in [
            ("blas_lib_gfx90a", "TensileLibrary_gfx90a-xnack+.dat"),
            ("blas_lib_gfx90a", "TensileLibrary_gfx90a.dat"),
            (
                "blas_lib_gfx1250-strict",
                "TensileLibrary_gfx1250-strict.dat",
            ),
        ] {
            assert!(out.join(artifact).join(lib).join(file).is_file(), "{file}");
        }
        assert!(out
            .join("blas_lib_gfx12_0/stage/lib/aotriton.images/amd-gfx120x/flash.aks2")
            .is_file());
        assert!(!out
            .join("blas_lib_generic/stage/lib/aotriton.images")
            .exists());
        let r = crate::artifact::verify_artifacts(&out, &Default::default(), &Silent).unwrap();
        assert!(r.ok(), "{:?}", r.problems);
        assert_eq!(r.database_files, 4);
    }

    #[test]
    fn search_paths() {
        assert_eq!(
            search_path("lib/librocblas.so.5.2", "blas_lib"),
            "../.kpack/blas_lib_@GFXARCH@.kpack"
        );
        assert_eq!(search_path("libx.so", "b"), ".kpack/b_@GFXARCH@.kpack");
        assert_eq!(
            search_path("lib/rocfft/libx.so", "fft_lib"),
            "../../.kpack/fft_lib_@GFXARCH@.kpack"
        );
    }
}
