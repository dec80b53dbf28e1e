//! Provenance across shards. Each shard of a recombine was split from its
//! own build: a generic binary of the shard taken carries the device digest
//! of that shard's fat binary (formats.md §4.2), while the group artifacts
//! of the other shards hold code objects whose TOC entries name their own
//! shard's binary. A recombined binary then takes code objects of several
//! builds, so it can no longer say which one it was split from: where the
//! shards' copies of a binary carry different device digests, the copy
//! written loses its digest (its HIPK metadata re-pointed without the key),
//! and loaders and verifiers fall back to matching by kernel name, as for a
//! binary without digests. Where every shard agrees, nothing changes.

use std::path::{Path, PathBuf};

use crate::hipk::HipkMetadata;
use kpack_host::binary::{classify, Class};
use kpack_host::offload::verify_file;

use crate::input::map_file;
use crate::tree::{create_file, scan, NodeKind};
use crate::{ArtifactError, Result};

/// In `staged` (a copy of the generic artifact `taken`), drop the device
/// digest of every offloaded binary whose copy in one of the `others`
/// (the other shards' generic artifacts) carries another one. Returns the
/// binaries rewritten, relative to the artifact.
pub(crate) fn release_digests(
    staged: &Path,
    taken: &Path,
    others: &[PathBuf],
) -> Result<Vec<PathBuf>> {
    let mut released = Vec::new();
    for node in scan(taken)? {
        if !matches!(node.kind, NodeKind::File { .. }) {
            continue;
        }
        let source = taken.join(&node.rel);
        let Some(metadata) = offloaded_metadata(&source) else {
            continue;
        };
        let Some(own) = metadata.device_digest.clone() else {
            continue;
        };
        let differs = others
            .iter()
            .filter_map(|o| offloaded_metadata(&o.join(&node.rel)))
            .any(|m| m.device_digest.as_deref() != Some(own.as_str()));
        if differs {
            rewrite_without_digest(&source, &staged.join(&node.rel), metadata, node.mode)?;
            released.push(node.rel);
        }
    }
    Ok(released)
}

/// The HIPK metadata of an offloaded binary; `None` for any other file.
fn offloaded_metadata(path: &Path) -> Option<HipkMetadata> {
    if !path.is_file() || classify(&map_file(path).ok()?) != Class::Offloaded {
        return None;
    }
    verify_file(path).ok().map(|v| v.metadata)
}

/// Write `source` to `dest` with its metadata re-pointed without a device
/// digest (smaller, so it always fits), mode kept.
fn rewrite_without_digest(
    source: &Path,
    dest: &Path,
    metadata: HipkMetadata,
    mode: u32,
) -> Result<()> {
    let metadata = metadata.with_device_digest(None);
    let bytes = map_file(source)?;
    create_file(dest, mode, |f| {
        kpack_host::repoint::repoint(source, &bytes, &metadata, f).map_err(ArtifactError::from)
    })
}
