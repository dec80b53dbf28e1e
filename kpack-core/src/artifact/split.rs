//! `kpack split` (SPEC §5, map phase): an artifact into
//! `<ap>_generic` (host code, fat binaries replaced by offloaded ones) and
//! `<ap>_<target>` per target (`<P>/.kpack/<ap>_<target>.kpack` plus that
//! target's database files).
//!
//! Staging: all outputs of one input artifact are assembled in one hidden
//! directory `OUT/.kpack-staging-*`, then renamed into `OUT` one by one,
//! the per-target artifacts first and the generic artifact last (verify
//! rejects per-target artifacts without their generic artifact, so an
//! interrupted commit is never accepted). Replaced outputs (`--overwrite`)
//! and stale per-target outputs of an earlier run are moved into the
//! staging directory before the new ones are renamed in, and deleted with
//! it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use super::databases::{classify, Claim, Database};
use super::manifest::{
    self, artifact_prefix, generic_name, read_manifest, OutputName, Suffix, MANIFEST,
};
use super::pack::{FileJob, Outcome, Packer};
use super::tree::{copy_symlink, make_dirs, remove_tree, scan, NodeKind};
use super::{ArchiveInfo, ArtifactError, Observer, Result};
use crate::archive::{Scheme, DEFAULT_ZSTD_LEVEL};
use crate::offload::{archive_file_name, GFXARCH};

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
        }
    }
}

