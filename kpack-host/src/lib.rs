//! kpack-host: host binaries (ELF and PE) and what kpack does to them.
//!
//! 1. A file is opened (`kpack_loader::map_file`: a read-only memory map)
//!    and classified ([`binary::classify`]: fat binary, offloaded binary,
//!    host-only, debug-only, link input, bundle, archive). A host binary is
//!    ELF ([`elf`]) or PE/COFF ([`pe`]), both through `object`'s header
//!    types; [`binary::HostBinary`] gives its device-code sections by role
//!    and its wrapper table (`HIPF`/`HIPK` records) with each pointer
//!    resolved, whatever the container. It is parsed once, as it is
//!    classified ([`binary::classify_parsed`]), and passed on.
//! 2. [`fatbin`] puts a fat binary's bundles (`kpack_bundle`) and wrappers
//!    together for [`inspect`] (`ls`) and [`extract`].
//! 3. [`offload`] writes the code objects into per-target `.kpack`
//!    archives ([`ArchiveWriter`]: zstd per kernel, compressed in parallel,
//!    bytes independent of the thread count) and rewrites the binary into a
//!    host-only one whose wrappers point at HIPK metadata; ELF and PE take
//!    the same steps (analyze, plan, write, verify). [`prune`] and
//!    [`restore`] rewrite fat binaries; [`why`] traces the loader's search
//!    for each wrapper.
//! 4. Every file is written atomically, and durably when the command asks
//!    for it ([`output::Durability`]).
//!
//! Nothing here prints or exits; every failure is an [`Error`] that names
//! the file and what was wrong.

#![deny(unsafe_code)]

mod archive_writer;
pub mod binary;
pub mod built_for;
pub mod deps;
pub mod elf;
mod error;
pub mod extract;
pub mod fatbin;
pub mod image;
pub mod inspect;
pub mod kernels;
pub mod link_input;
pub mod offload;
pub mod output;
pub mod pe;
pub mod prune;
pub mod repoint;
pub mod restore;
pub mod why;

use kpack_bundle as bundle;
use kpack_format::{archive, bytes, hipk, msgpack, target};
use kpack_loader::{self as loader, input};

pub use archive_writer::{
    zstd_frame, ArchiveWriter, FileRange, Frame, FrameCompressor, FrameParams, KernelData,
    SharedBytes, WriteSummary, DEFAULT_BATCH_BYTES,
};
pub use error::{Error, Result, WithPath};
pub use kpack_loader::report;
