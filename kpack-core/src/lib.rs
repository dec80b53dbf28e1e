//! kpack-core: the formats and algorithms of kpack.
//!
//! One module per format, each parsing borrowed bytes (`&[u8]`, usually a
//! memory map) and returning borrowed views:
//! - [`bundle`]: clang offload bundles, plain and compressed (CCOB), as found
//!   in a `.hip_fatbin` section;
//! - [`target`]: AMDGPU target IDs (`gfx942:sramecc+:xnack-`) and matching;
//! - [`msgpack`]: the small MessagePack subset used by archive TOCs and HIPK
//!   metadata;
//! - [`archive`]: `.kpack` archives, reading and writing;
//! - [`hipk`]: the HIPK metadata blob of an offloaded binary;
//! - [`elf`]: ELF section access for fat and offloaded host binaries;
//! - [`input`]: opening and classifying input files;
//! - [`artifact`]: split, verify, recombine and pack-tree over build
//!   artifacts and install trees (SPEC §5).
//!
//! Nothing here prints or exits; every failure is an [`Error`] that names the
//! file and what was wrong.

pub mod archive;
pub mod artifact;
pub mod binary;
pub mod bundle;
pub mod bytes;
pub mod elf;
pub mod error;
pub mod extract;
pub mod fatbin;
pub mod hipk;
pub mod input;
pub mod inspect;
pub mod loader;
pub mod msgpack;
pub mod offload;
pub mod output;
pub mod target;

pub use error::{Error, Result};
