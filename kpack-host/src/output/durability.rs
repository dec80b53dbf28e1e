//! Durability on request, once per command ([`Durability`]).
//!
//! While at least one [`Durability`] that is on is open in the process, the
//! writers of [`super`] record each output they rename into place (a file,
//! or a directory tree). [`Durability::commit`] takes everything recorded so
//! far and fsyncs it: every file in parallel, then every distinct directory
//! once (the directories of the files, the trees' directories and the
//! directories the trees were renamed into). With nothing open, nothing is
//! recorded and nothing is fsynced.
//!
//! Several commands may run at once in one process (Python threads): what
//! one commit takes may include another command's outputs, which are then
//! fsynced early; a commit waits for any commit in progress before
//! returning, so an output recorded before it began is on disk when it
//! returns, whoever synced it.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rayon::prelude::*;

use super::{collect_tree, open_for_sync, parent_dir};
use crate::error::{Result, WithPath};

/// The environment variable that turns durability on for every face of
/// kpack (the `kpack` command, the Python API, CMake's
/// `kpack_offload_target`): `KPACK_DURABLE=1`.
pub const DURABLE_ENV: &str = "KPACK_DURABLE";

/// Whether [`DURABLE_ENV`] asks for durable outputs: `1`, `true`, `yes` or
/// `on` (any case). Unset, empty, `0`, `false`, `no`, `off`: not.
pub fn durable_from_env() -> bool {
    std::env::var(DURABLE_ENV).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// An output renamed into place.
enum Output {
    File(PathBuf),
    /// A directory and everything below it.
    Tree(PathBuf),
}

/// What is recorded, and how many durabilities are open.
struct Pending {
    open: usize,
    outputs: Vec<Output>,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    open: 0,
    outputs: Vec::new(),
});
/// Held by a commit while it syncs what it took.
static SYNCING: Mutex<()> = Mutex::new(());
/// fsync calls made by this module (files and directories).
static SYNC_CALLS: AtomicUsize = AtomicUsize::new(0);

fn pending() -> MutexGuard<'static, Pending> {
    PENDING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Record a file renamed into place (nothing when no durability is open).
pub(super) fn record_file(path: &Path) {
    record(|| Output::File(path.to_path_buf()));
}

/// Record a directory tree renamed into place.
pub(super) fn record_tree(dir: &Path) {
    record(|| Output::Tree(dir.to_path_buf()));
}

fn record(output: impl FnOnce() -> Output) {
    let mut p = pending();
    if p.open > 0 {
        p.outputs.push(output());
    }
}

/// Whether outputs are being recorded (some durability is open): callers
/// may skip collecting what they would record.
pub(super) fn recording() -> bool {
    pending().open > 0
}

/// The number of fsync calls durability made in this process so far (for
/// tests: default mode makes none).
pub fn sync_calls() -> usize {
    SYNC_CALLS.load(Ordering::Relaxed)
}

/// The durability of one command's outputs: opened at its start, committed
/// at its end.
///
/// ```no_run
/// use kpack_host::output::{self, Durability};
/// let durable = Durability::begin(output::durable_from_env());
/// output::write_file_atomically("out/a.bin".as_ref(), b"...")?;
/// output::write_file_atomically("out/b.bin".as_ref(), b"...")?;
/// durable.commit()?; // both files and `out` fsynced, once
/// # Ok::<(), kpack_host::Error>(())
/// ```
///
/// Off (`begin(false)`), it does nothing at all. Dropped without commit (the
/// command failed), nothing is synced.
#[must_use = "commit it at the end of the command"]
pub struct Durability {
    on: bool,
}

impl Durability {
    /// Open a durability (on: outputs are recorded from now on).
    pub fn begin(on: bool) -> Durability {
        if on {
            pending().open += 1;
        }
        Durability { on }
    }

    /// Whether it is on.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// fsync every output recorded since it began (and any other recorded
    /// meanwhile); returns how many files and directories were synced.
    pub fn commit(self) -> Result<usize> {
        if !self.on {
            return Ok(0);
        }
        let _syncing = SYNCING.lock().unwrap_or_else(PoisonError::into_inner);
        let outputs = std::mem::take(&mut pending().outputs);
        sync_outputs(outputs)
    }
}

impl Drop for Durability {
    fn drop(&mut self) {
        if self.on {
            let mut p = pending();
            p.open -= 1;
            if p.open == 0 {
                p.outputs = Vec::new();
            }
        }
    }
}

/// fsync the files of `outputs` in parallel, then each distinct directory.
fn sync_outputs(outputs: Vec<Output>) -> Result<usize> {
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for o in outputs {
        match o {
            Output::File(f) => {
                dirs.push(parent_dir(&f).to_path_buf());
                files.push(f);
            }
            // Replaced or removed by a later step of the command.
            Output::Tree(t) if fs::symlink_metadata(&t).is_err() => {}
            Output::Tree(t) => {
                dirs.push(parent_dir(&t).to_path_buf());
                dirs.push(t.clone());
                collect_tree(&t, &mut files, &mut dirs)?;
            }
        }
    }
    let files = distinct(files);
    let dirs = distinct(dirs);
    files.par_iter().try_for_each(|f| sync_path(f))?;
    dirs.par_iter().try_for_each(|d| sync_path(d))?;
    Ok(files.len() + dirs.len())
}

fn distinct(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut seen = HashSet::with_capacity(paths.len());
    paths.retain(|p| seen.insert(p.clone()));
    paths
}

/// fsync one file or directory (skipped when it cannot be opened for lack
/// of permission, or is gone: replaced or removed by a later step).
fn sync_path(path: &Path) -> Result<()> {
    let file = match open_for_sync(path) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_path(path),
    };
    SYNC_CALLS.fetch_add(1, Ordering::Relaxed);
    file.sync_all().with_path(path)
}
