//! `kpack pack-tree` (formats.md §6.6; the seed's packing visitor): a whole install
//! tree into a host-only tree plus `<out>/.kpack/<group>_<target>.kpack`,
//! one archive per target. Each fat binary's metadata has `kernel_name` =
//! its path relative to the tree root and one search path
//! `"../" * depth + ".kpack/<group>_@GFXARCH@.kpack"`; archive keys carry
//! `#<bundle index>`, so the runtime finds them (the reference's did not).
//!
//! The output tree is assembled under a staging name beside `output`
//! ([`StagedDir::new`]) and renamed into place when complete; staging and
//! scratch directories a killed run left there are removed first.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::config::arch_matches;
use crate::archive::{Scheme, DEFAULT_ZSTD_LEVEL};
use crate::pack::{self, search_path, Done, FileJob, Offloaded, Packer, TreeCounts};
use crate::target::TargetId;
use crate::tree::{copy_dir_modes, make_dirs, rel_string, scan};
use crate::{leftover_removed, note, ArchiveInfo, ArtifactError, Observer, Result};
use kpack_host::offload::archive_file_name;
use kpack_host::output::{parent_dir, ScratchDir, StagedDir};

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
    /// Keep only code objects of `arches`: each item one architecture or
    /// several separated by commas (`gfx942,gfx90a`), blanks ignored.
    pub fn set_gfx_arches<S: AsRef<str>>(&mut self, arches: &[S]) {
        self.gfx_arches = arches
            .iter()
            .flat_map(|a| a.as_ref().split(','))
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
    }

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
    /// What the walk and phase 1 counted.
    #[serde(flatten)]
    pub counts: TreeCounts,
    pub archives: Vec<ArchiveInfo>,
    /// Code objects stored once for several binaries, over all archives
    /// (see [`crate::ArchiveInfo::shared_code_objects`]).
    pub shared_code_objects: usize,
    /// Uncompressed bytes not stored again thanks to them.
    pub bytes_saved: u64,
    pub notes: Vec<String>,
    pub seconds: f64,
}

/// Pack the tree `input` into `output`. The plan:
/// 1. check the options and paths (nothing is written if they are wrong);
/// 2. stage the output tree beside `output` (removing leftovers of killed
///    runs there) and take scratch space;
/// 3. walk the input: directories and symlinks are created in the staged
///    tree, every regular file becomes a job;
/// 4. phase 1 ([`Packer::run`]): fat binaries offloaded, other files copied;
/// 5. phase 2: one archive per target in `.kpack/`;
/// 6. the input's directory modes, and the staged tree renamed into place
///    (replacing an existing `output`).
pub fn pack_tree(
    input: &Path,
    output: &Path,
    opts: &PackTreeOptions,
    observer: &dyn Observer,
) -> Result<PackTreeSummary> {
    let start = Instant::now();
    check_options(input, opts)?;
    let out_abs = check_paths(input, output, opts)?;
    let mut s = PackTreeSummary {
        input: input.display().to_string(),
        output: output.display().to_string(),
        group_name: opts.group_name.clone(),
        ..Default::default()
    };
    let stage = StagedDir::new(&out_abs)?;
    for leftover in stage.swept() {
        note(observer, &mut s.notes, leftover_removed(leftover));
    }
    let scratch = ScratchDir::new(opts.tmp_dir.as_deref().unwrap_or(parent_dir(&out_abs)))?;
    let tree = stage.path();

    let jobs = walk_input(input, tree, &opts.group_name, &mut s)?;
    observer.add_work(s.counts.bytes_in);
    let keep = |t: &str| {
        TargetId::parse(t).is_ok_and(|t| opts.gfx_arches.iter().any(|a| arch_matches(a, &t)))
    };
    let packer = Packer {
        scheme: opts.scheme,
        level: opts.level,
        scratch: scratch.path(),
        observer,
        keep_target: if opts.gfx_arches.is_empty() {
            None
        } else {
            Some(&keep)
        },
    };
    let done = packer.run(&jobs)?;
    let binaries = record_outcomes(&done, &jobs, &mut s, observer);
    s.archives = write_archives(&packer, &binaries, tree, opts)?;
    s.counts.bytes_out += s.archives.iter().map(|a| a.bytes_out).sum::<u64>();
    s.shared_code_objects = s.archives.iter().map(|a| a.shared_code_objects).sum();
    s.bytes_saved = s.archives.iter().map(|a| a.bytes_saved).sum();
    drop(binaries);
    drop(done);
    drop(scratch);

    copy_dir_modes(tree, input)?;
    stage.commit_replace()?;
    s.seconds = start.elapsed().as_secs_f64();
    Ok(s)
}

/// Step 1: the group name and `--gfx-arches`.
fn check_options(input: &Path, opts: &PackTreeOptions) -> Result<()> {
    let g = &opts.group_name;
    if g.is_empty() || g.contains('/') || g.starts_with('.') {
        return Err(ArtifactError::input(
            input,
            format!("invalid group name {g:?}"),
        ));
    }
    for a in &opts.gfx_arches {
        TargetId::parse(a)
            .map_err(|e| ArtifactError::input(input, format!("--gfx-arches: {e}")))?;
    }
    Ok(())
}

