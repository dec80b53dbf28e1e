//! What kpack's tests (`kpack-e2e`, the runtime library's tests) and
//! `xtask` share, defined once:
//! - [`fixtures`]: the HIP test fixtures, built (`cargo xtask fixtures`)
//!   and checked independently of kpack; [`manifest`]: `fixtures.json`,
//!   which describes them to the tests;
//! - [`malformed`]: the malformed-input corpus `tests/malformed/` (`cargo
//!   xtask malformed`);
//! - [`oracle`]: the independent `.hip_fatbin` splitter and
//!   clang-offload-bundler, the ground truth for device code;
//! - [`shards`]: the tutorial's shard tree, for the pipeline tests and the
//!   pipeline benchmark; [`tree`]: laying out and comparing trees;
//! - [`large_host`]: a fat library with a large, incompressible host part
//!   (`.rodata`), built at any size, for tests and the benchmarks;
//! - [`inputs`]: the benchmarks' inputs (ROCm libraries laid out, their
//!   device code, torch-like wheels, libraries in compressed bundles),
//!   built and cached;
//! - [`cprog`]: C/C++ test programs through the `cc` crate, and the native
//!   libraries of the static runtime library;
//! - [`workspace`]: the workspace root, cargo builds in the running test's
//!   profile, the runtime library as installed, programs that must succeed.

pub mod cprog;
pub mod fixtures;
pub mod inputs;
pub mod large_host;
pub mod malformed;
pub mod manifest;
pub mod oracle;
pub mod shards;
pub mod tree;
pub mod workspace;
