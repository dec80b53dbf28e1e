//! `kpack recombine` (formats.md §6.5, reduce phase): the split artifacts of several
//! shards into `<component>_generic` (from the primary shard) and
//! `<component>_<group>` per architecture group (the `.kpack` archives and
//! database files of the group's targets, from whichever shard built them).
//!
//! Everything is decided and validated before anything is written: the
//! three `validation` options of the config are enforced (duplicate device
//! code, generic artifacts that differ between shards, configured
//! architectures no shard provides), and each shard's device artifacts are
//! checked against its own generic artifact by their provenance digests
//! ([`ShardBuilds`]), so a failing run writes nothing. The
//! outputs are then assembled in a staging directory inside the output
//! directory ([`StagedDir::in_dir`]) and renamed into place, group artifacts
//! first and generic artifacts last; staging directories a killed run left
//! there are removed first.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use super::config::{arch_matches, PackagingConfig};
use super::manifest::{self, generic_name, read_manifest, OutputName, Suffix, MANIFEST};
use super::shard_builds::{release_digests, ShardBuilds};
use crate::input::map_file;
use crate::target::TargetId;
use crate::tree::{
    copy_file, copy_mode, copy_symlink, copy_tree, make_dirs, owner_writable, same_bytes, scan,
    tree_bytes, Node, NodeKind,
};
use crate::{leftover_removed, ArtifactError, Observer, Result};
use kpack_host::binary::{classify, Class};
use kpack_host::offload::verify_file;
use kpack_host::output::StagedDir;

#[derive(Debug, Clone)]
pub struct RecombineOptions {
    pub output_dir: PathBuf,
    /// Only these components (all when empty).
    pub components: Vec<String>,
    /// `--expect-targets`: targets every one of which some shard must
    /// provide code objects for ([`crate::expect`]), checked before
    /// anything is written.
    pub expect_targets: Vec<String>,
}

impl RecombineOptions {
    /// All components, nothing expected.
    pub fn new(output_dir: impl Into<PathBuf>) -> Self {
        RecombineOptions {
            output_dir: output_dir.into(),
            components: Vec::new(),
            expect_targets: Vec::new(),
        }
    }
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
    /// Paths of a group artifact that two shards provide with different
    /// contents (allowed only with `error_on_duplicate_device_code` false:
    /// the primary shard's, else the first shard's in sorted order, taken).
    pub file_conflicts: Vec<FileConflict>,
    /// Files of a generic artifact that differ between the shard taken and
    /// another (offloaded binaries compared by their HIPK metadata), listed
    /// even though the taken shard wins.
    pub generic_differences: Vec<GenericDifference>,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
    pub bytes_out: u64,
    pub seconds: f64,
}

/// One path of a group artifact that shards provide differently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileConflict {
    pub artifact: String,
    /// Relative to the artifact (`<prefix>/<path>`).
    pub path: String,
    /// The shards providing it, sorted.
    pub shards: Vec<String>,
    /// The shard whose file was taken.
    pub taken_from: String,
}

/// One file of a component's generic artifact that differs between shards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GenericDifference {
    pub artifact: String,
    /// Relative to the artifact.
    pub path: String,
    /// The shard taken, then the one that differs.
    pub shards: [String; 2],
    pub what: String,
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

/// What one component's outputs are made of.
struct Planned {
    name: String,
    /// The generic artifact taken.
    generic: PathBuf,
    /// The other shards' generic artifacts.
    other_generics: Vec<PathBuf>,
    /// Group -> target -> (shard, artifact dir).
    groups: BTreeMap<String, BTreeMap<String, (String, PathBuf)>>,
    /// Group -> path (`<prefix>/<rel>`) shards provide differently -> the
    /// target whose file is taken.
    winners: BTreeMap<String, BTreeMap<String, String>>,
}

impl RecombineSummary {
    fn warn(&mut self, observer: &dyn Observer, msg: String) {
        observer.warn(&msg);
        self.warnings.push(msg);
    }

    fn note(&mut self, observer: &dyn Observer, msg: String) {
        observer.note(&msg);
        self.notes.push(msg);
    }
}

