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
//!
//! Within one shard, host and device code were split together: every TOC
//! entry of the shard's group artifacts that records a binary digest must
//! record the device digest of the shard's own binary of that key
//! ([`ShardBuilds::check`]). Another digest means the shard's generic
//! artifact is not the one its device artifacts were split with (an
//! upload of another build job replaced it): the recombined output would
//! pair host code with archives it cannot load, so recombine refuses it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::hipk::HipkMetadata;
use kpack_format::provenance::EntryDigests;
use kpack_host::binary::{classify, classify_parsed, Class};
use kpack_host::fatbin::{device_code, DeviceCode};
use kpack_host::offload::verify_file;

use crate::error::ShardBuildMismatch;
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

/// The device digests of the offloaded binaries of each shard's generic
/// artifact, by kernel name, read once per shard.
#[derive(Default)]
pub(crate) struct ShardBuilds {
    by_shard: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl ShardBuilds {
    /// Fail when an archive of `artifact` (a group artifact of `shard`,
    /// whose generic artifact is `generic`, if it has one) holds code
    /// objects of a binary key whose recorded binary digest is none of the
    /// device digests of the shard's binaries of that key.
    pub(crate) fn check(
        &mut self,
        shard: &str,
        generic: Option<&Path>,
        artifact: &Path,
    ) -> Result<()> {
        let Some(generic) = generic else {
            return Ok(());
        };
        if !self.by_shard.contains_key(shard) {
            let digests = device_digests(generic)?;
            self.by_shard.insert(shard.to_string(), digests);
        }
        let digests = &self.by_shard[shard];
        if digests.is_empty() {
            return Ok(());
        }
        for node in scan(artifact)? {
            let path = artifact.join(&node.rel);
            if matches!(node.kind, NodeKind::File { .. })
                && node.rel_str(artifact)?.ends_with(".kpack")
            {
                check_archive(shard, generic, &path, digests)?;
            }
        }
        Ok(())
    }
}

/// Kernel name -> the device digests of the offloaded binaries under
/// `generic` that carry one.
fn device_digests(generic: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mut by_name: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for node in scan(generic)? {
        if !matches!(node.kind, NodeKind::File { .. }) {
            continue;
        }
        if let Some((name, digest)) = device_digest(&generic.join(&node.rel))? {
            by_name.entry(name).or_default().insert(digest);
        }
    }
    Ok(by_name)
}

/// The kernel name and device digest of an offloaded binary that carries
/// one (its HIPK metadata, as [`device_code`] reads it); `None` for any
/// other file.
fn device_digest(path: &Path) -> Result<Option<(String, String)>> {
    let bytes = map_file(path)?;
    let file = classify_parsed(&bytes);
    if file.class != Class::Offloaded {
        return Ok(None);
    }
    let Ok(DeviceCode::Offloaded(o)) = device_code(path, &file) else {
        return Ok(None);
    };
    Ok(o.metadata
        .device_digest
        .map(|d| (o.metadata.kernel_name, d)))
}

/// [`ShardBuilds::check`] for one archive.
fn check_archive(
    shard: &str,
    generic: &Path,
    path: &Path,
    digests: &BTreeMap<String, BTreeSet<String>>,
) -> Result<()> {
    let archive = kpack_loader::open_archive(path)?;
    for e in archive.entries() {
        let name = e.key.rsplit_once('#').map_or(e.key.as_str(), |(n, _)| n);
        let (Some(own), Some(recorded)) = (digests.get(name), EntryDigests::of(e).binary) else {
            continue;
        };
        if own.contains(&recorded) {
            continue;
        }
        let binary = own.iter().next().map_or("", String::as_str);
        return Err(ArtifactError::ShardBuildMismatch(Box::new(
            ShardBuildMismatch {
                shard: shard.to_string(),
                archive: path.to_path_buf(),
                key: e.key.clone(),
                target: e.target.clone(),
                generic: generic.to_path_buf(),
                builds: kpack_format::provenance::builds(binary, &recorded),
            },
        )));
    }
    Ok(())
}
