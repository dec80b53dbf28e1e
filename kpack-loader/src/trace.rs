//! What one search did, step by step (`kpack why`): reported by the search
//! itself (`search.rs`) as it runs, so that an explanation can never
//! disagree with what the runtime does.

use std::path::PathBuf;

use serde::Serialize;

/// The trace of one load: the key, the targets each architecture stands
/// for, every candidate archive and every try of a target on one.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Trace {
    /// `kernel_name#co_index`.
    pub key: String,
    /// The requested architectures, in priority order, with their
    /// compatible targets (most specific first).
    pub agents: Vec<AgentTrace>,
    /// The candidate archive paths, in search order.
    pub candidates: Vec<CandidateTrace>,
    /// Each try of a target on a candidate that lists it, in order.
    pub attempts: Vec<Attempt>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AgentTrace {
    pub arch: String,
    pub targets: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CandidateTrace {
    pub path: PathBuf,
    #[serde(flatten)]
    pub status: CandidateStatus,
}

/// What became of a candidate archive path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CandidateStatus {
    /// Not looked at: the search had found the code object before it.
    NotReached,
    /// The path does not resolve (no such file).
    Missing { error: String },
    /// The file exists but does not open as an archive.
    Unusable { error: String },
    /// The same archive as an earlier candidate, searched there.
    SameAs { candidate: usize },
    /// Opened: its canonical path and the targets it lists (`gfx_arches`).
    Opened {
        canonical: PathBuf,
        targets: Vec<String>,
    },
}

/// One try of a target on a candidate that lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    pub target: String,
    /// Index into [`Trace::candidates`].
    pub candidate: usize,
    #[serde(flatten)]
    pub outcome: AttemptOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// The archive lists the target but has no entry for the key.
    KeyMissing,
    /// The entry is there but was split from another build than the binary
    /// (their device digests differ): passed over as a missing key is.
    OtherBuild { binary: String, archive: String },
    /// The entry is there but does not read (the search goes on).
    ReadFailed { error: String },
    /// Found and read: the search ends here.
    Loaded { size: u64 },
}