/// Recombine the shards in `input`. The plan: every decision and check
/// first, nothing written until all pass:
/// 1. the shards and the split artifacts in each, by component;
/// 2. the configured architectures that no shard provides;
/// 3. the components asked for;
/// 4. per component, the shard its generic artifact comes from and, per
///    target of a group, the shard its artifact comes from (enforcing the
///    `validation` options);
/// 5. the outputs, which must not exist yet;
///
/// then the outputs are assembled in a staging directory in the output
/// directory and renamed into place, group artifacts first and generic
/// artifacts last.
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
    let shards = find_shards(input, config, &mut s)?;
    let mut components = collect_components(&shards, &mut s, observer)?;
    check_missing_architectures(&components, config, &mut s, observer)?;
    select_components(&mut components, &opts.components, input)?;
    check_expected(&components, &opts.expect_targets, input)?;
    let plans = plan_components(&components, config, input, &mut s, observer)?;
    let mut outputs = check_outputs(&plans, &opts.output_dir)?;
    observer.add_work(
        plans
            .iter()
            .map(|p| tree_bytes(&p.generic).unwrap_or(0))
            .sum(),
    );
    write_outputs(&plans, &outputs, &opts.output_dir, &mut s, observer)?;
    outputs.sort();
    s.outputs = outputs;
    s.seconds = start.elapsed().as_secs_f64();
    Ok(s)
}

/// Step 4: every component's plan ([`plan_component`]), each component
/// entered in the summary with the shard its generic artifact comes from.
fn plan_components(
    components: &BTreeMap<String, Component>,
    config: &PackagingConfig,
    input: &Path,
    s: &mut RecombineSummary,
    observer: &dyn Observer,
) -> Result<Vec<Planned>> {
    let mut plans = Vec::new();
    for (name, c) in components {
        let (plan, generic_from) = plan_component(name, c, config, input, s, observer)?;
        plans.push(plan);
        s.components.push(ComponentSummary {
            component: name.clone(),
            generic_from,
            groups: Vec::new(),
        });
    }
    Ok(plans)
}

/// The writing, once every check has passed: the `outputs` assembled in a
/// staging directory in `out_dir` (staging directories a killed run left
/// removed first), then renamed into place, group artifacts first and
/// generic artifacts last. Fills in the groups and bytes of the summary.
fn write_outputs(
    plans: &[Planned],
    outputs: &[String],
    out_dir: &Path,
    s: &mut RecombineSummary,
    observer: &dyn Observer,
) -> Result<()> {
    let stage = StagedDir::in_dir(out_dir)?;
    for leftover in stage.swept() {
        s.note(observer, leftover_removed(leftover));
    }
    let built = assemble(plans, stage.path(), observer);
    for (c, r) in s.components.iter_mut().zip(built) {
        let (groups, bytes) = r?;
        c.groups = groups;
        s.bytes_out += bytes;
    }
    let (generics, devices): (Vec<&String>, Vec<&String>) =
        outputs.iter().partition(|o| o.ends_with("_generic"));
    let order: Vec<&String> = devices.into_iter().chain(generics).collect();
    stage.commit_entries(&order)?;
    // Renamed into place: the generic artifacts take their input's mode.
    for p in plans {
        copy_mode(&p.generic, &out_dir.join(generic_name(&p.name)))?;
    }
    for o in &order {
        observer.note(&format!("wrote {}", out_dir.join(o).display()));
    }
    Ok(())
}

/// Step 1: the shard directories (the primary shard must be one).
fn find_shards(
    input: &Path,
    config: &PackagingConfig,
    s: &mut RecombineSummary,
) -> Result<Vec<(String, PathBuf)>> {
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
    Ok(shards)
}

/// Step 1: the split artifacts of every shard, by component (directories
/// that are not split artifacts are skipped with a warning).
fn collect_components(
    shards: &[(String, PathBuf)],
    s: &mut RecombineSummary,
    observer: &dyn Observer,
) -> Result<BTreeMap<String, Component>> {
    let mut components: BTreeMap<String, Component> = BTreeMap::new();
    for (shard, shard_dir) in shards {
        for (name, dir) in manifest::subdirs(shard_dir)? {
            let Some(parsed) = OutputName::parse(&name) else {
                let msg = format!("{}: not a split artifact name: skipped", dir.display());
                s.warn(observer, msg);
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
                Suffix::Other(x) => {
                    let msg = format!(
                        "{}: {x:?} is neither \"generic\" nor a target ID: skipped",
                        dir.display()
                    );
                    s.warn(observer, msg);
                }
            }
        }
    }
    Ok(components)
}

