//! kpack-engine: the packing engine. One engine packs a tree of files,
//! whatever the job: TheRock build artifacts ([`artifact`]: split,
//! recombine, verify, pack-tree) and Python wheels ([`wheel`]).
//!
//! - `tree`: walking an input tree in sorted order, copying what stays;
//! - `pack`: the packer: each file classified once, fat binaries
//!   offloaded (kpack-host) in parallel, then one archive per target;
//! - `databases` ([`Database`]): the kernel-database handlers (which files belong to
//!   which GPU target);
//! - `observer` ([`Observer`]): notes, warnings and progress, for the CLI to show;
//! - [`options`]: the faces' option values (compression, zstd level,
//!   worker threads), checked one way;
//! - [`size`]: where the bytes of binaries, archives, trees and wheels go;
//! - `build_match`: whether the code objects a binary resolves to are of
//!   its own build (digests, else the kernels it names): the one rule of
//!   verify, `verify --tree` and doctor;
//! - [`install_tree`]: `verify --tree`, install trees that mix builds;
//! - [`bundle`]: application-local copies of offloaded binaries and
//!   their archives, re-pointed where the layout changes;
//! - [`doctor`]: what keeps an installation's GPU code from loading on
//!   this machine, and what fixes it.
//!
//! Nothing here prints; every failure is an [`ArtifactError`] (or a
//! [`wheel::WheelError`]) naming the file and the problem.

#![deny(unsafe_code)]

pub mod artifact;
mod build_match;
pub mod bundle;
mod databases;
pub mod doctor;
mod error;
pub mod expect;
pub mod install_tree;
mod observer;
pub mod options;
mod pack;
pub mod size;
mod tree;
pub mod wheel;

use kpack_format::{archive, hipk, msgpack, target};
use kpack_loader::{self as loader, input};

pub use databases::Database;
pub(crate) use error::leftover_removed;
pub use error::{ArtifactError, Result, ShardBuildMismatch};
use observer::note;
pub use observer::{with_jobs, Observer, Silent};
pub use pack::{ArchiveInfo, TreeCounts};
