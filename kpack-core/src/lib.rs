//! kpack-core: the formats and algorithms of kpack.
//!
//! The data flow, in the order of the modules below:
//!
//! 1. A file is opened ([`input`]: a read-only memory map) and classified
//!    ([`binary::classify`]: fat binary, offloaded binary, host-only,
//!    debug-only, link input, bundle, archive). A host binary is ELF
//!    ([`elf`]) or PE/COFF ([`pe`]), both through `object`'s header types;
//!    [`binary::HostBinary`] gives its device-code sections by role and its
//!    wrapper table (`HIPF`/`HIPK` records, [`hipk::Wrapper`]) with each
//!    pointer resolved, whatever the container.
//! 2. The device code of a fat binary is a list of clang offload bundles
//!    ([`bundle`]: plain and compressed), one code object per target ID
//!    ([`target`]); [`fatbin`] puts bundles and wrappers together for `ls`
//!    and `extract` ([`inspect`], [`extract`]).
//! 3. Offloading ([`offload`]) writes the code objects into per-target
//!    `.kpack` archives ([`archive`]: MessagePack TOC through `rmp`, zstd
//!    per kernel) and rewrites the binary into a host-only one whose
//!    wrappers point at HIPK metadata ([`hipk`]): [`offload::transform`]
//!    for ELF, [`offload::pe`] for PE; [`offload::verify_binary`] checks the
//!    result. Every file is written atomically and durably
//!    ([`output`]).
//! 4. At run time the loader ([`loader`]) reads the HIPK metadata, finds
//!    the archives along its search paths and returns the code object for
//!    the device's target (the C API of `kpack-cxx` is a thin face of it).
//! 5. On top: [`artifact`] splits, verifies and recombines TheRock build
//!    artifacts and packs install trees, file by file through the same
//!    classification, offload and archive writer.
//!
//! Every module parses borrowed bytes and returns borrowed views where it
//! can; [`bytes`] is the one little-endian reader. Nothing here prints or
//! exits; every failure is an [`Error`] that names the file and what was
//! wrong.

#![deny(unsafe_code)]

pub mod input;

pub mod binary;
pub mod bytes;
pub mod elf;
pub mod hipk;
pub mod pe;

pub mod bundle;
pub mod fatbin;
pub mod target;

pub mod extract;
pub mod inspect;

pub mod archive;
pub mod msgpack;
pub mod offload;
pub mod output;
pub mod prune;
pub mod restore;
pub mod size;
pub mod svg;

pub mod loader;
pub mod why;

pub mod artifact;
pub mod wheel;

pub mod error;

pub use error::{Error, Result};
