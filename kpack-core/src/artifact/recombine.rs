//! `kpack recombine` (SPEC §5, reduce phase): the split artifacts of several
//! shards into `<component>_generic` (from the primary shard) and
//! `<component>_<group>` per architecture group (the `.kpack` archives and
//! database files of the group's targets, from whichever shard built them).
//!
//! Everything is decided and validated before anything is written: the
//! three `validation` options of the config are enforced (duplicate device
//! code, generic artifacts that differ between shards, configured
//! architectures no shard provides), so a failing run writes nothing. The
//! outputs are then assembled in a staging directory inside the output
//! directory and renamed into place, group artifacts first and generic
//! artifacts last.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use super::config::PackagingConfig;
use super::manifest::{self, generic_name, read_manifest, OutputName, Suffix, MANIFEST};
use super::tree::{
    copy_file, copy_symlink, copy_tree, make_dirs, same_bytes, scan, tree_bytes, Node, NodeKind,
};
use super::{ArtifactError, Observer, Result};
use crate::elf::{ElfView, FATBIN_SECTION};
use crate::input::map_file;
use crate::offload::verify_file;
use crate::target::TargetId;

#[derive(Debug, Clone)]
pub struct RecombineOptions {
    pub output_dir: PathBuf,
    /// Only these components (all when empty).
    pub components: Vec<String>,
}