/// Step 2: configured architectures that no shard provides, over every
/// component: an error (`validation.error_on_missing_architecture`) or a
/// warning.
fn check_missing_architectures(
    components: &BTreeMap<String, Component>,
    config: &PackagingConfig,
    s: &mut RecombineSummary,
    observer: &dyn Observer,
) -> Result<()> {
    let provided: BTreeSet<TargetId> = components
        .values()
        .flat_map(|c| c.targets.keys())
        .filter_map(|t| TargetId::parse(t).ok())
        .collect();
    for g in &config.architecture_groups {
        for a in &g.architectures {
            if !provided.iter().any(|t| arch_matches(a, t)) {
                s.missing_architectures.push(a.clone());
            }
        }
    }
    if s.missing_architectures.is_empty() {
        return Ok(());
    }
    if config.validation.error_on_missing_architecture {
        return Err(ArtifactError::MissingArchitectures {
            architectures: s.missing_architectures.clone(),
        });
    }
    let msg = format!(
        "configured architecture(s) provided by no shard: {}",
        s.missing_architectures.join(", ")
    );
    s.warn(observer, msg);
    Ok(())
}

/// Step 3: keep only the components asked for (all when none is), each of
/// which must exist.
fn select_components(
    components: &mut BTreeMap<String, Component>,
    wanted: &[String],
    input: &Path,
) -> Result<()> {
    if wanted.is_empty() {
        return Ok(());
    }
    for c in wanted {
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
    components.retain(|name, _| wanted.contains(name));
    Ok(())
}

/// Step 4 for one component: its plan, and the shard its generic artifact
/// comes from.
fn plan_component(
    name: &str,
    c: &Component,
    config: &PackagingConfig,
    input: &Path,
    s: &mut RecombineSummary,
    observer: &dyn Observer,
) -> Result<(Planned, String)> {
    let generic_from = generic_source(name, c, config, input, s, observer)?;
    let generic = c.generics[&generic_from].clone();
    generic_differences(name, c, &generic_from, config, s, observer)?;
    let mut groups: BTreeMap<String, BTreeMap<String, (String, PathBuf)>> = BTreeMap::new();
    for (target, by_shard) in &c.targets {
        let Some(group) = config.group_of(target) else {
            let from: Vec<&str> = by_shard.keys().map(String::as_str).collect();
            let msg = format!("{name}/{target} from {}", from.join(", "));
            s.unassigned_targets.push(msg.clone());
            s.warn(
                observer,
                format!("target in no architecture group, left out: {msg}"),
            );
            continue;
        };
        let chosen = target_source(name, target, by_shard, config, s, observer)?;
        groups
            .entry(group.name.clone())
            .or_default()
            .insert(target.clone(), chosen);
    }
    let mut builds = ShardBuilds::default();
    for (shard, dir) in groups.values().flat_map(BTreeMap::values) {
        builds.check(shard, c.generics.get(shard).map(PathBuf::as_path), dir)?;
    }
    let other_generics = c
        .generics
        .iter()
        .filter(|(shard, _)| **shard != generic_from)
        .map(|(_, dir)| dir.clone())
        .collect();
    let mut winners = BTreeMap::new();
    for (g, targets) in &groups {
        let artifact = format!("{name}_{g}");
        winners.insert(
            g.clone(),
            group_conflicts(&artifact, targets, config, s, observer)?,
        );
    }
    let plan = Planned {
        name: name.to_string(),
        generic,
        other_generics,
        groups,
        winners,
    };
    Ok((plan, generic_from))
}

/// The shard whose generic artifact a component takes: the primary shard,
/// else (with a warning) the first that has one.
fn generic_source(
    name: &str,
    c: &Component,
    config: &PackagingConfig,
    input: &Path,
    s: &mut RecombineSummary,
    observer: &dyn Observer,
) -> Result<String> {
    if c.generics.contains_key(&config.primary_shard) {
        return Ok(config.primary_shard.clone());
    }
    let Some(first) = c.generics.keys().next() else {
        return Err(ArtifactError::input(
            input,
            format!("component {name}: no {} in any shard", generic_name(name)),
        ));
    };
    let msg = format!(
        "component {name}: no generic artifact in primary shard {}: taken from {first}",
        config.primary_shard
    );
    s.warn(observer, msg);
    Ok(first.clone())
}

/// The files of every other shard's generic artifact that differ from the
/// one taken: an error with `validation.verify_generic_artifacts_match`,
/// else each listed in the summary with a warning (the taken shard wins).
fn generic_differences(
    name: &str,
    c: &Component,
    taken: &str,
    config: &PackagingConfig,
    s: &mut RecombineSummary,
    observer: &dyn Observer,
) -> Result<()> {
    let generic = &c.generics[taken];
    let artifact = generic_name(name);
    for (shard, dir) in &c.generics {
        if shard == taken {
            continue;
        }
        let differences = compare_generic(generic, dir)?;
        if differences.is_empty() {
            continue;
        }
        if config.validation.verify_generic_artifacts_match {
            return Err(ArtifactError::GenericMismatch {
                component: name.to_string(),
                shards: (taken.to_string(), shard.clone()),
                differences: shown(&differences),
            });
        }
        for d in differences {
            let msg = format!(
                "{artifact}/{}: {} (shards {taken} and {shard}): taken from {taken}",
                d.path, d.what
            );
            s.warn(observer, msg);
            s.generic_differences.push(GenericDifference {
                artifact: artifact.clone(),
                path: d.path,
                shards: [taken.to_string(), shard.clone()],
                what: d.what,
            });
        }
    }
    Ok(())
}

/// The first few differences, as an error message lists them.
fn shown(differences: &[Difference]) -> Vec<String> {
    const MAX: usize = 5;
    let mut v: Vec<String> = differences
        .iter()
        .take(MAX)
        .map(|d| d.to_string())
        .collect();
    if differences.len() > MAX {
        v.push("...".into());
    }
    v
}

/// One file (or symlink) of a group artifact, as a target's artifact
/// provides it.
struct Provided {
    shard: String,
    target: String,
    path: PathBuf,
    node: Node,
}

/// The paths of group artifact `artifact` that its targets' artifacts
/// provide with different contents from different shards: an error
/// ([`ArtifactError::FileConflict`], naming the path and both shards)
/// unless `error_on_duplicate_device_code` is false, when the primary
/// shard's (else the first shard's in sorted order) is taken and the
/// conflict listed. Returns path -> the target whose file is taken.
/// (Different contents from one shard's targets fail when the artifact is
/// assembled.)
fn group_conflicts(
    artifact: &str,
    targets: &BTreeMap<String, (String, PathBuf)>,
    config: &PackagingConfig,
    s: &mut RecombineSummary,
    observer: &dyn Observer,
) -> Result<BTreeMap<String, String>> {
    let mut seen: BTreeMap<String, Vec<Provided>> = BTreeMap::new();
    for (target, (shard, src)) in targets {
        for p in read_manifest(src)? {
            let root = src.join(&p);
            if !root.is_dir() {
                continue;
            }
            for n in scan(&root)? {
                if n.kind == NodeKind::Dir {
                    continue;
                }
                let rel = format!("{p}/{}", n.rel_str(&root)?);
                let path = root.join(&n.rel);
                seen.entry(rel).or_default().push(Provided {
                    shard: shard.clone(),
                    target: target.clone(),
                    path,
                    node: n,
                });
            }
        }
    }
    let mut winners = BTreeMap::new();
    for (rel, provided) in &seen {
        let Some(winner) = conflict_winner(provided, &config.primary_shard)? else {
            continue;
        };
        let first = &provided[0].shard;
        let other = provided
            .iter()
            .find(|p| &p.shard != first)
            .map_or(first, |p| &p.shard);
        if config.validation.error_on_duplicate_device_code {
            return Err(ArtifactError::FileConflict {
                artifact: artifact.to_string(),
                path: rel.clone(),
                shards: (first.clone(), other.clone()),
            });
        }
        let shards: BTreeSet<String> = provided.iter().map(|p| p.shard.clone()).collect();
        let shards: Vec<String> = shards.into_iter().collect();
        let msg = format!(
            "{artifact}/{rel}: shards {} provide different contents: taken from {}",
            shards.join(", "),
            winner.shard
        );
        s.warn(observer, msg);
        s.file_conflicts.push(FileConflict {
            artifact: artifact.to_string(),
            path: rel.clone(),
            shards,
            taken_from: winner.shard.clone(),
        });
        winners.insert(rel.clone(), winner.target.clone());
    }
    Ok(winners)
}

/// When the providers of one path come from more than one shard and do
/// not all agree: the one taken (of the primary shard, else of the first
/// shard in sorted order). `None` when there is nothing to decide.
fn conflict_winner<'a>(provided: &'a [Provided], primary: &str) -> Result<Option<&'a Provided>> {
    let first = &provided[0];
    if provided.iter().all(|p| p.shard == first.shard) {
        return Ok(None);
    }
    let mut agree = true;
    for p in &provided[1..] {
        agree &= same_entry(&first.node, &first.path, &p.node, &p.path)?;
    }
    if agree {
        return Ok(None);
    }
    let by_shard = |p: &&Provided| (p.shard != primary, p.shard.clone());
    Ok(provided.iter().min_by_key(by_shard))
}