/// Step 1: the input is a directory whose `.kpack` (if any) is one too, the
/// output lies outside it and is empty or missing (unless `overwrite`).
/// Returns the output made absolute; creates its parent.
fn check_paths(input: &Path, output: &Path, opts: &PackTreeOptions) -> Result<PathBuf> {
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
    Ok(out_abs)
}

/// Step 3: create the directories and symlinks of `input` in `tree`, and
/// make a job of every regular file (its kernel name: its path in the tree).
fn walk_input(
    input: &Path,
    tree: &Path,
    group: &str,
    s: &mut PackTreeSummary,
) -> Result<Vec<FileJob>> {
    let mut jobs = Vec::new();
    for n in scan(input)? {
        let dst = tree.join(&n.rel);
        if let Some(size) = pack::place(&mut s.counts, &n, &dst)? {
            let rel = rel_string(&n.rel);
            jobs.push(FileJob {
                src: input.join(&n.rel),
                size,
                mode: n.mode,
                dst,
                search_path: search_path(rel.as_deref().unwrap_or(""), group),
                kernel_name: rel,
                source_prefix: None,
                database: None,
            });
        }
    }
    Ok(jobs)
}

/// Count what phase 1 did to each file; returns the offloaded binaries.
fn record_outcomes<'d>(
    done: &'d [Done],
    jobs: &[FileJob],
    s: &mut PackTreeSummary,
    observer: &dyn Observer,
) -> Vec<&'d Offloaded> {
    let notes = &mut s.notes;
    let r = pack::record_outcomes(done, jobs, &mut s.counts, |msg| note(observer, notes, msg));
    r.binaries
}

/// Step 5: `tree/.kpack/<group>_<target>.kpack` per target.
fn write_archives(
    packer: &Packer<'_>,
    binaries: &[&Offloaded],
    tree: &Path,
    opts: &PackTreeOptions,
) -> Result<Vec<ArchiveInfo>> {
    let g = &opts.group_name;
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
    packer.write_archives(binaries, g, &family, &place)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::test_util::{
        child_dir, entries, hidden_entries, killed_run_leftovers, run_killed_child, snapshot,
        DieOnAdvance,
    };
    use crate::Silent;

    fn small_tree(dir: &Path) {
        fs::create_dir_all(dir.join("lib")).unwrap();
        fs::create_dir_all(dir.join("share/empty")).unwrap();
        fs::write(dir.join("lib/libx.so.1"), b"not an ELF file").unwrap();
        std::os::unix::fs::symlink("libx.so.1", dir.join("lib/libx.so")).unwrap();
    }

    /// Staging and scratch directories that a killed pack-tree left beside
    /// the output are removed by the next pack-tree there, which writes
    /// the same tree as in a clean directory (also when replacing it).
    #[test]
    fn leftovers_of_a_killed_pack_tree_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("in");
        small_tree(&input);
        let clean = t.path().join("clean/out");
        pack_tree(&input, &clean, &PackTreeOptions::new("g"), &Silent).unwrap();
        let want = snapshot(&clean);
        assert_eq!(want["lib/libx.so"].1, b"libx.so.1");

        let parent = t.path().join("again");
        killed_run_leftovers(&parent);
        let out = parent.join("out");
        let s = pack_tree(&input, &out, &PackTreeOptions::new("g"), &Silent).unwrap();
        assert_eq!(hidden_entries(&parent), Vec::<String>::new());
        assert_eq!(snapshot(&out), want);
        assert_eq!(s.notes.len(), 2, "{:?}", s.notes);

        let mut o = PackTreeOptions::new("g");
        let e = pack_tree(&input, &out, &o, &Silent).unwrap_err();
        assert!(matches!(e, ArtifactError::OutputExists { .. }), "{e}");
        fs::write(out.join("stale"), b"from before").unwrap();
        o.overwrite = true;
        pack_tree(&input, &out, &o, &Silent).unwrap();
        assert_eq!(snapshot(&out), want);
        assert_eq!(hidden_entries(&parent), Vec::<String>::new());
    }

    /// A pack-tree that dies in the middle leaves only hidden staging and
    /// scratch directories beside the output; the next one removes them.
    #[test]
    fn a_pack_tree_killed_mid_run_is_cleaned_up_by_the_next() {
        if let Some(dir) = child_dir() {
            let o = PackTreeOptions::new("g");
            let r = pack_tree(&dir.join("in"), &dir.join("out/tree"), &o, &DieOnAdvance);
            panic!("not killed: {:?}", r.map(|_| ()));
        }
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("in");
        small_tree(&input);
        run_killed_child(
            "artifact::pack_tree::tests::a_pack_tree_killed_mid_run_is_cleaned_up_by_the_next",
            t.path(),
        );
        let parent = t.path().join("out");
        let left = entries(&parent);
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left.iter().all(|n| n.starts_with(".kpack-")), "{left:?}");
        let out = parent.join("tree");
        pack_tree(&input, &out, &PackTreeOptions::new("g"), &Silent).unwrap();
        assert_eq!(entries(&parent), ["tree"]);
        let clean = t.path().join("clean");
        pack_tree(&input, &clean, &PackTreeOptions::new("g"), &Silent).unwrap();
        assert_eq!(snapshot(&out), snapshot(&clean));
    }
}
