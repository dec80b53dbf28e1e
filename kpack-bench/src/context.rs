//! What every section is given.

use std::path::PathBuf;

/// Paths and settings shared by the sections.
pub struct Ctx {
    /// The workspace root.
    pub root: PathBuf,
    /// The release `kpack` binary measured.
    pub kpack: PathBuf,
    /// `target/bench/work`: the sections' inputs and outputs.
    pub work: PathBuf,
    /// Repetitions of every measured process.
    pub reps: usize,
    /// Keep the outputs of the last repetition in `work` (`--keep-work`).
    pub keep_work: bool,
}