/// The same symlink target, or two files with the same bytes.
fn same_entry(a: &Node, pa: &Path, b: &Node, pb: &Path) -> Result<bool> {
    Ok(match (&a.kind, &b.kind) {
        (NodeKind::Symlink(x), NodeKind::Symlink(y)) => x == y,
        (NodeKind::File { .. }, NodeKind::File { .. }) => same_bytes(pa, pb)?,
        _ => false,
    })
}

/// `--expect-targets`: every target expected has code objects (a `.kpack`
/// archive in its artifact) in some shard of the components recombined.
fn check_expected(
    components: &BTreeMap<String, Component>,
    expected: &[String],
    input: &Path,
) -> Result<()> {
    if expected.is_empty() {
        return Ok(());
    }
    let mut present = crate::expect::Present::default();
    for c in components.values() {
        for (target, by_shard) in &c.targets {
            for dir in by_shard.values() {
                present.add(target, holds_archive(dir)?);
            }
        }
    }
    crate::expect::check(expected, &present, "recombined artifact set", input)
}

/// Does a target artifact hold a `.kpack` archive (code objects, not only
/// database files)?
fn holds_archive(dir: &Path) -> Result<bool> {
    Ok(scan(dir)?.iter().any(|n| {
        matches!(n.kind, NodeKind::File { .. })
            && n.rel.extension().is_some_and(|e| e == "kpack")
            && n.rel.components().any(|c| c.as_os_str() == ".kpack")
    }))
}

