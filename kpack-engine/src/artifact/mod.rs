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
pub mod manifest;
pub mod pack_tree;
pub mod recombine;
mod shard_builds;
pub mod split;
#[cfg(test)]
mod test_util;
pub mod verify;

pub use config::{ArchitectureGroup, PackagingConfig, Validation};
pub use manifest::{artifact_prefix, split_prefix, OutputName, MANIFEST};
pub use pack_tree::{pack_tree, PackTreeOptions, PackTreeSummary};
pub use recombine::{recombine, RecombineOptions, RecombineSummary};
pub use split::{
    split, split_artifact, split_batch, GpuTargets, SplitInput, SplitOptions, SplitSummary,
};
pub use verify::{verify_artifacts, VerifyOptions, VerifyReport};
