//! `kpack verify` (SPEC §5): the invariants of split artifacts (names end
//! in a target) or, with a packaging config, of recombined ones (names end
//! in a group).
//!
//! - every artifact has a valid manifest, its prefixes exist, and nothing
//!   lies outside them;
//! - generic artifacts: no `.kpack` archive, no ELF file with a PROGBITS
//!   `.hip_fatbin`, and every offloaded binary passes the ELF verifier;
//! - per-target (per-group) artifacts: only `.kpack` archives and database
//!   files of their own target(s), no host binaries; every archive parses
//!   and every code object in it decompresses to its `original_size`;
//! - every component with per-target artifacts has its generic artifact;
//! - resolution: for each per-target artifact, the generic artifact and it
//!   are installed the way a package does (every prefix of both flattened
//!   into one root; here a tree of symlinks), and every wrapper of every
//!   offloaded binary is loaded through the runtime's search logic
//!   ([`Loader`]) for every target the artifact serves. A binary that has
//!   no code object at all for one of those targets (it was built for fewer
//!   targets than its neighbours) is a warning, not a problem: the fat
//!   binary could not have run there either.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use super::config::PackagingConfig;
use super::databases::{Claim, Database};
use super::manifest::{read_manifest, OutputName, Suffix, MANIFEST};
use super::tree::{copy_symlink, make_dirs, rel_string, scan, Node, NodeKind};
use super::{ArtifactError, Observer, Result};
use crate::archive::Archive;
use crate::elf::{ElfView, FATBIN_SECTION};
use crate::input::map_file;
use crate::loader::{Config, Loader};
use crate::offload::verify_file;
use crate::target::TargetId;

/// EM_AMDGPU: device code objects are ELF files too.
const EM_AMDGPU: u16 = 224;

#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// Verify recombined artifacts named after this config's groups.
    pub config: Option<PackagingConfig>,
}

/// What verify found (`--json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    pub artifacts_dir: String,
    pub artifacts: usize,
    pub components: usize,
    pub archives: usize,
    /// Code objects decompressed and checked.
    pub code_objects: usize,
    pub database_files: usize,
    pub offloaded_binaries: usize,
    /// (binary, wrapper, target) triples loaded through the loader.
    pub wrappers_resolved: usize,
    /// Every target served, sorted.
    pub targets: Vec<String>,
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    Generic,
    /// Per-target (split) or per-group (recombined) artifact, with the
    /// predicate's name.
    Device(String),
}

struct Artifact {
    name: String,
    dir: PathBuf,
    component: String,
    role: Role,
    prefixes: Vec<String>,
}

/// An offloaded binary of a generic artifact.
struct Binary {
    /// Path relative to the install root (the flattened layout).
    rel: PathBuf,
    shown: String,
    metadata: Vec<u8>,
    kernel_name: String,
    co_indices: Vec<u64>,
}

/// What a device artifact serves.
#[derive(Default)]
struct Served {
    /// Target -> kernel names (without `#N`) of its archives.
    names: BTreeMap<String, BTreeSet<String>>,
}

