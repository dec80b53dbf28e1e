//! Artifacts (formats.md §6): the map/reduce that TheRock's CI runs over build
//! artifacts, and the packing of a whole install tree.
//!
//! - [`split`]: one artifact (or every artifact of a shard) into a generic
//!   artifact with offloaded host binaries and one artifact per target with
//!   that target's `.kpack` archive and database files;
//! - [`verify`]: the invariants of split (and recombined) artifacts, down to
//!   resolving every wrapper of every offloaded binary through the
//!   [`loader`](crate::loader) in the installed (flattened) layout;
//! - [`recombine`](mod@recombine): split artifacts of several shards into one generic
//!   artifact and one artifact per architecture group, by a packaging
//!   config;
//! - [`pack_tree`](mod@pack_tree): a whole install tree into a host-only tree plus
//!   `.kpack/<group>_<target>.kpack` archives.
//!
//! Every output directory appears under its final name only when complete:
//! it is assembled under a hidden staging name (`.kpack-staging-*`) in the
//! output directory and renamed into place. Everything is processed in
//! sorted order and archives are written in a fixed order, so the bytes
//! written do not depend on the number of threads or on the order in which
//! the file system lists entries.
//!
//! Nothing here prints: progress, notes and warnings go to an [`Observer`].

pub mod config;
pub mod databases;
pub mod manifest;
pub(crate) mod pack;
pub mod pack_tree;
pub mod recombine;
pub mod split;
#[cfg(test)]
mod test_util;
pub(crate) mod tree;
pub mod verify;

use std::path::PathBuf;

use serde::Serialize;

pub use config::{ArchitectureGroup, PackagingConfig, Validation};
pub use databases::Database;
pub use manifest::{artifact_prefix, OutputName, MANIFEST};
pub use pack_tree::{pack_tree, PackTreeOptions, PackTreeSummary};
pub use recombine::{recombine, RecombineOptions, RecombineSummary};
pub use split::{split_artifact, split_batch, GpuTargets, SplitOptions, SplitSummary};
pub use verify::{verify_artifacts, VerifyOptions, VerifyReport};

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

/// One `.kpack` archive written by split or pack-tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchiveInfo {
    pub target: String,
    /// Path relative to the output directory.
    pub path: String,
    /// The install prefix it was placed in (split).
    pub prefix: Option<String>,
    pub code_objects: usize,
    /// Sum of the code objects' sizes.
    pub bytes_in: u64,
    /// Size of the archive file.
    pub bytes_out: u64,
    /// Code objects stored once for several binaries: entries that share
    /// the ordinal of an identical code object (same target, same bytes).
    pub shared_code_objects: usize,
    /// Uncompressed bytes those shared entries did not store again.
    pub bytes_saved: u64,
}

/// What went wrong in an artifact operation. Input problems each have their
/// own variant, so that their messages say exactly what was wrong where.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error(transparent)]
    Core(#[from] kpack_host::Error),
    #[error("{}: missing artifact manifest ({MANIFEST})", dir.display())]
    MissingManifest { dir: PathBuf },
    #[error("{}: line {line}: prefix {prefix:?} {reason}", manifest.display())]
    BadManifestLine {
        manifest: PathBuf,
        line: usize,
        prefix: String,
        reason: String,
    },
    #[error("unknown database handler {name:?} (known: {})", Database::names().join(", "))]
    UnknownDatabase { name: String },
    #[error("--gpu-targets: {what}")]
    BadGpuTargets { what: String },
    #[error("{}: {what}", path.display())]
    Config { path: PathBuf, what: String },
    #[error("{}: already exists (pass --overwrite to replace it)", path.display())]
    OutputExists { path: PathBuf },
    #[error("{}: {what}", path.display())]
    Input { path: PathBuf, what: String },
    #[error(
        "duplicate device code: component {component}, target {target}: shards {} provide different bytes ({detail})",
        shards.join(" and ")
    )]
    DuplicateDeviceCode {
        component: String,
        target: String,
        shards: Vec<String>,
        detail: String,
    },
    #[error(
        "configured architecture(s) provided by no shard: {} (validation.error_on_missing_architecture)",
        architectures.join(", ")
    )]
    MissingArchitectures { architectures: Vec<String> },
    #[error(
        "generic artifacts differ: {component}_generic in shards {} and {}: {} (validation.verify_generic_artifacts_match)",
        shards.0, shards.1, differences.join("; ")
    )]
    GenericMismatch {
        component: String,
        shards: (String, String),
        differences: Vec<String>,
    },
    #[error("{failed} of {total} artifact(s) failed")]
    ArtifactsFailed { failed: usize, total: usize },
    #[error("verification failed: {problems} problem(s)")]
    VerifyFailed { problems: usize },
    #[error("cannot start {threads} worker thread(s): {reason}")]
    ThreadPool { threads: usize, reason: String },
}

/// A file that did not open keeps its variant (`Io` or `Archive`).
impl From<kpack_loader::OpenError> for ArtifactError {
    fn from(e: kpack_loader::OpenError) -> Self {
        ArtifactError::Core(e.into())
    }
}

impl ArtifactError {
    pub(crate) fn input(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        ArtifactError::Input {
            path: path.into(),
            what: what.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, e: std::io::Error) -> Self {
        ArtifactError::Core(kpack_host::Error::Io {
            path: path.into(),
            source: e,
        })
    }
}

pub type Result<T, E = ArtifactError> = std::result::Result<T, E>;

/// The note for a leftover of a killed run that a new run removed.
pub(crate) fn leftover_removed(path: &std::path::Path) -> String {
    format!("{}: removed (left by an interrupted run)", path.display())
}

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
