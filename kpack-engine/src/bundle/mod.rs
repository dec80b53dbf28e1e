//! `kpack bundle BINARY... --into DIR`: an application-local copy of
//! offloaded binaries that still finds its code. The binaries (and, with
//! `--with-deps`, the libraries they need from their prefix) are copied
//! into `DIR`, flat or keeping their layout, with the archives their
//! search paths name for the chosen targets; where the layout changes what
//! a search path reaches, the binary's metadata is re-pointed
//! (`kpack_host::repoint`, ELF and PE). Everything is assembled in a
//! staging directory inside `DIR`, where every code object of every
//! offloaded binary must resolve for every chosen target through the
//! loader's own search (`ROCM_KPACK_*` not applied: the copy must work
//! without them); then it is moved into `DIR`. Nothing outside `DIR`
//! changes; a failure leaves `DIR` as it was.

mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::loader::{Config, Loader};
use crate::target::TargetId;
use crate::tree::{copy_file, create_file, same_bytes};
use crate::{ArtifactError, Observer, Result};
use kpack_host::built_for::{built_for, BuiltFor};
use kpack_host::output::StagedDir;
use plan::Piece;

/// How the copies are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Every binary in `DIR` itself, the archives in `DIR/.kpack`.
    Flat,
    /// The binaries' paths below their common directory kept.
    Keep,
}

#[derive(Debug, Clone)]
pub struct BundleOptions {
    pub binaries: Vec<PathBuf>,
    pub into: PathBuf,
    /// Targets to bring archives for, matched as prune matches them; all
    /// the archives present serve when empty.
    pub targets: Vec<String>,
    pub with_deps: bool,
    pub layout: Layout,
    /// Replace files in `DIR` that differ from the bundle's.
    pub overwrite: bool,
}

/// What bundle wrote (`--json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct BundleSummary {
    pub into: PathBuf,
    pub binaries: Vec<BundledBinary>,
    pub archives: Vec<BundledArchive>,
    /// Code objects checked to resolve from the new place (code object ×
    /// target).
    pub loads_checked: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct BundledBinary {
    pub source: PathBuf,
    /// Relative to `into`.
    pub dest: PathBuf,
    pub dependency: bool,
    pub offloaded: bool,
    /// The search paths it has now (offloaded binaries).
    pub search_paths: Vec<String>,
    /// Its search paths were rewritten.
    pub repointed: bool,
    /// The targets its code objects were checked for.
    pub targets: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BundledArchive {
    pub source: PathBuf,
    pub dest: PathBuf,
}

/// Bundle `opts.binaries` into `opts.into`.
pub fn bundle(opts: &BundleOptions, observer: &dyn Observer) -> Result<BundleSummary> {
    let chosen = chosen(&opts.targets)?;
    let inputs = plan::inputs(opts)?;
    let root = plan::layout_root(&inputs);
    let dests = plan::destinations(&inputs, opts.layout, &root)?;
    let mut pieces = Vec::new();
    for ((source, dependency), dest) in inputs.into_iter().zip(dests) {
        let offloaded = plan::offloaded(&source, &dest, opts.layout, &root, &chosen)?;
        pieces.push(Piece {
            source,
            dest,
            dependency,
            offloaded,
        });
    }
    let archives = archives(&pieces)?;
    let created = !opts.into.exists();
    let result = stage_and_commit(opts, &pieces, &archives, &chosen, observer);
    if result.is_err() && created {
        let _ = std::fs::remove_dir(&opts.into);
    }
    result
}

/// The chosen targets, parsed.
fn chosen(targets: &[String]) -> Result<Vec<TargetId>> {
    targets
        .iter()
        .map(|t| {
            TargetId::parse(t).map_err(|e| ArtifactError::BadGpuTargets {
                what: format!("--targets: {e}"),
            })
        })
        .collect()
}

/// Every archive to copy, by destination; two different archives for one
/// destination are an error.
fn archives(pieces: &[Piece]) -> Result<BTreeMap<PathBuf, PathBuf>> {
    let mut out: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    for o in pieces.iter().filter_map(|p| p.offloaded.as_ref()) {
        for (source, dest) in &o.archives {
            match out.get(dest) {
                Some(other) if other != source && !same_bytes(other, source)? => {
                    return Err(ArtifactError::input(
                        source,
                        format!(
                            "would be copied to {} as {} is, and they differ: bundle them apart",
                            dest.display(),
                            other.display()
                        ),
                    ))
                }
                Some(_) => {}
                None => {
                    out.insert(dest.clone(), source.clone());
                }
            }
        }
    }
    Ok(out)
}

/// Write everything into a staging directory inside `DIR`, check it there,
/// and move it into `DIR`.
fn stage_and_commit(
    opts: &BundleOptions,
    pieces: &[Piece],
    archives: &BTreeMap<PathBuf, PathBuf>,
    chosen: &[TargetId],
    observer: &dyn Observer,
) -> Result<BundleSummary> {
    let staged = StagedDir::in_dir(&opts.into)?;
    let work = staged.path().to_path_buf();
    for p in pieces {
        write_piece(p, &work.join(&p.dest))?;
    }
    for (dest, source) in archives {
        copy_file(source, &work.join(dest), 0o644)?;
    }
    let mut summary = BundleSummary {
        into: opts.into.clone(),
        ..BundleSummary::default()
    };
    summary.loads_checked = check(pieces, &work, chosen)?;
    check_existing(opts, &work)?;
    summary.binaries = pieces.iter().map(bundled_binary).collect();
    summary.archives = archives
        .iter()
        .map(|(dest, source)| BundledArchive {
            source: source.clone(),
            dest: dest.clone(),
        })
        .collect();
    staged.commit()?;
    observer.note(&format!(
        "{}: {} binar{}, {} archive(s), {} load(s) checked",
        opts.into.display(),
        summary.binaries.len(),
        if summary.binaries.len() == 1 {
            "y"
        } else {
            "ies"
        },
        summary.archives.len(),
        summary.loads_checked
    ));
    Ok(summary)
}

/// One binary at `dest`: re-pointed, or copied as it is; mode kept.
fn write_piece(p: &Piece, dest: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&p.source)
        .map_err(|e| ArtifactError::io(&p.source, e))?
        .permissions()
        .mode()
        & 0o7777;
    match p.offloaded.as_ref().and_then(|o| o.repointed.as_ref()) {
        Some(metadata) => {
            let bytes = kpack_loader::map_file(&p.source)?;
            create_file(dest, mode, |f| {
                Ok(kpack_host::repoint::repoint(
                    &p.source, &bytes, metadata, f,
                )?)
            })
        }
        None => copy_file(&p.source, dest, mode).map(drop),
    }
}

