//! `kpack pack-tree` (SPEC §5; the seed's packing visitor): a whole install
//! tree into a host-only tree plus `<out>/.kpack/<group>_<target>.kpack`,
//! one archive per target. Each fat binary's metadata has `kernel_name` =
//! its path relative to the tree root and one search path
//! `"../" * depth + ".kpack/<group>_@GFXARCH@.kpack"`; archive keys carry
//! `#<bundle index>`, so the runtime finds them (the reference's did not).
//!
//! The output tree is assembled under a staging name beside `output` and
//! renamed into place when complete.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::pack::{FileJob, Outcome, Packer};
use super::split::search_path;
use super::tree::{copy_dir_modes, copy_symlink, make_dirs, remove_tree, scan, NodeKind};
use super::{ArchiveInfo, ArtifactError, Observer, Result};
use crate::archive::{Scheme, DEFAULT_ZSTD_LEVEL};
use crate::offload::archive_file_name;
use crate::output::parent_dir;
use crate::target::TargetId;

#[derive(Debug, Clone)]
pub struct PackTreeOptions {
    pub group_name: String,
    /// The archives' `gfx_arch_family` (default: each archive's target).
    pub gfx_arch_family: Option<String>,
    /// Keep only code objects of these architectures (processors take every
    /// feature variant; full target IDs only themselves). Empty: all.
    pub gfx_arches: Vec<String>,
    pub scheme: Scheme,
    pub level: i32,
    /// Replace an existing, non-empty output directory.
    pub overwrite: bool,
    /// Scratch space (default: beside the output).
    pub tmp_dir: Option<PathBuf>,
}