/// What recombine did (`--json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecombineSummary {
    pub input_shards_dir: String,
    pub output_dir: String,
    pub primary_shard: String,
    pub shards: Vec<String>,
    pub components: Vec<ComponentSummary>,
    /// Output artifact names, sorted.
    pub outputs: Vec<String>,
    /// Targets that belong to no group (`component/target from shard`):
    /// left out.
    pub unassigned_targets: Vec<String>,
    /// Configured architectures no shard provides.
    pub missing_architectures: Vec<String>,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
    pub bytes_out: u64,
    pub seconds: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ComponentSummary {
    pub component: String,
    /// The shard whose generic artifact was taken.
    pub generic_from: String,
    pub groups: Vec<GroupSummary>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupSummary {
    pub group: String,
    pub artifact: String,
    /// Target -> the shard it was taken from.
    pub targets: BTreeMap<String, String>,
    pub prefixes: Vec<String>,
}

/// The split artifacts of one component, by shard.
#[derive(Default)]
struct Component {
    generics: BTreeMap<String, PathBuf>,
    targets: BTreeMap<String, BTreeMap<String, PathBuf>>,
}

pub fn recombine(
    input: &Path,
    config: &PackagingConfig,
    opts: &RecombineOptions,
    observer: &dyn Observer,
) -> Result<RecombineSummary> {
    let start = Instant::now();
    let mut s = RecombineSummary {
        input_shards_dir: input.display().to_string(),
        output_dir: opts.output_dir.display().to_string(),
        primary_shard: config.primary_shard.clone(),
        ..Default::default()
    };
    let warn = |s: &mut RecombineSummary, msg: String| {
        observer.warn(&msg);
        s.warnings.push(msg);
    };
    let note = |s: &mut RecombineSummary, msg: String| {
        observer.note(&msg);
        s.notes.push(msg);
    };

    // Shards and their artifacts.
    let shards = manifest::subdirs(input)?;
    if shards.is_empty() {
        return Err(ArtifactError::input(input, "no shard directories"));
    }
    s.shards = shards.iter().map(|(n, _)| n.clone()).collect();
    if !s.shards.contains(&config.primary_shard) {
        return Err(ArtifactError::Config {
            path: input.to_path_buf(),
            what: format!(
                "primary_shard {:?} is not a shard directory here (shards: {})",
                config.primary_shard,
                s.shards.join(", ")
            ),
        });
    }
    let mut components: BTreeMap<String, Component> = BTreeMap::new();
    for (shard, shard_dir) in &shards {
        for (name, dir) in manifest::subdirs(shard_dir)? {
            let Some(parsed) = OutputName::parse(&name) else {
                warn(
                    &mut s,
                    format!("{}: not a split artifact name: skipped", dir.display()),
                );
                continue;
            };
            if !dir.join(MANIFEST).is_file() {
                return Err(ArtifactError::MissingManifest { dir });
            }
            let c = components.entry(parsed.component).or_default();
            match parsed.suffix {
                Suffix::Generic => {
                    c.generics.insert(shard.clone(), dir);
                }
                Suffix::Target(t) => {
                    c.targets.entry(t).or_default().insert(shard.clone(), dir);
                }
                Suffix::Other(x) => warn(
                    &mut s,
                    format!(
                        "{}: {x:?} is neither \"generic\" nor a target ID: skipped",
                        dir.display()
                    ),
                ),
            }
        }
    }

    // Configured architectures nobody provides (over every component).
    let provided: BTreeSet<TargetId> = components
        .values()
        .flat_map(|c| c.targets.keys())
        .filter_map(|t| TargetId::parse(t).ok())
        .collect();
    for g in &config.architecture_groups {
        for a in &g.architectures {
            if !provided.iter().any(|t| super::config::arch_matches(a, t)) {
                s.missing_architectures.push(a.clone());
            }
        }
    }
    if !s.missing_architectures.is_empty() {
        if config.validation.error_on_missing_architecture {
            return Err(ArtifactError::MissingArchitectures {
                architectures: s.missing_architectures.clone(),
            });
        }
        let msg = format!(
            "configured architecture(s) provided by no shard: {}",
            s.missing_architectures.join(", ")
        );
        warn(&mut s, msg);
    }

    // Which components.
    if !opts.components.is_empty() {
        for c in &opts.components {
            if !components.contains_key(c) {
                return Err(ArtifactError::input(
                    input,
                    format!(
                        "no component {c:?} in any shard (components: {})",
                        components.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        components.retain(|name, _| opts.components.contains(name));
    }

    // Plan each component.
    struct Planned {
        name: String,
        generic: PathBuf,
        /// Group -> target -> (shard, artifact dir).
        groups: BTreeMap<String, BTreeMap<String, (String, PathBuf)>>,
    }
    let mut plans = Vec::new();
    for (name, c) in &components {
        let generic_from = if c.generics.contains_key(&config.primary_shard) {
            config.primary_shard.clone()
        } else if let Some(first) = c.generics.keys().next() {
            let first = first.clone();
            warn(
                &mut s,
                format!(
                    "component {name}: no generic artifact in primary shard {}: taken from {first}",
                    config.primary_shard
                ),
            );
            first
        } else {
            return Err(ArtifactError::input(
                input,
                format!("component {name}: no {} in any shard", generic_name(name)),
            ));
        };
        let generic = c.generics[&generic_from].clone();
        if config.validation.verify_generic_artifacts_match {
            for (shard, dir) in &c.generics {
                if *shard == generic_from {
                    continue;
                }
                let differences = compare_generic(&generic, dir)?;
                if !differences.is_empty() {
                    return Err(ArtifactError::GenericMismatch {
                        component: name.clone(),
                        shards: (generic_from.clone(), shard.clone()),
                        differences,
                    });
                }
            }
        }
        let mut groups: BTreeMap<String, BTreeMap<String, (String, PathBuf)>> = BTreeMap::new();
        for (target, by_shard) in &c.targets {
            let Some(group) = config.group_of(target) else {
                let from: Vec<&str> = by_shard.keys().map(String::as_str).collect();
                let msg = format!("{name}/{target} from {}", from.join(", "));
                s.unassigned_targets.push(msg.clone());
                warn(
                    &mut s,
                    format!("target in no architecture group, left out: {msg}"),
                );
                continue;
            };
            let chosen = if by_shard.len() == 1 {
                by_shard
                    .iter()
                    .next()
                    .map(|(a, b)| (a.clone(), b.clone()))
                    .expect("one")
            } else {
                let (first_shard, first_dir) = by_shard.iter().next().expect("several");
                let pick = by_shard
                    .get_key_value(&config.primary_shard)
                    .unwrap_or((first_shard, first_dir));
                let mut differing = Vec::new();
                for (shard, dir) in by_shard {
                    if shard == pick.0 {
                        continue;
                    }
                    if let Some(d) = compare_trees(pick.1, dir)?.into_iter().next() {
                        differing.push((shard.clone(), d));
                    }
                }
                let shards: Vec<String> = by_shard.keys().cloned().collect();
                if differing.is_empty() {
                    note(
                        &mut s,
                        format!(
                            "{name}/{target}: identical in shards {}: taken from {}",
                            shards.join(", "),
                            pick.0
                        ),
                    );
                } else if config.validation.error_on_duplicate_device_code {
                    let (other, detail) = differing.remove(0);
                    return Err(ArtifactError::DuplicateDeviceCode {
                        component: name.clone(),
                        target: target.clone(),
                        shards: vec![pick.0.clone(), other],
                        detail,
                    });
                } else {
                    warn(
                        &mut s,
                        format!(
                            "{name}/{target}: shards {} provide different bytes: taken from {}",
                            shards.join(", "),
                            pick.0
                        ),
                    );
                }
                (pick.0.clone(), pick.1.clone())
            };
            groups
                .entry(group.name.clone())
                .or_default()
                .insert(target.clone(), chosen);
        }
        plans.push(Planned {
            name: name.clone(),
            generic,
            groups,
        });
        s.components.push(ComponentSummary {
            component: name.clone(),
            generic_from,
            groups: Vec::new(),
        });
    }

    // Outputs must not exist yet.
    make_dirs(&opts.output_dir)?;
    let mut outputs = Vec::new();
    for p in &plans {
        outputs.push(generic_name(&p.name));
        for g in p.groups.keys() {
            outputs.push(format!("{}_{g}", p.name));
        }
    }
    for o in &outputs {
        let path = opts.output_dir.join(o);
        if path.exists() {
            return Err(ArtifactError::OutputExists { path });
        }
    }
    observer.add_work(
        plans
            .iter()
            .map(|p| tree_bytes(&p.generic).unwrap_or(0))
            .sum(),
    );

    // Assemble.
    let staging = tempfile::Builder::new()
        .prefix(".kpack-staging-")
        .tempdir_in(&opts.output_dir)
        .map_err(|e| ArtifactError::io(&opts.output_dir, e))?;
    let built: Vec<Result<(Vec<GroupSummary>, u64)>> = plans
        .par_iter()
        .map(|p| {
            let mut bytes = copy_tree(&p.generic, &staging.path().join(generic_name(&p.name)))?;
            observer.advance(bytes);
            let mut groups = Vec::new();
            for (g, targets) in &p.groups {
                let artifact = format!("{}_{g}", p.name);
                let dir = staging.path().join(&artifact);
                let (prefixes, n) = merge_targets(&dir, targets)?;
                bytes += n;
                groups.push(GroupSummary {
                    group: g.clone(),
                    artifact,
                    targets: targets
                        .iter()
                        .map(|(t, (sh, _))| (t.clone(), sh.clone()))
                        .collect(),
                    prefixes,
                });
            }
            Ok((groups, bytes))
        })
        .collect();
    for (c, r) in s.components.iter_mut().zip(built) {
        let (groups, bytes) = r?;
        c.groups = groups;
        s.bytes_out += bytes;
    }
    let (generics, devices): (Vec<&String>, Vec<&String>) =
        outputs.iter().partition(|o| o.ends_with("_generic"));
    for o in devices.into_iter().chain(generics) {
        let dest = opts.output_dir.join(o);
        fs::rename(staging.path().join(o), &dest).map_err(|e| ArtifactError::io(&dest, e))?;
        observer.note(&format!("wrote {}", dest.display()));
    }
    outputs.sort();
    s.outputs = outputs;
    s.seconds = start.elapsed().as_secs_f64();
    Ok(s)
}

/// Fail if `dir/rel`, or a directory on the way there, is a symlink
/// (written by another target of the group): what follows would be written
/// wherever it points.
fn refuse_symlink_ancestor(dir: &Path, rel: &Path, target: &str) -> Result<()> {
    let mut p = dir.to_path_buf();
    for c in rel.components() {
        p.push(c);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(ArtifactError::input(
                    &p,
                    format!(
                        "{target}: has a directory where another target of the group has a symlink: refusing to write through it"
                    ),
                ))
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

/// Copy the prefixes of each target's artifact into `dir` and write the
/// merged manifest (prefixes sorted). A path that two targets both provide
/// must have the same bytes.
fn merge_targets(
    dir: &Path,
    targets: &BTreeMap<String, (String, PathBuf)>,
) -> Result<(Vec<String>, u64)> {
    make_dirs(dir)?;
    let mut prefixes = BTreeSet::new();
    let mut bytes = 0;
    for (target, (_, src)) in targets {
        for p in read_manifest(src)? {
            let root = src.join(&p);
            if !root.is_dir() {
                continue;
            }
            refuse_symlink_ancestor(dir, Path::new(&p), target)?;
            make_dirs(&dir.join(&p))?;
            for n in scan(&root)? {
                let (from, to) = (root.join(&n.rel), dir.join(&p).join(&n.rel));
                // Another target may have put a symlink where this one has a
                // directory: never write through it.
                let rel = Path::new(&p).join(&n.rel);
                refuse_symlink_ancestor(dir, rel.parent().unwrap_or(Path::new("")), target)?;
                if n.kind == NodeKind::Dir {
                    refuse_symlink_ancestor(dir, &rel, target)?;
                }
                match &n.kind {
                    NodeKind::Dir => make_dirs(&to)?,
                    kind => {
                        if fs::symlink_metadata(&to).is_ok() {
                            let same = match kind {
                                NodeKind::Symlink(t) => fs::read_link(&to).ok().as_ref() == Some(t),
                                _ => same_bytes(&from, &to)?,
                            };
                            if same {
                                continue;
                            }
                            return Err(ArtifactError::input(
                                &from,
                                format!(
                                    "{target}: {p}/{} is also provided by another target of the group, with different contents",
                                    n.rel.display()
                                ),
                            ));
                        }
                        match kind {
                            NodeKind::Symlink(t) => copy_symlink(t, &to)?,
                            _ => bytes += copy_file(&from, &to, n.mode)?,
                        }
                    }
                }
            }
            super::tree::copy_dir_modes(&dir.join(&p), &root)?;
            prefixes.insert(p);
        }
    }
    let prefixes: Vec<String> = prefixes.into_iter().collect();
    manifest::write_manifest(dir, &prefixes)?;
    Ok((prefixes, bytes))
}

/// Differences between two artifact trees (paths, symlink targets, bytes),
/// at most a few, in path order.
fn compare_trees(a: &Path, b: &Path) -> Result<Vec<String>> {
    compare(a, b, false)
}

/// Like [`compare_trees`], but offloaded binaries compare by their HIPK
/// metadata and wrapper count (their bytes legitimately differ between
/// shards).
fn compare_generic(a: &Path, b: &Path) -> Result<Vec<String>> {
    compare(a, b, true)
}

fn compare(a: &Path, b: &Path, offloaded_by_metadata: bool) -> Result<Vec<String>> {
    const MAX: usize = 5;
    let index = |dir: &Path| -> Result<BTreeMap<PathBuf, Node>> {
        Ok(scan(dir)?.into_iter().map(|n| (n.rel.clone(), n)).collect())
    };
    let (ia, ib) = (index(a)?, index(b)?);
    let mut diffs = Vec::new();
    let keys: BTreeSet<&PathBuf> = ia.keys().chain(ib.keys()).collect();
    for k in keys {
        if diffs.len() >= MAX {
            diffs.push("...".into());
            break;
        }
        let shown = k.display();
        match (ia.get(k), ib.get(k)) {
            (Some(_), None) => diffs.push(format!("{shown} only in the first")),
            (None, Some(_)) => diffs.push(format!("{shown} only in the second")),
            (Some(x), Some(y)) => match (&x.kind, &y.kind) {
                (NodeKind::Dir, NodeKind::Dir) => {}
                (NodeKind::Symlink(s), NodeKind::Symlink(t)) => {
                    if s != t {
                        diffs.push(format!(
                            "{shown}: symlink to {} vs {}",
                            s.display(),
                            t.display()
                        ));
                    }
                }
                (NodeKind::File { .. }, NodeKind::File { .. }) => {
                    let (pa, pb) = (a.join(k), b.join(k));
                    if offloaded_by_metadata {
                        if let (Some(ma), Some(mb)) = (offloaded(&pa), offloaded(&pb)) {
                            if ma != mb {
                                diffs.push(format!(
                                    "{shown}: offloaded binaries with different HIPK metadata or wrapper count"
                                ));
                            }
                            continue;
                        }
                    }
                    if !same_bytes(&pa, &pb)? {
                        diffs.push(format!("{shown}: different bytes"));
                    }
                }
                _ => diffs.push(format!("{shown}: different kinds of entry")),
            },
            (None, None) => {}
        }
    }
    Ok(diffs)
}

/// The HIPK metadata and wrapper count of an offloaded binary.
fn offloaded(path: &Path) -> Option<(Vec<u8>, usize)> {
    let m = map_file(path).ok()?;
    let elf = ElfView::parse(&m).ok()?;
    if !elf.section(FATBIN_SECTION).ok()??.is_nobits() {
        return None;
    }
    drop(m);
    let v = verify_file(path).ok()?;
    Some((v.metadata.encode(), v.co_indices.len()))
}