pub fn verify_artifacts(
    dir: &Path,
    opts: &VerifyOptions,
    observer: &dyn Observer,
) -> Result<VerifyReport> {
    let mut report = VerifyReport {
        artifacts_dir: dir.display().to_string(),
        ..Default::default()
    };
    let mut problems: Vec<String> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();

    // Leftovers of interrupted runs.
    for e in fs::read_dir(dir).map_err(|e| ArtifactError::io(dir, e))? {
        let e = e.map_err(|e| ArtifactError::io(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(".kpack-") {
            warnings.push(format!(
                "{}: leftover staging directory of an interrupted run (not an artifact; safe to delete)",
                e.path().display()
            ));
        }
    }

    // Artifacts and their roles.
    let mut artifacts = Vec::new();
    for (name, path) in super::manifest::subdirs(dir)? {
        let Some(parsed) = OutputName::parse(&name) else {
            problems.push(format!(
                "{}: not an artifact name (<component>_generic or <component>_<{}>)",
                path.display(),
                if opts.config.is_some() {
                    "group"
                } else {
                    "target"
                }
            ));
            continue;
        };
        let role = match (&parsed.suffix, &opts.config) {
            (Suffix::Generic, _) => Role::Generic,
            (Suffix::Target(t), None) => Role::Device(t.clone()),
            (Suffix::Target(g) | Suffix::Other(g), Some(c)) if c.group(g).is_some() => {
                Role::Device(g.clone())
            }
            (Suffix::Target(s) | Suffix::Other(s), Some(_)) => {
                problems.push(format!(
                    "{}: {s:?} is neither \"generic\" nor a group of the packaging config",
                    path.display()
                ));
                continue;
            }
            (Suffix::Other(s), None) => {
                problems.push(format!(
                    "{}: {s:?} is neither \"generic\" nor a target ID (recombined artifacts need --config)",
                    path.display()
                ));
                continue;
            }
        };
        let prefixes = match read_manifest(&path) {
            Ok(p) => p,
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        artifacts.push(Artifact {
            name,
            dir: path,
            component: parsed.component,
            role,
            prefixes,
        });
    }
    report.artifacts = artifacts.len();
    observer.note(&format!(
        "{}: {} artifact(s)",
        dir.display(),
        artifacts.len()
    ));

    // Per-artifact checks.
    let mut generics: BTreeMap<String, (usize, Vec<Binary>)> = BTreeMap::new();
    let mut devices: BTreeMap<String, Vec<(usize, Served)>> = BTreeMap::new();
    let mut targets: BTreeSet<String> = BTreeSet::new();
    for (i, a) in artifacts.iter().enumerate() {
        let nodes = match layout(a, &mut problems) {
            Some(n) => n,
            None => continue,
        };
        match &a.role {
            Role::Generic => {
                let binaries = check_generic(a, &nodes, &mut problems);
                report.offloaded_binaries += binaries.len();
                generics.insert(a.component.clone(), (i, binaries));
            }
            Role::Device(what) => {
                let allowed = |t: &str| match &opts.config {
                    None => t == what,
                    Some(c) => c.group(what).is_some_and(|g| g.contains(t)),
                };
                let served = check_device(a, &nodes, &allowed, &mut report, &mut problems);
                targets.extend(served.names.keys().cloned());
                devices
                    .entry(a.component.clone())
                    .or_default()
                    .push((i, served));
            }
        }
    }
    let components: BTreeSet<&String> = artifacts.iter().map(|a| &a.component).collect();
    report.components = components.len();
    report.targets = targets.into_iter().collect();

    // Every component's artifacts fit together.
    for (component, devs) in &devices {
        if !generics.contains_key(component) {
            let names: Vec<&str> = devs
                .iter()
                .map(|(i, _)| artifacts[*i].name.as_str())
                .collect();
            problems.push(format!(
                "component {component}: {} without {component}_generic (an interrupted split?)",
                names.join(", ")
            ));
        }
    }
    for (component, (i, binaries)) in &generics {
        if !binaries.is_empty() && !devices.contains_key(component) {
            problems.push(format!(
                "{}: {} offloaded binar{} but no per-target artifact of component {component} holds their code objects",
                artifacts[*i].dir.display(),
                binaries.len(),
                if binaries.len() == 1 { "y" } else { "ies" }
            ));
        }
    }

    // Resolution through the loader, in the installed layout.
    for (component, (gi, binaries)) in &generics {
        if binaries.is_empty() {
            continue;
        }
        let Some(devs) = devices.get(component) else {
            continue;
        };
        let mut found_anywhere: BTreeSet<&str> = BTreeSet::new();
        for (di, served) in devs {
            let (g, d) = (&artifacts[*gi], &artifacts[*di]);
            let root = tempfile::Builder::new()
                .prefix(".kpack-verify-")
                .tempdir()
                .map_err(|e| ArtifactError::io(std::env::temp_dir(), e))?;
            if let Err(e) = install_links(&[g, d], root.path(), &mut problems) {
                problems.push(e.to_string());
                continue;
            }
            let loader = Loader::new(Config::default());
            let mut tasks = Vec::new();
            for b in binaries {
                for (target, names) in &served.names {
                    if names.contains(&b.kernel_name) {
                        found_anywhere.insert(&b.kernel_name);
                        for &co in &b.co_indices {
                            tasks.push((b, target.as_str(), co));
                        }
                    } else {
                        warnings.push(format!(
                            "{}: no code object for {target} in {} (built for fewer targets?)",
                            b.shown, d.name
                        ));
                    }
                }
            }
            let results: Vec<Option<String>> = tasks
                .par_iter()
                .map(|(b, target, co)| {
                    let path = root.path().join(&b.rel);
                    let Ok(co32) = u32::try_from(*co) else {
                        return Some(format!("{}: wrapper code object index {co} does not fit in u32", b.shown));
                    };
                    match loader.load_code_object(&b.metadata, &path, co32, &[target]) {
                        Ok(bytes) if bytes.starts_with(b"\x7fELF") => None,
                        Ok(_) => Some(format!(
                            "{}: code object {}#{co} for {target} (installed with {}) is not an ELF file",
                            b.shown, b.kernel_name, d.name
                        )),
                        Err(e) => Some(format!(
                            "{}: wrapper with co_index {co} does not resolve for {target} when installed with {}: {e}",
                            b.shown, d.name
                        )),
                    }
                })
                .collect();
            report.wrappers_resolved += results.iter().filter(|r| r.is_none()).count();
            problems.extend(results.into_iter().flatten());
        }
        for b in binaries {
            if !found_anywhere.contains(b.kernel_name.as_str()) {
                problems.push(format!(
                    "{}: no archive of component {component} has code objects of {} (kernel name) for any target",
                    b.shown, b.kernel_name
                ));
            }
        }
    }

    problems.sort();
    problems.dedup();
    warnings.sort();
    warnings.dedup();
    for w in &warnings {
        observer.warn(w);
    }
    report.problems = problems;
    report.warnings = warnings;
    Ok(report)
}

/// The nodes below each prefix (prefix, node), after checking that the
/// prefixes exist and that nothing lies outside them.
fn layout(a: &Artifact, problems: &mut Vec<String>) -> Option<Vec<(String, Node)>> {
    let mut ok = true;
    let mut nodes = Vec::new();
    for p in &a.prefixes {
        let root = a.dir.join(p);
        if !root.is_dir() {
            problems.push(format!(
                "{}: manifest prefix {p} has no directory",
                a.dir.display()
            ));
            ok = false;
            continue;
        }
        match scan(&root) {
            Ok(ns) => nodes.extend(ns.into_iter().map(|n| (p.clone(), n))),
            Err(e) => {
                problems.push(e.to_string());
                ok = false;
            }
        }
    }
    // Anything outside the prefixes.
    match scan(&a.dir) {
        Ok(all) => {
            for n in all {
                let rel = rel_string(&n.rel).unwrap_or_default();
                if rel == MANIFEST {
                    continue;
                }
                let inside = a.prefixes.iter().any(|p| {
                    rel == *p
                        || rel.starts_with(&format!("{p}/"))
                        || p.starts_with(&format!("{rel}/"))
                });
                if !inside {
                    problems.push(format!(
                        "{}: {rel} lies outside every manifest prefix",
                        a.dir.display()
                    ));
                }
            }
        }
        Err(e) => problems.push(e.to_string()),
    }
    ok.then_some(nodes)
}

fn check_generic(
    a: &Artifact,
    nodes: &[(String, Node)],
    problems: &mut Vec<String>,
) -> Vec<Binary> {
    let files: Vec<&(String, Node)> = nodes
        .iter()
        .filter(|(_, n)| matches!(n.kind, NodeKind::File { .. }))
        .collect();
    let results: Vec<(Option<Binary>, Vec<String>)> = files
        .par_iter()
        .map(|(p, n)| {
            let path = a.dir.join(p).join(&n.rel);
            let shown = format!("{}/{p}/{}", a.name, n.rel.display());
            let mut bad = Vec::new();
            let mapped = match map_file(&path) {
                Ok(m) => m,
                Err(e) => return (None, vec![e.to_string()]),
            };
            if mapped.starts_with(crate::archive::MAGIC)
                || path.extension().is_some_and(|e| e == "kpack")
            {
                bad.push(format!("{shown}: a .kpack archive in a generic artifact"));
                return (None, bad);
            }
            if !mapped.starts_with(b"\x7fELF") {
                return (None, bad);
            }
            let Ok(elf) = ElfView::parse(&mapped) else {
                return (None, bad);
            };
            let Ok(Some(section)) = elf.section(FATBIN_SECTION) else {
                return (None, bad);
            };
            if !section.is_nobits() {
                bad.push(format!(
                    "{shown}: still carries device code (PROGBITS {FATBIN_SECTION}): not offloaded"
                ));
                return (None, bad);
            }
            drop(mapped);
            match verify_file(&path) {
                Ok(v) => (
                    Some(Binary {
                        rel: n.rel.clone(),
                        shown,
                        metadata: v.metadata.encode(),
                        kernel_name: v.metadata.kernel_name.clone(),
                        co_indices: v.co_indices.clone(),
                    }),
                    bad,
                ),
                Err(e) => {
                    bad.push(format!(
                        "{shown}: NOBITS {FATBIN_SECTION} but not a valid offloaded binary: {e}"
                    ));
                    (None, bad)
                }
            }
        })
        .collect();
    let mut binaries = Vec::new();
    for (b, bad) in results {
        problems.extend(bad);
        binaries.extend(b);
    }
    binaries
}

fn check_device(
    a: &Artifact,
    nodes: &[(String, Node)],
    allowed: &(dyn Fn(&str) -> bool + Sync),
    report: &mut VerifyReport,
    problems: &mut Vec<String>,
) -> Served {
    let mut served = Served::default();
    let entries: Vec<&(String, Node)> = nodes
        .iter()
        .filter(|(_, n)| !matches!(n.kind, NodeKind::Dir))
        .collect();
    struct Found {
        archive: Option<(Vec<String>, BTreeSet<String>, usize)>,
        database: bool,
        bad: Vec<String>,
    }
    let results: Vec<Found> = entries
        .par_iter()
        .map(|(p, n)| {
            let path = a.dir.join(p).join(&n.rel);
            let shown = format!("{}/{p}/{}", a.name, n.rel.display());
            let rel = rel_string(&n.rel).unwrap_or_default();
            let name = n.rel.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let mut f = Found {
                archive: None,
                database: false,
                bad: Vec::new(),
            };
            let is_file = matches!(n.kind, NodeKind::File { .. });
            if is_file && name.ends_with(".kpack") {
                match check_archive(&path, &shown, &a.component, &name, allowed) {
                    Ok(x) => f.archive = Some(x),
                    Err(mut bad) => f.bad.append(&mut bad),
                }
                return f;
            }
            if is_file {
                if let Ok(m) = map_file(&path) {
                    if let Ok(elf) = ElfView::parse(&m) {
                        if elf.machine() != EM_AMDGPU {
                            f.bad.push(format!(
                                "{shown}: a host binary in a per-target artifact (only archives and database files belong there)"
                            ));
                            return f;
                        }
                    }
                }
            }
            let claim = Database::ALL.iter().find_map(|d| match d.claim(&rel) {
                Claim::No => None,
                c => Some(c),
            });
            match claim {
                Some(Claim::Target(t)) if allowed(&t) => f.database = true,
                Some(Claim::Target(t)) => f.bad.push(format!(
                    "{shown}: a database file of {t}, which does not belong in {}",
                    a.name
                )),
                _ => f.bad.push(format!(
                    "{shown}: neither a .kpack archive nor a database file of a target: does not belong in a per-target artifact"
                )),
            }
            f
        })
        .collect();
    for r in results {
        problems.extend(r.bad);
        if r.database {
            report.database_files += 1;
        }
        if let Some((arches, names, kernels)) = r.archive {
            report.archives += 1;
            report.code_objects += kernels;
            for t in arches {
                served
                    .names
                    .entry(t)
                    .or_default()
                    .extend(names.iter().cloned());
            }
        }
    }
    served
}

/// Check one archive: its name, its targets, and that every code object
/// decompresses to its size. Returns (gfx_arches, kernel names, code
/// objects).
#[allow(clippy::type_complexity)]
fn check_archive(
    path: &Path,
    shown: &str,
    component: &str,
    file_name: &str,
    allowed: &(dyn Fn(&str) -> bool + Sync),
) -> std::result::Result<(Vec<String>, BTreeSet<String>, usize), Vec<String>> {
    let archive = Archive::open(path).map_err(|e| vec![format!("{shown}: {e}")])?;
    let mut bad = Vec::new();
    let arches = archive.gfx_arches().to_vec();
    let stem = file_name.trim_end_matches(".kpack");
    match stem.strip_prefix(&format!("{component}_")) {
        Some(t) if arches.len() == 1 && arches[0] == t => {}
        _ => bad.push(format!(
            "{shown}: archive name does not match <component>_<target>.kpack for component {component} and its gfx_arches {arches:?}"
        )),
    }
    for t in &arches {
        if TargetId::parse(t).is_err() {
            bad.push(format!("{shown}: gfx_arches has {t:?}, not a target ID"));
        } else if !allowed(t) {
            bad.push(format!(
                "{shown}: serves {t}, which does not belong in this artifact"
            ));
        }
    }
    let entries = archive.entries();
    let errors: Vec<String> = entries
        .par_iter()
        .filter_map(|e| {
            if !arches.contains(&e.target) {
                return Some(format!(
                    "{shown}: code object {} is for {}, not among gfx_arches",
                    e.key, e.target
                ));
            }
            match archive.read(e) {
                Ok(data) if data.len() as u64 == e.original_size => None,
                Ok(data) => Some(format!(
                    "{shown}: {} @ {}: {} bytes, original_size {}",
                    e.key,
                    e.target,
                    data.len(),
                    e.original_size
                )),
                Err(err) => Some(format!("{shown}: {err}")),
            }
        })
        .collect();
    bad.extend(errors);
    if !bad.is_empty() {
        return Err(bad);
    }
    let names = archive
        .binaries()
        .map(|k| k.rsplit_once('#').map_or(k, |(n, _)| n).to_string())
        .collect();
    Ok((arches, names, entries.len()))
}

/// Install `artifacts` into `root` the way a package does, flattening every
/// prefix of each into the root, with symlinks to the files instead of
/// copies. Two different files at one path are a problem.
fn install_links(artifacts: &[&Artifact], root: &Path, problems: &mut Vec<String>) -> Result<()> {
    let mut placed: BTreeMap<PathBuf, String> = BTreeMap::new();
    for a in artifacts {
        for p in &a.prefixes {
            let src_root = a.dir.join(p);
            // Directories that collided with a file or symlink: nothing
            // below them is installed (it would go through a symlink).
            let mut blocked: Vec<PathBuf> = Vec::new();
            for n in scan(&src_root)? {
                if blocked.iter().any(|b| n.rel.starts_with(b)) {
                    continue;
                }
                let dst = root.join(&n.rel);
                let from = format!("{}/{p}", a.name);
                match &n.kind {
                    NodeKind::Dir => {
                        if fs::symlink_metadata(&dst).is_ok_and(|m| !m.is_dir()) {
                            problems.push(format!(
                                "installing {}: {} is a directory in {from} but not in {}",
                                artifacts
                                    .iter()
                                    .map(|a| a.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(" and "),
                                n.rel.display(),
                                placed
                                    .get(&n.rel)
                                    .map(String::as_str)
                                    .unwrap_or("another prefix")
                            ));
                            blocked.push(n.rel.clone());
                            continue;
                        }
                        make_dirs(&dst)?;
                    }
                    NodeKind::Symlink(_) | NodeKind::File { .. } => {
                        if dst.symlink_metadata().is_ok() {
                            problems.push(format!(
                                "installing {}: {} comes from both {} and {from}",
                                artifacts
                                    .iter()
                                    .map(|a| a.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(" and "),
                                n.rel.display(),
                                placed
                                    .get(&n.rel)
                                    .map(String::as_str)
                                    .unwrap_or("another prefix")
                            ));
                            continue;
                        }
                        match &n.kind {
                            NodeKind::Symlink(t) => copy_symlink(t, &dst)?,
                            _ => {
                                let src = fs::canonicalize(src_root.join(&n.rel))
                                    .map_err(|e| ArtifactError::io(src_root.join(&n.rel), e))?;
                                copy_symlink(&src, &dst)?;
                            }
                        }
                        placed.insert(n.rel.clone(), from);
                    }
                }
            }
        }
    }
    Ok(())
}
