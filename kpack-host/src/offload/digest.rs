//! The digests of a fat binary's device code (`kpack_format::provenance`):
//! one per code object, over its decompressed bytes, and the binary's device
//! digest over all of them, written into its HIPK metadata and into every
//! TOC entry split from it.
//!
//! Every device code object of the section is hashed, of every target
//! (also those a run leaves out of its archives): two runs over one build
//! that keep different targets give the same device digest. Code objects
//! are read as [`FatbinStream`] hands them out (a compressed bundle is
//! decompressed for this pass, bounded as the stream bounds it) and hashed
//! in parallel, a batch at a time; the digests do not depend on the order.

use std::collections::BTreeMap;
use std::path::Path;

use rayon::prelude::*;

use super::collect::Pages;
use crate::bundle::{Blob, FatbinStream};
use crate::error::{Result, WithPath};
use crate::input::Mapped;
use crate::msgpack::Value;
use kpack_format::provenance::{
    code_object_digest, device_digest, TOC_BINARY_DIGEST, TOC_CODE_OBJECT_DIGEST,
};

/// Bytes of code objects held for one parallel batch of hashing.
const BATCH_BYTES: usize = 64 << 20;

/// The digests of one fat binary's device code.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Digests {
    /// (bundle index, entry index) -> the code object's digest.
    by_entry: BTreeMap<(usize, usize), String>,
    /// The binary's device digest.
    pub device: String,
}

impl Digests {
    /// The digest of the code object at entry `entry` of bundle `bundle`.
    pub fn of(&self, bundle: usize, entry: usize) -> Option<&str> {
        self.by_entry.get(&(bundle, entry)).map(String::as_str)
    }

    /// The TOC metadata keys of that code object: its digest and the
    /// binary's device digest.
    pub fn entry_metadata(&self, bundle: usize, entry: usize) -> Vec<(String, Value)> {
        let mut out = Vec::with_capacity(2);
        if let Some(d) = self.of(bundle, entry) {
            out.push((TOC_CODE_OBJECT_DIGEST.to_string(), Value::from(d)));
        }
        out.push((
            TOC_BINARY_DIGEST.to_string(),
            Value::from(self.device.as_str()),
        ));
        out
    }
}

/// The digests of the device code objects of the bundle section `section`
/// of the binary at `path` (mapped as `input`).
pub fn digests(path: &Path, input: &Mapped, section: &[u8]) -> Result<Digests> {
    let mut stream = FatbinStream::new(section);
    let mut pages = Pages::new(input, section);
    let mut by_entry = BTreeMap::new();
    let mut batch: Vec<(usize, usize, Blob)> = Vec::new();
    let mut held = 0;
    while let Some(co) = stream.next().with_path(path)? {
        held += co.data.len();
        batch.push((co.bundle, co.entry, co.data));
        if held >= BATCH_BYTES {
            hash_batch(&mut batch, &mut by_entry);
            held = 0;
        }
        pages.release(&stream);
    }
    hash_batch(&mut batch, &mut by_entry);
    pages.release(&stream);
    let device = device_digest(by_entry.values().map(String::as_str));
    Ok(Digests { by_entry, device })
}

fn hash_batch(batch: &mut Vec<(usize, usize, Blob)>, out: &mut BTreeMap<(usize, usize), String>) {
    let hashed: Vec<((usize, usize), String)> = batch
        .par_iter()
        .map(|(b, e, data)| ((*b, *e), code_object_digest(data)))
        .collect();
    out.extend(hashed);
    batch.clear();
}
