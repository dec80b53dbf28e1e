//! The benchmarks' inputs, built (`kpack-bench` measures kpack on them):
//! - [`rocm`]: Debian's ROCm libraries, laid out as split inputs, their
//!   device code as files, copies of them that share no code object;
//! - [`wheel`]: wheels packed by PyPI's `wheel`; [`torch`]: torch-like
//!   wheels of librocsparse copies;
//! - [`large_host`]: fat libraries with a large host part and a wheel
//!   holding one;
//! - [`ccob`]: librocsparse re-bundled into compressed bundles (CCOB v3)
//!   inside a linked library.
//!
//! Like the rest of the test kit they are made and checked without kpack's
//! own code: bundles are read by [`crate::oracle`]. What is slow to build
//! is kept in `target/bench/cache/` ([`cache_dir`]).

use std::path::{Path, PathBuf};

pub mod ccob;
pub mod large_host;
pub mod rocm;
pub mod torch;
pub mod wheel;

/// `root/target/bench/cache/<name>`: inputs built once and kept.
pub fn cache_dir(root: &Path, name: &str) -> PathBuf {
    root.join("target/bench/cache").join(name)
}
