//! kpack-format: the formats kpack reads and writes, as bytes in and bytes
//! out. No file-system access, no threads, no host-binary rewriting: the
//! crates above open files (`kpack-loader`), walk trees and write
//! durably (`kpack-host`, `kpack-engine`).
//!
//! One public module per format (see `docs/formats.md`):
//! - [`bytes`]: the one bounds-checked little-endian reader;
//! - [`target`]: AMDGPU target IDs (`gfx90a:sramecc+:xnack-`), generic
//!   targets and the loader's compatibility order;
//! - [`msgpack`]: the MessagePack subset of TOCs and HIPK metadata;
//! - [`archive`]: `.kpack` archives (header, TOC, schemes `none` and
//!   `zstd-per-kernel`), reading and the TOC a writer encodes;
//! - [`hipk`]: HIPK metadata and the `HIPF`/`HIPK` wrapper records;
//! - [`offloading`]: LLVM's offload binaries (`.llvm.offloading`, clang's
//!   new offload driver);
//! - [`provenance`]: the digests that tie an offloaded binary to the
//!   code objects it was split from;
//! - [`hrx`]: the limits of ROCm's HRX runtime's own reader, which
//!   writers and `kpack verify` warn about;
//! - [`processors`]: what each AMDGPU processor supports (features,
//!   generic targets) and the kernel driver's `gfx_target_version`.

#![deny(unsafe_code)]

pub mod archive;
pub mod bytes;
pub mod hipk;
pub mod hrx;
pub mod msgpack;
pub mod offloading;
pub mod processors;
pub mod provenance;
pub mod target;
