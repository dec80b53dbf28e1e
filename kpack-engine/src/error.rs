//! The engine's error: what went wrong in a split, recombine, verify,
//! pack-tree or wheel operation.

use std::path::PathBuf;

use crate::artifact::MANIFEST;
use crate::databases::Database;

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
    /// An option's value that is wrong whatever the input (a face's
    /// argument: compression, zstd level, worker threads).
    #[error("{option}: {what}")]
    BadOption { option: &'static str, what: String },
    #[error("--gpu-targets: {what}")]
    BadGpuTargets { what: String },
    #[error("--expect-targets: {what}")]
    BadExpectTargets { what: String },
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
    /// Two shards put different contents under one path of one output
    /// artifact, and the config names no winner.
    #[error(
        "conflicting files: {artifact}/{path} differs between shard {} and shard {} (set validation.error_on_duplicate_device_code to false to take the primary shard's)",
        shards.0, shards.1
    )]
    FileConflict {
        artifact: String,
        path: String,
        shards: (String, String),
    },
    /// recombine: a group artifact of a shard holds code objects split
    /// from another build than the binary of the shard's generic artifact.
    #[error(
        "shard {}: {} holds {} @ {} from another build than the binary in {} ({}): the shard's generic artifact is not the one its device artifacts were split with",
        .0.shard, .0.archive.display(), .0.key, .0.target, .0.generic.display(), .0.builds
    )]
    ShardBuildMismatch(Box<ShardBuildMismatch>),
    /// `--expect-targets`: a target listed is missing from the inputs, or
    /// present with no code object.
    #[error("refusing to build a partial {output}: {target} expected but {found} in {}", input.display())]
    ExpectedTarget {
        output: &'static str,
        target: String,
        found: String,
        input: PathBuf,
    },
    #[error("{failed} of {total} artifact(s) failed")]
    ArtifactsFailed { failed: usize, total: usize },
    #[error("verification failed: {problems} problem(s)")]
    VerifyFailed { problems: usize },
    /// `doctor` ran and found problems.
    #[error("{problems} problem(s) found")]
    ProblemsFound { problems: usize },
    /// `doctor` could not check anything (no target, a path that does not
    /// exist); the command exits with status 2.
    #[error("nothing could be checked: {reason}")]
    NothingToCheck { reason: String },
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
    /// What a verifier's report of `problems` problems makes: nothing
    /// without any, else [`ArtifactError::VerifyFailed`].
    pub(crate) fn verify_failed(problems: usize) -> crate::Result<()> {
        match problems {
            0 => Ok(()),
            problems => Err(ArtifactError::VerifyFailed { problems }),
        }
    }

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

/// An archive entry of a shard split from another build than the binary
/// of the shard's generic artifact ([`ArtifactError::ShardBuildMismatch`]).
#[derive(Debug)]
pub struct ShardBuildMismatch {
    pub shard: String,
    /// The archive (in the shard's group artifact).
    pub archive: PathBuf,
    /// The entry's key and target.
    pub key: String,
    pub target: String,
    /// The shard's generic artifact.
    pub generic: PathBuf,
    /// The two builds in words ([`kpack_format::provenance::builds`]).
    pub builds: String,
}