/// The shard (and artifact) a target of a component is taken from: the only
/// one, else the primary shard or the first in sorted order. Shards that
/// provide different bytes are an error
/// (`validation.error_on_duplicate_device_code`) or a warning.
fn target_source(
    name: &str,
    target: &str,
    by_shard: &BTreeMap<String, PathBuf>,
    config: &PackagingConfig,
    s: &mut RecombineSummary,
    observer: &dyn Observer,
) -> Result<(String, PathBuf)> {
    let (first_shard, first_dir) = by_shard.iter().next().expect("a target has a shard");
    if by_shard.len() == 1 {
        return Ok((first_shard.clone(), first_dir.clone()));
    }
    let pick = by_shard
        .get_key_value(&config.primary_shard)
        .unwrap_or((first_shard, first_dir));
    let mut differing = Vec::new();
    for (shard, dir) in by_shard {
        if shard == pick.0 {
            continue;
        }
        if let Some(d) = compare_trees(pick.1, dir)?.into_iter().next() {
            differing.push((shard.clone(), d.to_string()));
        }
    }
    let shards: Vec<String> = by_shard.keys().cloned().collect();
    if differing.is_empty() {
        let msg = format!(
            "{name}/{target}: identical in shards {}: taken from {}",
            shards.join(", "),
            pick.0
        );
        s.note(observer, msg);
    } else if config.validation.error_on_duplicate_device_code {
        let (other, detail) = differing.remove(0);
        return Err(ArtifactError::DuplicateDeviceCode {
            component: name.to_string(),
            target: target.to_string(),
            shards: vec![pick.0.clone(), other],
            detail,
        });
    } else {
        let msg = format!(
            "{name}/{target}: shards {} provide different bytes: taken from {}",
            shards.join(", "),
            pick.0
        );
        s.warn(observer, msg);
    }
    Ok((pick.0.clone(), pick.1.clone()))
}

