//! Clang offload bundles: what a `.hip_fatbin` section holds (formats.md §1).
//!
//! Reading ([`read`]): [`parse_fatbin`] takes the section's bytes and
//! returns its bundles in order: plain bundles borrow their code objects
//! from the input; compressed bundles (`CCOB` v1/v2/v3, zlib or zstd) are
//! decompressed once and their entries share that buffer. A compressed
//! bundle may hold several concatenated bundles; each counts as a bundle of
//! its own for numbering. Every count, offset and size is checked against
//! the bytes available. [`list_fatbin`] and [`check_fatbin`] list bundles
//! from their entry tables, [`FatbinStream`] hands out code objects one at
//! a time, both in bounded memory.
//!
//! Writing ([`write`]): [`write_bundle`] and [`BundleBuf`] lay out plain
//! bundles as clang does; [`Compressor`] makes compressed ones (clang 19
//! only emits CCOB v2 with zstd).

#![deny(unsafe_code)]

mod error;
mod format;
pub mod read;
pub mod write;

#[doc(hidden)]
pub mod fuzzing;

pub use error::BundleError;
pub(crate) use format::md5_word;
pub use format::{Method, BUNDLE_MAGIC, CCOB_MAGIC, MAX_UNCOMPRESSED};
pub use read::{
    check_fatbin, for_each_bundle, list_fatbin, parse_fatbin, Blob, Bundle, BundleInfo, Ccob,
    Entry, EntryInfo, FatbinStream, Streamed, LIST_CHECK_LIMIT, WHOLE_LIMIT,
};
pub use write::{bundle_layout, write_bundle, write_bundle_owned, BundleBuf, Compressor};