/// What split did (`--json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct SplitSummary {
    pub output_dir: String,
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
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TargetTotals {
    pub archives: usize,
    pub code_objects: usize,
    pub archive_bytes: u64,
    pub database_files: usize,
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
    pub files: usize,
    pub symlinks: usize,
    pub directories: usize,
    /// Fat binaries offloaded.
    pub binaries: usize,
    pub wrappers: usize,
    pub already_offloaded: usize,
    pub link_inputs: usize,
    pub code_objects: usize,
    pub database_files: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub archives: Vec<ArchiveInfo>,
    /// Per target: database files.
    pub database_targets: BTreeMap<String, usize>,
    pub notes: Vec<String>,
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
    check_output_dir(opts)?;
    observer.add_work(plan.bytes);
    let a = run(&plan, opts, observer)?;
    let mut s = SplitSummary {
        output_dir: opts.output_dir.display().to_string(),
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
    let out_canon = fs::canonicalize(&opts.output_dir).ok();
    let mut summary = SplitSummary {
        output_dir: opts.output_dir.display().to_string(),
        ..Default::default()
    };
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
    let mut plans = Vec::new();
    for (path, prefix) in &inputs {
        match plan(path, prefix, opts) {
            Ok(p) => plans.push(Ok(p)),
            Err(e) if opts.keep_going => {
                observer.warn(&format!("{}: {e}", path.display()));
                plans.push(Err((path.clone(), prefix.clone(), e)));
            }
            Err(e) => return Err(e),
        }
    }
    check_output_dir(opts)?;
    observer.add_work(plans.iter().flatten().map(|p| p.bytes).sum());
    let stop = AtomicBool::new(false);
    // `None`: not started because an earlier artifact failed.
    let results: Vec<Option<Result<ArtifactSummary>>> = plans
        .into_par_iter()
        .map(|p| match p {
            Ok(plan) => {
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
            }
            Err((_, _, e)) => Some(Err(e)),
        })
        .collect();
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
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    finish(&mut summary, start);
    Ok(summary)
}

fn finish(s: &mut SplitSummary, start: Instant) {
    let mut t = Totals::default();
    for a in &s.artifacts {
        if a.status != "ok" {
            continue;
        }
        t.artifacts += 1;
        t.output_artifacts += a.outputs.len();
        t.files += a.files;
        t.binaries += a.binaries;
        t.code_objects += a.code_objects;
        t.database_files += a.database_files;
        t.archives += a.archives.len();
        t.bytes_in += a.bytes_in;
        t.bytes_out += a.bytes_out;
        for ar in &a.archives {
            let e = s.targets.entry(ar.target.clone()).or_default();
            e.archives += 1;
            e.code_objects += ar.code_objects;
            e.archive_bytes += ar.bytes_out;
        }
        for (target, n) in &a.database_targets {
            s.targets.entry(target.clone()).or_default().database_files += n;
        }
    }
    s.totals = t;
    s.seconds = start.elapsed().as_secs_f64();
}

fn check_output_dir(opts: &SplitOptions) -> Result<()> {
    make_dirs(&opts.output_dir)?;
    if let Some(t) = &opts.tmp_dir {
        make_dirs(t)?;
    }
    Ok(())
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
                let real = fs::canonicalize(&path).map_err(|e| ArtifactError::io(&path, e))?;
                if !real.starts_with(&canon) {
                    return Err(ArtifactError::input(
                        &path,
                        "prefix resolves outside the artifact (symlink)",
                    ));
                }
                if !real.is_dir() {
                    return Err(ArtifactError::input(
                        &path,
                        "manifest prefix is not a directory",
                    ));
                }
                for n in scan(&path)? {
                    if let NodeKind::File { size } = n.kind {
                        bytes += size;
                    }
                }
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

/// `"../" * depth + ".kpack/<ap>_@GFXARCH@.kpack"` for a binary at `rel`
/// (relative to its install prefix).
pub fn search_path(rel: &str, group: &str) -> String {
    let depth = rel.split('/').count().saturating_sub(1);
    format!(
        "{}.kpack/{}",
        "../".repeat(depth),
        archive_file_name(group, GFXARCH)
    )
}

fn run(plan: &Plan, opts: &SplitOptions, observer: &dyn Observer) -> Result<ArtifactSummary> {
    let ap = &plan.prefix;
    let out = &opts.output_dir;
    let staging = tempfile::Builder::new()
        .prefix(".kpack-staging-")
        .tempdir_in(out)
        .map_err(|e| ArtifactError::io(out, e))?;
    let scratch_parent = opts.tmp_dir.as_deref().unwrap_or(out);
    let scratch = tempfile::Builder::new()
        .prefix(".kpack-scratch-")
        .tempdir_in(scratch_parent)
        .map_err(|e| ArtifactError::io(scratch_parent, e))?;
    let generic = staging.path().join(generic_name(ap));
    let arch_dir = |t: &str| staging.path().join(format!("{ap}_{t}"));
    make_dirs(&generic)?;

    let mut a = ArtifactSummary {
        input: plan.dir.display().to_string(),
        artifact_prefix: ap.clone(),
        status: "ok".into(),
        prefixes: plan.prefixes.clone(),
        skipped_prefixes: plan.skipped.clone(),
        ..Default::default()
    };
    for p in &plan.skipped {
        let msg = format!(
            "{}: manifest prefix {p} does not exist: skipped (left out of the output manifests)",
            plan.dir.display()
        );
        observer.note(&msg);
        a.notes.push(msg);
    }

    // Which prefixes each target artifact gets something in.
    let mut target_prefixes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut jobs = Vec::new();
    let mut job_prefix = Vec::new();
    // Directories that were empty in the input (kept even when empty).
    for p in &plan.prefixes {
        let root = plan.dir.join(p);
        make_dirs(&generic.join(p))?;
        let nodes = scan(&root)?;
        for n in &nodes {
            let rel = n.rel_str(&root)?;
            let claim = classify(&opts.databases, &rel).map(|(_, c)| c);
            match &n.kind {
                NodeKind::Dir => {
                    a.directories += 1;
                    make_dirs(&generic.join(p).join(&n.rel))?;
                }
                NodeKind::Symlink(target) => {
                    a.symlinks += 1;
                    let dst = match &claim {
                        Some(Claim::Target(t)) => {
                            target_prefixes
                                .entry(t.clone())
                                .or_default()
                                .insert(p.clone());
                            arch_dir(t).join(p).join(&n.rel)
                        }
                        _ => generic.join(p).join(&n.rel),
                    };
                    copy_symlink(target, &dst)?;
                }
                NodeKind::File { size } => {
                    a.files += 1;
                    a.bytes_in += size;
                    let database = match &claim {
                        Some(Claim::Target(t)) => {
                            Some((t.clone(), arch_dir(t).join(p).join(&n.rel)))
                        }
                        _ => None,
                    };
                    jobs.push(FileJob {
                        src: root.join(&n.rel),
                        size: *size,
                        mode: n.mode,
                        dst: generic.join(p).join(&n.rel),
                        kernel_name: Some(format!("{p}/{rel}")),
                        search_path: search_path(&rel, ap),
                        source_prefix: Some(p.clone()),
                        database,
                    });
                    job_prefix.push(p.clone());
                }
            }
        }
    }

    let packer = Packer {
        scheme: opts.scheme,
        level: opts.level,
        scratch: scratch.path(),
        observer,
        keep_target: None,
    };
    let done = packer.run(&jobs)?;
    let mut binaries = Vec::new();
    for ((d, job), p) in done.iter().zip(&jobs).zip(&job_prefix) {
        a.bytes_out += d.bytes_out;
        match &d.outcome {
            Outcome::Copied => {}
            Outcome::Database { target } => {
                a.database_files += 1;
                *a.database_targets.entry(target.clone()).or_default() += 1;
                target_prefixes
                    .entry(target.clone())
                    .or_default()
                    .insert(p.clone());
            }
            Outcome::Offloaded(b) => {
                a.binaries += 1;
                a.wrappers += b.wrappers;
                a.code_objects += b.code_objects.len();
                binaries.push(b.as_ref());
            }
            Outcome::AlreadyOffloaded => {
                a.already_offloaded += 1;
                let msg = format!("{}: already offloaded: copied as it is", job.src.display());
                observer.note(&msg);
                a.notes.push(msg);
            }
            Outcome::LinkInput { note } => {
                a.link_inputs += 1;
                if let Some(msg) = note {
                    observer.note(msg);
                    a.notes.push(msg.clone());
                }
            }
        }
    }

    // Archives: in the first sorted prefix that contributed kernels.
    let place = |target: &str, prefixes: &[String]| {
        let p = prefixes.first().cloned().unwrap_or_default();
        let name = archive_file_name(ap, target);
        let path = arch_dir(target).join(&p).join(".kpack").join(&name);
        (path, format!("{ap}_{target}/{p}/.kpack/{name}"))
    };
    let family = |target: &str| target.to_string();
    a.archives = packer.write_archives(&binaries, ap, &family, &place)?;
    for ar in &a.archives {
        a.bytes_out += ar.bytes_out;
        let p = ar.prefix.clone().unwrap_or_default();
        target_prefixes
            .entry(ar.target.clone())
            .or_default()
            .insert(p);
    }
    drop(binaries);
    drop(done);
    drop(scratch);

    // Prune directories that only held files of other artifacts.
    prune_emptied(&generic, &plan.dir, &plan.prefixes)?;

    // Manifests and modes.
    manifest::write_manifest(&generic, &plan.prefixes)?;
    super::tree::copy_dir_modes(&generic, &plan.dir)?;
    let mut outputs = vec![generic_name(ap)];
    for (t, ps) in &target_prefixes {
        let dir = arch_dir(t);
        let listed: Vec<String> = plan
            .prefixes
            .iter()
            .filter(|p| ps.contains(*p))
            .cloned()
            .collect();
        manifest::write_manifest(&dir, &listed)?;
        super::tree::copy_dir_modes(&dir, &plan.dir)?;
        outputs.push(format!("{ap}_{t}"));
    }
    outputs.sort();

    // Commit: old outputs out of the way, per-target artifacts in, generic last.
    if !opts.overwrite {
        for name in &outputs {
            if out.join(name).exists() {
                return Err(ArtifactError::OutputExists {
                    path: out.join(name),
                });
            }
        }
    }
    let trash = staging.path().join(".replaced");
    for name in existing_outputs(out, ap)? {
        make_dirs(&trash)?;
        fs::rename(out.join(&name), trash.join(&name))
            .map_err(|e| ArtifactError::io(out.join(&name), e))?;
        let msg = if outputs.contains(&name) {
            format!("{}: replaced", out.join(&name).display())
        } else {
            format!(
                "{}: removed (not produced by this run)",
                out.join(&name).display()
            )
        };
        observer.note(&msg);
        a.notes.push(msg);
        a.replaced.push(name);
    }
    let generic_out = generic_name(ap);
    for name in outputs
        .iter()
        .filter(|n| **n != generic_out)
        .chain([&generic_out])
    {
        let dest = out.join(name);
        fs::rename(staging.path().join(name), &dest).map_err(|e| ArtifactError::io(&dest, e))?;
    }
    a.outputs = outputs;
    if trash.exists() {
        remove_tree(&trash)?;
    }
    observer.note(&format!(
        "{}: {} -> {} ({} binaries, {} code objects, {} database files)",
        plan.dir.display(),
        ap,
        a.outputs.join(", "),
        a.binaries,
        a.code_objects,
        a.database_files
    ));
    Ok(a)
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