/// Step 5: the output names (per component: generic, then its groups),
/// none of which may exist in `out` (created if missing).
fn check_outputs(plans: &[Planned], out: &Path) -> Result<Vec<String>> {
    make_dirs(out)?;
    let mut outputs = Vec::new();
    for p in plans {
        outputs.push(generic_name(&p.name));
        for g in p.groups.keys() {
            outputs.push(format!("{}_{g}", p.name));
        }
    }
    for o in &outputs {
        let path = out.join(o);
        if path.exists() {
            return Err(ArtifactError::OutputExists { path });
        }
    }
    Ok(outputs)
}

/// Assemble every component's outputs in `staging` (in parallel): its
/// generic artifact copied, one artifact per group merged from its
/// targets' artifacts. Per component: the group summaries and bytes
/// written.
fn assemble(
    plans: &[Planned],
    staging: &Path,
    observer: &dyn Observer,
) -> Vec<Result<(Vec<GroupSummary>, u64)>> {
    plans
        .par_iter()
        .map(|p| {
            let generic = staging.join(generic_name(&p.name));
            let mut bytes = copy_tree(&p.generic, &generic)?;
            owner_writable(&generic)?;
            for rel in release_digests(&generic, &p.generic, &p.other_generics)? {
                observer.note(&format!(
                    "{}: its shards were split from different builds: device digest left out",
                    generic.join(rel).display()
                ));
            }
            observer.advance(bytes);
            let mut groups = Vec::new();
            for (g, targets) in &p.groups {
                let artifact = format!("{}_{g}", p.name);
                let winners = p.winners.get(g).cloned().unwrap_or_default();
                let (prefixes, n) = merge_targets(&staging.join(&artifact), targets, &winners)?;
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
        .collect()
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
    winners: &BTreeMap<String, String>,
) -> Result<(Vec<String>, u64)> {
    make_dirs(dir)?;
    let mut prefixes = BTreeSet::new();
    let mut modes = Vec::new();
    let mut bytes = 0;
    for (target, (_, src)) in targets {
        for p in read_manifest(src)? {
            let root = src.join(&p);
            if !root.is_dir() {
                continue;
            }
            bytes += merge_prefix(dir, &root, &p, target, winners)?;
            modes.push((dir.join(&p), root));
            prefixes.insert(p);
        }
    }
    // Only once every target is in: a read-only directory of the first
    // target would keep the next one from writing into it.
    for (out, src) in modes.iter().rev() {
        crate::tree::copy_dir_modes(out, src)?;
    }
    let prefixes: Vec<String> = prefixes.into_iter().collect();
    manifest::write_manifest(dir, &prefixes)?;
    Ok((prefixes, bytes))
}

/// Copy prefix `p` of `target`'s artifact (at `root`) into `dir`, but not
/// the paths of `winners` another target's file is taken for; returns the
/// bytes of the files copied.
fn merge_prefix(
    dir: &Path,
    root: &Path,
    p: &str,
    target: &str,
    winners: &BTreeMap<String, String>,
) -> Result<u64> {
    refuse_symlink_ancestor(dir, Path::new(p), target)?;
    make_dirs(&dir.join(p))?;
    let mut bytes = 0;
    for n in scan(root)? {
        let (from, to) = (root.join(&n.rel), dir.join(p).join(&n.rel));
        // Another target may have put a symlink where this one has a
        // directory: never write through it.
        let rel = Path::new(p).join(&n.rel);
        refuse_symlink_ancestor(dir, rel.parent().unwrap_or(Path::new("")), target)?;
        if n.kind == NodeKind::Dir {
            refuse_symlink_ancestor(dir, &rel, target)?;
        }
        match &n.kind {
            NodeKind::Dir => make_dirs(&to)?,
            kind => {
                let key = format!("{p}/{}", n.rel_str(root)?);
                if winners.get(&key).is_some_and(|w| w != target) {
                    continue;
                }
                if fs::symlink_metadata(&to).is_ok() {
                    check_same(&n, &from, &to, p, target)?;
                    continue;
                }
                match kind {
                    NodeKind::Symlink(t) => copy_symlink(t, &to)?,
                    _ => bytes += copy_file(&from, &to, n.mode)?,
                }
            }
        }
    }
    Ok(bytes)
}

/// Fail unless `to`, which another target of the group put there, is the
/// same as `from` (node `n` of prefix `p` of `target`): the same symlink
/// target, or the same bytes.
fn check_same(n: &Node, from: &Path, to: &Path, p: &str, target: &str) -> Result<()> {
    let same = match &n.kind {
        NodeKind::Symlink(t) => fs::read_link(to).ok().as_ref() == Some(t),
        _ => same_bytes(from, to)?,
    };
    if same {
        return Ok(());
    }
    Err(ArtifactError::input(
        from,
        format!(
            "{target}: {p}/{} is also provided by another target of the group, with different contents",
            n.rel.display()
        ),
    ))
}

/// One difference between two artifact trees.
struct Difference {
    path: String,
    what: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.what)
    }
}

/// Differences between two artifact trees (paths, symlink targets, bytes),
/// in path order.
fn compare_trees(a: &Path, b: &Path) -> Result<Vec<Difference>> {
    compare(a, b, false)
}

/// Like [`compare_trees`], but offloaded binaries compare by their HIPK
/// metadata and wrapper count (their bytes legitimately differ between
/// shards).
fn compare_generic(a: &Path, b: &Path) -> Result<Vec<Difference>> {
    compare(a, b, true)
}

fn compare(a: &Path, b: &Path, offloaded_by_metadata: bool) -> Result<Vec<Difference>> {
    let index = |dir: &Path| -> Result<BTreeMap<PathBuf, Node>> {
        Ok(scan(dir)?.into_iter().map(|n| (n.rel.clone(), n)).collect())
    };
    let (ia, ib) = (index(a)?, index(b)?);
    let mut diffs = Vec::new();
    let keys: BTreeSet<&PathBuf> = ia.keys().chain(ib.keys()).collect();
    for k in keys {
        let what = match (ia.get(k), ib.get(k)) {
            (Some(_), None) => Some("only in the first".to_string()),
            (None, Some(_)) => Some("only in the second".to_string()),
            (Some(x), Some(y)) => differ(x, y, &a.join(k), &b.join(k), offloaded_by_metadata)?,
            (None, None) => None,
        };
        if let Some(what) = what {
            let path = k.to_string_lossy().replace('\\', "/");
            diffs.push(Difference { path, what });
        }
    }
    Ok(diffs)
}

/// How two entries of one path differ, if they do.
fn differ(x: &Node, y: &Node, pa: &Path, pb: &Path, by_metadata: bool) -> Result<Option<String>> {
    Ok(match (&x.kind, &y.kind) {
        (NodeKind::Dir, NodeKind::Dir) => None,
        (NodeKind::Symlink(s), NodeKind::Symlink(t)) => {
            (s != t).then(|| format!("symlink to {} vs {}", s.display(), t.display()))
        }
        (NodeKind::File { .. }, NodeKind::File { .. }) => {
            if by_metadata {
                if let (Some(ma), Some(mb)) = (offloaded(pa), offloaded(pb)) {
                    return Ok((ma != mb).then(|| {
                        "offloaded binaries with different kernel names, search paths or wrapper counts".to_string()
                    }));
                }
            }
            (!same_bytes(pa, pb)?).then(|| "different bytes".to_string())
        }
        _ => Some("different kinds of entry".to_string()),
    })
}

/// What must match between shards of an offloaded binary: its kernel name,
/// search paths and wrapper count. Not `kpack_targets`: each shard's split
/// records the targets that shard built.
fn offloaded(path: &Path) -> Option<(String, Vec<String>, usize)> {
    if classify(&map_file(path).ok()?) != Class::Offloaded {
        return None;
    }
    let v = verify_file(path).ok()?;
    let m = v.metadata;
    Some((m.kernel_name, m.search_paths, v.co_indices.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::test_util::{
        child_dir, entries, hidden_entries, killed_run_leftovers, run_killed_child, small_artifact,
        snapshot, DieOnAdvance,
    };
    use crate::artifact::{split_artifact, SplitOptions};
    use crate::{Database, Silent};

    /// Two shards, each the split of an artifact built for its own targets.
    fn shards(dir: &Path) {
        for (shard, targets) in [
            ("s1", ["gfx1100", "gfx1101"]),
            ("s2", ["gfx942", "gfx1100"]),
        ] {
            let input = dir.join("in").join(shard).join("blas_lib_x");
            small_artifact(&input, &targets);
            let mut o = SplitOptions::new(dir.join("shards").join(shard));
            o.databases = vec![Database::Rocblas];
            split_artifact(&input, "blas_lib", &o, &Silent).unwrap();
        }
    }

    fn config() -> PackagingConfig {
        PackagingConfig::parse(
            Path::new("c.json"),
            r#"{"primary_shard": "s1", "architecture_groups": {
                "gfx110X": {"architectures": ["gfx1100", "gfx1101"]},
                "gfx94X": {"architectures": ["gfx942"]}}}"#,
        )
        .unwrap()
    }

    fn run(input: &Path, out: &Path) -> Result<RecombineSummary> {
        let opts = RecombineOptions {
            output_dir: out.to_path_buf(),
            components: Vec::new(),
            expect_targets: Vec::new(),
        };
        recombine(input, &config(), &opts, &Silent)
    }

    /// Staging directories that a killed recombine left in the output
    /// directory are removed by the next recombine into it, which writes the
    /// same output as one into a clean directory.
    #[test]
    fn leftovers_of_a_killed_recombine_are_removed() {
        let t = tempfile::tempdir().unwrap();
        shards(t.path());
        let input = t.path().join("shards");
        let clean = t.path().join("clean");
        let s = run(&input, &clean).unwrap();
        assert_eq!(
            entries(&clean),
            ["blas_lib_generic", "blas_lib_gfx110X", "blas_lib_gfx94X"]
        );
        assert_eq!(s.components[0].groups[0].targets["gfx1100"], "s1");
        assert_eq!(s.components[0].groups[1].targets["gfx942"], "s2");
        let want = snapshot(&clean);
        let out = t.path().join("out");
        killed_run_leftovers(&out);
        let s = run(&input, &out).unwrap();
        assert!(
            hidden_entries(&out).is_empty(),
            "{:?}",
            hidden_entries(&out)
        );
        assert_eq!(snapshot(&out), want);
        let swept = s.notes.iter().filter(|n| n.contains("interrupted run"));
        assert_eq!(swept.count(), 2, "{:?}", s.notes);
    }

    /// A recombine that dies in the middle (after copying its first generic
    /// artifact) leaves only a hidden staging directory; the next one
    /// removes it.
    #[test]
    fn a_recombine_killed_mid_run_is_cleaned_up_by_the_next() {
        if let Some(dir) = child_dir() {
            let opts = RecombineOptions {
                output_dir: dir.join("out"),
                components: Vec::new(),
                expect_targets: Vec::new(),
            };
            let r = recombine(&dir.join("shards"), &config(), &opts, &DieOnAdvance);
            panic!("not killed: {:?}", r.map(|_| ()));
        }
        let t = tempfile::tempdir().unwrap();
        shards(t.path());
        run_killed_child(
            "artifact::recombine::tests::a_recombine_killed_mid_run_is_cleaned_up_by_the_next",
            t.path(),
        );
        let out = t.path().join("out");
        let left = entries(&out);
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(
            left[0].starts_with(kpack_host::output::STAGING_PREFIX),
            "{left:?}"
        );
        assert!(out.join(&left[0]).join("blas_lib_generic").is_dir());
        let input = t.path().join("shards");
        run(&input, &out).unwrap();
        assert!(
            hidden_entries(&out).is_empty(),
            "{:?}",
            hidden_entries(&out)
        );
        let clean = t.path().join("clean");
        run(&input, &clean).unwrap();
        assert_eq!(snapshot(&out), snapshot(&clean));
    }

    /// A failing recombine writes nothing, not even its output directory.
    #[test]
    fn failing_recombine_writes_nothing() {
        let t = tempfile::tempdir().unwrap();
        shards(t.path());
        let input = t.path().join("shards");
        // gfx1100 from both shards with different bytes.
        let db = "blas_lib_gfx1100/stage/lib/rocblas/library/TensileLibrary_gfx1100.dat";
        fs::write(input.join("s2").join(db), b"other").unwrap();
        let out = t.path().join("out");
        let e = run(&input, &out).unwrap_err();
        assert!(
            matches!(e, ArtifactError::DuplicateDeviceCode { .. }),
            "{e}"
        );
        assert!(!out.exists());
    }
}