/// Every code object of every offloaded binary, staged in `work`, for every
/// target of its archives the chosen targets take, through the loader's
/// search (but for code object indices whose bundle was built without the
/// target: [`kpack_host::built_for`]): how many loads; an error naming
/// every one that fails.
fn check(pieces: &[Piece], work: &Path, chosen: &[TargetId]) -> Result<usize> {
    let loader = Loader::new(Config::default());
    let mut failed = Vec::new();
    let mut loads = 0;
    for p in pieces {
        let Some(o) = &p.offloaded else { continue };
        let binary = std::fs::canonicalize(work.join(&p.dest))
            .map_err(|e| ArtifactError::io(work.join(&p.dest), e))?;
        let metadata = o.repointed.as_ref().unwrap_or(&o.metadata);
        // A chosen target the binary has code for needs an archive.
        for t in chosen.iter().filter(|t| o.has_code_for(t)) {
            if !o.targets.iter().any(|ot| takes(t, ot)) {
                failed.push(format!(
                    "{}: split for {t}, but no archive for it among those its search paths name",
                    p.source.display()
                ));
            }
        }
        for t in &o.targets {
            for &co in &o.co_indices {
                // A bundle built without the target: nothing to load.
                if built_for(metadata, co.into(), &[t]) == BuiltFor::NotInBundle {
                    continue;
                }
                loads += 1;
                if let Err(e) = loader.explain(metadata, &binary, co, &[t.as_str()]).0 {
                    failed.push(format!("{} #{co} for {t}: {e}", p.dest.display()));
                }
            }
        }
    }
    if failed.is_empty() {
        return Ok(loads);
    }
    Err(ArtifactError::input(
        work.parent().unwrap_or(work),
        format!(
            "the bundle does not resolve from its new place: {}",
            failed.join("; ")
        ),
    ))
}

/// Does the request `t` take code built for `code`?
fn takes(t: &TargetId, code: &str) -> bool {
    TargetId::parse(code).is_ok_and(|c| t.takes(&c))
}

/// Files already in `DIR` where the bundle puts its own: the same bytes, or
/// replaced with `--overwrite`, else an error.
fn check_existing(opts: &BundleOptions, work: &Path) -> Result<()> {
    let mut clashes = BTreeSet::new();
    for n in crate::tree::scan(work)? {
        let existing = opts.into.join(&n.rel);
        let is_file = matches!(n.kind, crate::tree::NodeKind::File { .. });
        if is_file && existing.is_file() && !same_bytes(&existing, &work.join(&n.rel))? {
            clashes.insert(existing.display().to_string());
        }
    }
    if clashes.is_empty() || opts.overwrite {
        return Ok(());
    }
    Err(ArtifactError::input(
        &opts.into,
        format!(
            "already holds other files where the bundle goes (pass --overwrite to replace them): {}",
            clashes.into_iter().collect::<Vec<_>>().join(", ")
        ),
    ))
}

fn bundled_binary(p: &Piece) -> BundledBinary {
    let o = p.offloaded.as_ref();
    let metadata = o.map(|o| o.repointed.as_ref().unwrap_or(&o.metadata));
    BundledBinary {
        source: p.source.clone(),
        dest: p.dest.clone(),
        dependency: p.dependency,
        offloaded: o.is_some(),
        search_paths: metadata.map(|m| m.search_paths.clone()).unwrap_or_default(),
        repointed: o.is_some_and(|o| o.repointed.is_some()),
        targets: o
            .map(|o| o.targets.iter().cloned().collect())
            .unwrap_or_default(),
    }
}
