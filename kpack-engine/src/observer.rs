//! How long-running engine operations report: notes, warnings and
//! progress go to an [`Observer`]; nothing in the engine prints.

use crate::error::{ArtifactError, Result};

/// Receives what a long-running artifact operation has to say. All methods
/// may be called from several threads at once; the default implementations
/// do nothing.
pub trait Observer: Sync {
    /// Informational line (shown under `--verbose`).
    fn note(&self, _message: &str) {}
    /// Something the user should see even without `--verbose`.
    fn warn(&self, _message: &str) {}
    /// `bytes` more work is known to be ahead.
    fn add_work(&self, _bytes: u64) {}
    /// `bytes` of work were done.
    fn advance(&self, _bytes: u64) {}
}

/// An [`Observer`] that ignores everything.
pub struct Silent;

impl Observer for Silent {}

/// Run `f` on a thread pool of `jobs` threads (`None`: rayon's default, all
/// cores).
pub fn with_jobs<T: Send>(jobs: Option<usize>, f: impl FnOnce() -> T + Send) -> Result<T> {
    match jobs {
        None => Ok(f()),
        Some(n) => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n.max(1))
                .build()
                .map_err(|e| ArtifactError::ThreadPool {
                    threads: n,
                    reason: e.to_string(),
                })?;
            Ok(pool.install(f))
        }
    }
}

/// A note: shown (`--verbose`) and kept in `notes` (a summary's).
pub(crate) fn note(observer: &dyn Observer, notes: &mut Vec<String>, msg: String) {
    observer.note(&msg);
    notes.push(msg);
}