impl PackTreeOptions {
    pub fn new(group_name: impl Into<String>) -> Self {
        PackTreeOptions {
            group_name: group_name.into(),
            gfx_arch_family: None,
            gfx_arches: Vec::new(),
            scheme: Scheme::ZstdPerKernel,
            level: DEFAULT_ZSTD_LEVEL,
            overwrite: false,
            tmp_dir: None,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PackTreeSummary {
    pub input: String,
    pub output: String,
    pub group_name: String,
    pub files: usize,
    pub symlinks: usize,
    pub directories: usize,
    pub binaries: usize,
    pub wrappers: usize,
    pub already_offloaded: usize,
    pub link_inputs: usize,
    pub code_objects: usize,
    /// Code objects of targets left out by `gfx_arches`.
    pub dropped_code_objects: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub archives: Vec<ArchiveInfo>,
    pub notes: Vec<String>,
    pub seconds: f64,
}

pub fn pack_tree(
    input: &Path,
    output: &Path,
    opts: &PackTreeOptions,
    observer: &dyn Observer,
) -> Result<PackTreeSummary> {
    let start = Instant::now();
    let g = &opts.group_name;
    if g.is_empty() || g.contains('/') || g.starts_with('.') {
        return Err(ArtifactError::input(
            input,
            format!("invalid group name {g:?}"),
        ));
    }
    let keep: Vec<String> = opts.gfx_arches.clone();
    for a in &keep {
        TargetId::parse(a)
            .map_err(|e| ArtifactError::input(input, format!("--gfx-arches: {e}")))?;
    }
    if !input.is_dir() {
        return Err(ArtifactError::input(input, "not a directory"));
    }
    // Archives are written to `<output>/.kpack/`: an input `.kpack` that is
    // a symlink (copied as one) would have them written wherever it points.
    let kpack_dir = input.join(".kpack");
    if fs::symlink_metadata(&kpack_dir).is_ok_and(|m| !m.is_dir()) {
        return Err(ArtifactError::input(
            kpack_dir,
            "is a symlink or a file, where pack-tree writes its archives (.kpack/<group>_<target>.kpack)",
        ));
    }
    let in_canon = fs::canonicalize(input).map_err(|e| ArtifactError::io(input, e))?;
    let out_abs = std::path::absolute(output).map_err(|e| ArtifactError::io(output, e))?;
    let out_parent = parent_dir(&out_abs).to_path_buf();
    make_dirs(&out_parent)?;
    let out_canon = fs::canonicalize(&out_parent)
        .map_err(|e| ArtifactError::io(&out_parent, e))?
        .join(out_abs.file_name().unwrap_or_default());
    if out_canon.starts_with(&in_canon) || in_canon.starts_with(&out_canon) {
        return Err(ArtifactError::input(
            output,
            format!(
                "the output must lie outside the input tree {}",
                input.display()
            ),
        ));
    }
    let exists_nonempty = fs::read_dir(&out_abs)
        .map(|mut r| r.next().is_some())
        .unwrap_or(false)
        || (out_abs.symlink_metadata().is_ok() && !out_abs.is_dir());
    if exists_nonempty && !opts.overwrite {
        return Err(ArtifactError::OutputExists {
            path: output.to_path_buf(),
        });
    }

    let mut s = PackTreeSummary {
        input: input.display().to_string(),
        output: output.display().to_string(),
        group_name: g.clone(),
        ..Default::default()
    };
    let staging = tempfile::Builder::new()
        .prefix(".kpack-staging-")
        .tempdir_in(&out_parent)
        .map_err(|e| ArtifactError::io(&out_parent, e))?;
    let tree = staging.path().join("tree");
    make_dirs(&tree)?;
    let scratch_parent = opts.tmp_dir.as_deref().unwrap_or(&out_parent);
    make_dirs(scratch_parent)?;
    let scratch = tempfile::Builder::new()
        .prefix(".kpack-scratch-")
        .tempdir_in(scratch_parent)
        .map_err(|e| ArtifactError::io(scratch_parent, e))?;

    let mut jobs = Vec::new();
    for n in scan(input)? {
        let dst = tree.join(&n.rel);
        match &n.kind {
            NodeKind::Dir => {
                s.directories += 1;
                make_dirs(&dst)?;
            }
            NodeKind::Symlink(t) => {
                s.symlinks += 1;
                copy_symlink(t, &dst)?;
            }
            NodeKind::File { size } => {
                s.files += 1;
                s.bytes_in += size;
                let rel = super::tree::rel_string(&n.rel);
                jobs.push(FileJob {
                    src: input.join(&n.rel),
                    size: *size,
                    mode: n.mode,
                    dst,
                    search_path: search_path(rel.as_deref().unwrap_or(""), g),
                    kernel_name: rel,
                    source_prefix: None,
                    database: None,
                });
            }
        }
    }
    observer.add_work(s.bytes_in);

    let keep_fn = |t: &str| {
        TargetId::parse(t).is_ok_and(|t| keep.iter().any(|a| super::config::arch_matches(a, &t)))
    };
    let packer = Packer {
        scheme: opts.scheme,
        level: opts.level,
        scratch: scratch.path(),
        observer,
        keep_target: if keep.is_empty() {
            None
        } else {
            Some(&keep_fn)
        },
    };
    let done = packer.run(&jobs)?;
    let mut binaries = Vec::new();
    for (d, job) in done.iter().zip(&jobs) {
        s.bytes_out += d.bytes_out;
        match &d.outcome {
            Outcome::Offloaded(b) => {
                s.binaries += 1;
                s.wrappers += b.wrappers;
                s.code_objects += b.code_objects.len();
                s.dropped_code_objects += b.dropped;
                binaries.push(b.as_ref());
            }
            Outcome::AlreadyOffloaded => {
                s.already_offloaded += 1;
                let msg = format!("{}: already offloaded: copied as it is", job.src.display());
                observer.note(&msg);
                s.notes.push(msg);
            }
            Outcome::LinkInput { note } => {
                s.link_inputs += 1;
                if let Some(msg) = note {
                    observer.note(msg);
                    s.notes.push(msg.clone());
                }
            }
            Outcome::Copied | Outcome::Database { .. } => {}
        }
    }
    let family = |t: &str| {
        opts.gfx_arch_family
            .clone()
            .unwrap_or_else(|| t.to_string())
    };
    let kpack_dir = tree.join(".kpack");
    let place = |t: &str, _: &[String]| {
        let name = archive_file_name(g, t);
        (kpack_dir.join(&name), format!(".kpack/{name}"))
    };
    s.archives = packer.write_archives(&binaries, g, &family, &place)?;
    s.bytes_out += s.archives.iter().map(|a| a.bytes_out).sum::<u64>();
    drop(binaries);
    drop(done);
    drop(scratch);
    copy_dir_modes(&tree, input)?;

    // Into place.
    if out_abs.symlink_metadata().is_ok() {
        let old = staging.path().join("replaced");
        fs::rename(&out_abs, &old).map_err(|e| ArtifactError::io(&out_abs, e))?;
        fs::rename(&tree, &out_abs).map_err(|e| ArtifactError::io(&out_abs, e))?;
        if old.is_dir() {
            remove_tree(&old)?;
        }
    } else {
        fs::rename(&tree, &out_abs).map_err(|e| ArtifactError::io(&out_abs, e))?;
    }
    s.seconds = start.elapsed().as_secs_f64();
    Ok(s)
}
