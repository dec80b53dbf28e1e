//! `kpack verify` (formats.md §6.4): the invariants of split artifacts (names end
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
//!   binary could not have run there either. Nor is a code object index
//!   whose bundle was built without the target while others were
//!   (`kpack_co_targets`, [`kpack_host::built_for`]): a note. A code object of another
//!   build (by its provenance digest, else by defining only kernels the
//!   binary does not name: [`crate::build_match`], the rule `verify --tree`
//!   applies too) is a problem.
//! - outputs past the limits of ROCm's HRX runtime ([`kpack_format::hrx`]:
//!   a binary's metadata, an archive's keys, targets and code objects) are
//!   warnings: they are valid, and load with kpack's runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use super::config::PackagingConfig;
use super::manifest::{read_manifest, OutputName, Suffix, MANIFEST};
use crate::build_match::{
    kernels_of, other_builds, unnamed_only, NotCodeObject, OtherBuild, Resolved,
};
use crate::databases::{self, Database};
use crate::hipk::HipkMetadata;
use crate::input::map_file;
use crate::loader::{Config, Loader};
use crate::target::TargetId;
use crate::tree::{copy_symlink, make_dirs, rel_string, scan, Node, NodeKind};
use crate::{ArtifactError, Observer, Result};
use kpack_host::binary::{classify, Class};
use kpack_host::built_for::{built_for, built_without_note, BuiltFor};
use kpack_host::elf::FATBIN_SECTION;
use kpack_host::offload::verify_file;
use kpack_host::output;

#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// Verify recombined artifacts named after this config's groups.
    pub config: Option<PackagingConfig>,
    /// The database handlers split was given (`--split-databases`): a
    /// generic artifact must hold no file they claim. (Per-target
    /// artifacts are checked with every handler: a database file there
    /// must be of the artifact's own target.)
    pub databases: Vec<Database>,
    /// `--expect-targets`: targets each of which some artifact must serve
    /// code objects for ([`crate::expect`]); one missing is an error.
    pub expect_targets: Vec<String>,
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
    /// Code object indices not loaded for a target because their bundle
    /// was built without it (the binary records it: `kpack_co_targets`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The failure the problems make, if any ([`ArtifactError::VerifyFailed`]).
    pub fn check(&self) -> Result<()> {
        ArtifactError::verify_failed(self.problems.len())
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
    metadata: HipkMetadata,
    kernel_name: String,
    co_indices: Vec<u64>,
}

/// What a device artifact serves.
#[derive(Default)]
struct Served {
    /// Target -> kernel names (without `#N`) of its archives.
    names: BTreeMap<String, BTreeSet<String>>,
}

/// Problems (the artifacts are wrong) and warnings found so far.
#[derive(Default)]
struct Findings {
    problems: Vec<String>,
    warnings: Vec<String>,
    notes: Vec<String>,
}

/// The per-artifact checks' results, by component.
#[derive(Default)]
struct Checked {
    /// Component -> its generic artifact (index) and offloaded binaries.
    generics: BTreeMap<String, (usize, Vec<Binary>)>,
    /// Component -> its device artifacts (index) and what each serves.
    devices: BTreeMap<String, Vec<(usize, Served)>>,
}

/// Verify the artifacts in `dir`. The plan:
/// 1. leftovers of interrupted runs (warnings);
/// 2. the artifacts, their roles (from their names) and manifests;
/// 3. each artifact on its own: its layout, then the generic or device
///    checks;
/// 4. every component's artifacts fit together;
/// 5. every wrapper of every offloaded binary resolves through the loader,
///    with the generic artifact installed together with each device
///    artifact of its component.
pub fn verify_artifacts(
    dir: &Path,
    opts: &VerifyOptions,
    observer: &dyn Observer,
) -> Result<VerifyReport> {
    let mut report = VerifyReport {
        artifacts_dir: dir.display().to_string(),
        ..Default::default()
    };
    let mut found = Findings::default();
    check_leftovers(dir, &mut found)?;
    let artifacts = find_artifacts(dir, opts, &mut found)?;
    report.artifacts = artifacts.len();
    observer.note(&format!(
        "{}: {} artifact(s)",
        dir.display(),
        artifacts.len()
    ));
    let checked = check_each(&artifacts, opts, &mut report, &mut found);
    check_expected(&artifacts, &report, opts, dir)?;
    let components: BTreeSet<&String> = artifacts.iter().map(|a| &a.component).collect();
    report.components = components.len();
    check_components(&artifacts, &checked, &mut found);
    for (component, (gi, binaries)) in &checked.generics {
        if binaries.is_empty() {
            continue;
        }
        let Some(devs) = checked.devices.get(component) else {
            continue;
        };
        let g = &artifacts[*gi];
        resolve_component(
            component,
            g,
            binaries,
            devs,
            &artifacts,
            &mut report,
            &mut found,
        )?;
    }

    let Findings {
        mut problems,
        mut warnings,
        mut notes,
    } = found;
    notes.sort();
    notes.dedup();
    report.notes = notes;
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

/// Step 1: hidden `.kpack-*` entries are leftovers of interrupted runs (or
/// the staging directories of runs in progress): never artifacts.
fn check_leftovers(dir: &Path, found: &mut Findings) -> Result<()> {
    for e in fs::read_dir(dir).map_err(|e| ArtifactError::io(dir, e))? {
        let e = e.map_err(|e| ArtifactError::io(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(".kpack-") {
            continue;
        }
        let w = if output::in_use(&e.path()) {
            format!(
                "{}: staging directory of a kpack run in progress (not an artifact)",
                e.path().display()
            )
        } else {
            format!(
                "{}: leftover staging directory of an interrupted run (not an artifact; safe to delete)",
                e.path().display()
            )
        };
        found.warnings.push(w);
    }
    Ok(())
}

/// Step 2: the artifacts of `dir` with their roles and manifest prefixes;
/// directories whose name or manifest is wrong are problems.
fn find_artifacts(dir: &Path, opts: &VerifyOptions, found: &mut Findings) -> Result<Vec<Artifact>> {
    let mut artifacts = Vec::new();
    for (name, path) in super::manifest::subdirs(dir)? {
        let Some(parsed) = OutputName::parse(&name) else {
            found.problems.push(format!(
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
        let role = match role_of(&parsed.suffix, opts.config.as_ref()) {
            Ok(r) => r,
            Err(why) => {
                found.problems.push(format!("{}: {why}", path.display()));
                continue;
            }
        };
        let prefixes = match read_manifest(&path) {
            Ok(p) => p,
            Err(e) => {
                found.problems.push(e.to_string());
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
    Ok(artifacts)
}

/// An artifact's role from its name's suffix: generic, or a device artifact
/// of a target (split) or of a group of `config` (recombined).
fn role_of(suffix: &Suffix, config: Option<&PackagingConfig>) -> std::result::Result<Role, String> {
    match (suffix, config) {
        (Suffix::Generic, _) => Ok(Role::Generic),
        (Suffix::Target(t), None) => Ok(Role::Device(t.clone())),
        (Suffix::Target(g) | Suffix::Other(g), Some(c)) if c.group(g).is_some() => {
            Ok(Role::Device(g.clone()))
        }
        (Suffix::Target(s) | Suffix::Other(s), Some(_)) => Err(format!(
            "{s:?} is neither \"generic\" nor a group of the packaging config"
        )),
        (Suffix::Other(s), None) => Err(format!(
            "{s:?} is neither \"generic\" nor a target ID (recombined artifacts need --config)"
        )),
    }
}

/// `--expect-targets`: every target expected is served by an archive of
/// some artifact (a per-target artifact with database files only does not
/// count).
fn check_expected(
    artifacts: &[Artifact],
    report: &VerifyReport,
    opts: &VerifyOptions,
    dir: &Path,
) -> Result<()> {
    if opts.expect_targets.is_empty() {
        return Ok(());
    }
    let mut present = crate::expect::Present::default();
    for a in artifacts {
        if let Role::Device(what) = &a.role {
            present.add(what, false);
        }
    }
    for t in &report.targets {
        present.add(t, true);
    }
    crate::expect::check(&opts.expect_targets, &present, "artifact set", dir)
}

/// Step 3: the layout of every artifact, then the checks of its role.
fn check_each(
    artifacts: &[Artifact],
    opts: &VerifyOptions,
    report: &mut VerifyReport,
    found: &mut Findings,
) -> Checked {
    let mut checked = Checked::default();
    let mut targets: BTreeSet<String> = BTreeSet::new();
    for (i, a) in artifacts.iter().enumerate() {
        let Some(nodes) = layout(a, &mut found.problems) else {
            continue;
        };
        match &a.role {
            Role::Generic => {
                let binaries = check_generic(a, &nodes, &opts.databases, found);
                report.offloaded_binaries += binaries.len();
                checked.generics.insert(a.component.clone(), (i, binaries));
            }
            Role::Device(what) => {
                let allowed = |t: &str| match &opts.config {
                    None => t == what,
                    Some(c) => c.group(what).is_some_and(|g| g.contains(t)),
                };
                let served = check_device(a, &nodes, &allowed, report, found);
                targets.extend(served.names.keys().cloned());
                checked
                    .devices
                    .entry(a.component.clone())
                    .or_default()
                    .push((i, served));
            }
        }
    }
    report.targets = targets.into_iter().collect();
    checked
}

/// Step 4: no device artifact without its generic artifact, no offloaded
/// binary without a device artifact for its code objects.
fn check_components(artifacts: &[Artifact], checked: &Checked, found: &mut Findings) {
    for (component, devs) in &checked.devices {
        if !checked.generics.contains_key(component) {
            let names: Vec<&str> = devs
                .iter()
                .map(|(i, _)| artifacts[*i].name.as_str())
                .collect();
            found.problems.push(format!(
                "component {component}: {} without {component}_generic (an interrupted split?)",
                names.join(", ")
            ));
        }
    }
    for (component, (i, binaries)) in &checked.generics {
        if !binaries.is_empty() && !checked.devices.contains_key(component) {
            found.problems.push(format!(
                "{}: {} offloaded binar{} but no per-target artifact of component {component} holds their code objects",
                artifacts[*i].dir.display(),
                binaries.len(),
                if binaries.len() == 1 { "y" } else { "ies" }
            ));
        }
    }
}

/// Step 5 for one component: install its generic artifact `g` with each of
/// its device artifacts and load every wrapper of every binary for every
/// target served; a binary found in no device artifact is a problem.
fn resolve_component(
    component: &str,
    g: &Artifact,
    binaries: &[Binary],
    devs: &[(usize, Served)],
    artifacts: &[Artifact],
    report: &mut VerifyReport,
    found: &mut Findings,
) -> Result<()> {
    let mut found_anywhere: BTreeSet<String> = BTreeSet::new();
    for (di, served) in devs {
        let d = &artifacts[*di];
        let root = tempfile::Builder::new()
            .prefix(".kpack-verify-")
            .tempdir()
            .map_err(|e| ArtifactError::io(std::env::temp_dir(), e))?;
        if let Err(e) = install_links(&[g, d], root.path(), &mut found.problems) {
            found.problems.push(e.to_string());
            continue;
        }
        let mut tasks = Vec::new();
        for b in binaries {
            for (target, names) in &served.names {
                if names.contains(&b.kernel_name) {
                    found_anywhere.insert(b.kernel_name.clone());
                    tasks.extend(b.co_indices.iter().filter_map(|&co| {
                        match built_for(&b.metadata, co, &[target]) {
                            BuiltFor::NotInBundle => {
                                let note = built_without_note(co, target);
                                found.notes.push(format!("{}: {note}", b.shown));
                                None
                            }
                            _ => Some((b, target.as_str(), co)),
                        }
                    }));
                } else {
                    found.warnings.push(format!(
                        "{}: no code object for {target} in {} (built for fewer targets?)",
                        b.shown, d.name
                    ));
                }
            }
        }
        resolve_device(d, root.path(), &tasks, report, found);
    }
    for b in binaries {
        if !found_anywhere.contains(&b.kernel_name) {
            found.problems.push(format!(
                "{}: no archive of component {component} has code objects of {} (kernel name) for any target",
                b.shown, b.kernel_name
            ));
        }
    }
    Ok(())
}

/// One wrapper to load: the binary, the target, the code object index.
type Task<'b> = (&'b Binary, &'b str, u64);

/// Load every task through the loader in the tree `root` (the generic
/// artifact installed with the device artifact `d`); what does not load,
/// and code objects of another build ([`crate::build_match`]), are
/// problems.
fn resolve_device(
    d: &Artifact,
    root: &Path,
    tasks: &[Task],
    report: &mut VerifyReport,
    found: &mut Findings,
) {
    let loader = Loader::new(Config::default());
    let results: Vec<(std::result::Result<WrapperLoad, String>, Vec<OtherBuild>)> = tasks
        .par_iter()
        .map(|(b, target, co)| load_wrapper(&loader, root, b, target, *co, &d.name))
        .collect();
    report.wrappers_resolved += results.iter().filter(|(r, _)| r.is_ok()).count();
    let base = fs::canonicalize(&d.dir).unwrap_or_else(|_| d.dir.clone());
    // Per binary, one pass over its strings.
    let mut by_binary: BTreeMap<&str, (&Binary, Vec<LoadedCodeObject>)> = BTreeMap::new();
    for ((b, target, co), (r, others)) in tasks.iter().zip(results) {
        for o in others {
            let archive = o.archive.strip_prefix(&base).map_or_else(
                |_| o.archive.display().to_string(),
                |rel| format!("{}/{}", d.name, rel.display()),
            );
            found.problems.push(format!(
                "{}: code object {}#{co} for {target} (installed with {}) comes from another build: {} in {archive}",
                b.shown,
                b.kernel_name,
                d.name,
                o.builds()
            ));
        }
        match r {
            Ok(w) => by_binary
                .entry(&b.shown)
                .or_insert_with(|| (b, Vec::new()))
                .1
                .push((target, *co, w)),
            Err(problem) => found.problems.push(problem),
        }
    }
    for (b, cos) in by_binary.into_values() {
        found
            .problems
            .extend(foreign_code_objects(&root.join(&b.rel), b, &cos, &d.name));
    }
}

/// A code object loaded for a binary: (target, code object index, what
/// it is).
type LoadedCodeObject<'a> = (&'a str, u64, WrapperLoad);

/// What loading one wrapper gave.
struct WrapperLoad {
    /// The kernels it defines (none for a SPIR-V module).
    kernels: BTreeSet<String>,
    /// Its entry records the binary's own device digest.
    same_build: bool,
}

/// The problems of code objects of `b` (installed at `path`) none of
/// whose kernels `b` names: another build's, installed with `device`.
fn foreign_code_objects(
    path: &Path,
    b: &Binary,
    cos: &[LoadedCodeObject],
    device: &str,
) -> Vec<String> {
    let resolved: Vec<Resolved> = cos
        .iter()
        .map(|(_, _, w)| Resolved {
            kernels: &w.kernels,
            same_build: w.same_build,
        })
        .collect();
    if resolved
        .iter()
        .all(|r| r.same_build || r.kernels.is_empty())
    {
        return Vec::new();
    }
    let Ok(mapped) = map_file(path) else {
        return Vec::new();
    };
    let Ok(bin) = kpack_host::binary::HostBinary::parse(&mapped) else {
        return Vec::new();
    };
    let foreign = unnamed_only(&bin, &resolved);
    cos.iter()
        .zip(foreign)
        .filter(|(_, f)| *f)
        .filter_map(|((target, co, w), _)| {
            let first = w.kernels.first()?;
            Some(format!(
                "{}: code object {}#{co} for {target} (installed with {device}) comes from another build: the binary names none of its {} kernels (e.g. {first})",
                b.shown,
                b.kernel_name,
                w.kernels.len()
            ))
        })
        .collect()
}

/// Load code object `co` of binary `b` for `target` through the loader, in
/// the install tree `root` (where `device` was installed): the kernels it
/// defines, or the problem if it does not load or is not a code object
/// for the target; and the entries of another build passed over.
fn load_wrapper(
    loader: &Loader,
    root: &Path,
    b: &Binary,
    target: &str,
    co: u64,
    device: &str,
) -> (std::result::Result<WrapperLoad, String>, Vec<OtherBuild>) {
    let path = root.join(&b.rel);
    let Ok(co32) = u32::try_from(co) else {
        let e = format!(
            "{}: wrapper code object index {co} does not fit in u32",
            b.shown
        );
        return (Err(e), Vec::new());
    };
    let (r, trace) = loader.load_explained(&b.metadata, &path, co32, &[target]);
    let r = match r {
        Ok((bytes, hit)) => match kernels_of(&bytes, target) {
            Ok(kernels) => Ok(WrapperLoad {
                kernels,
                same_build: hit.same_build,
            }),
            Err(e @ NotCodeObject::Kind(_)) => Err(format!(
                "{}: code object {}#{co} for {target} (installed with {device}) {e}",
                b.shown, b.kernel_name
            )),
            Err(e) => Err(format!(
                "{}: code object {}#{co} for {target} (installed with {device}): {e}",
                b.shown, b.kernel_name
            )),
        },
        Err(e) => Err(format!(
            "{}: wrapper with co_index {co} does not resolve for {target} when installed with {device}: {e}",
            b.shown
        )),
    };
    (r, other_builds(&trace))
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

/// The checks of a generic artifact (every file, in parallel); returns its
/// offloaded binaries.
fn check_generic(
    a: &Artifact,
    nodes: &[(String, Node)],
    databases: &[Database],
    found: &mut Findings,
) -> Vec<Binary> {
    let files: Vec<&(String, Node)> = nodes
        .iter()
        .filter(|(_, n)| matches!(n.kind, NodeKind::File { .. }))
        .collect();
    let results: Vec<(Option<Binary>, Vec<String>)> = files
        .par_iter()
        .map(|(p, n)| check_generic_file(a, p, n, databases))
        .collect();
    let mut binaries = Vec::new();
    for (b, bad) in results {
        found.problems.extend(bad);
        if let Some(b) = &b {
            found.warnings.extend(hrx_metadata_warnings(b));
        }
        binaries.extend(b);
    }
    binaries
}

/// The limits of ROCm's HRX runtime an offloaded binary's metadata
/// exceeds: warnings (it is valid, and loads with kpack's runtime).
fn hrx_metadata_warnings(b: &Binary) -> Vec<String> {
    let targets = b.metadata.targets.as_ref().map_or(0, Vec::len);
    kpack_format::hrx::check_metadata(&b.metadata)
        .into_iter()
        .chain(kpack_format::hrx::check_archive_count(targets))
        .map(|e| format!("{}: {e}", b.shown))
        .collect()
}

/// One file of a generic artifact: no archive, no database file of the
/// handlers split used, no device code left; an offloaded binary must pass
/// the ELF verifier (and is returned).
fn check_generic_file(
    a: &Artifact,
    p: &str,
    n: &Node,
    databases: &[Database],
) -> (Option<Binary>, Vec<String>) {
    let path = a.dir.join(p).join(&n.rel);
    let shown = format!("{}/{p}/{}", a.name, n.rel.display());
    let mut bad = Vec::new();
    if let Some(c) = rel_string(&n.rel).and_then(|rel| databases::classify(databases, &rel)) {
        bad.push(format!(
            "{shown}: a database file of {} ({} handler) in a generic artifact (it belongs in {}_{})",
            c.base, c.handler, a.component, c.base
        ));
        return (None, bad);
    }
    let mapped = match map_file(&path) {
        Ok(m) => m,
        Err(e) => return (None, vec![e.to_string()]),
    };
    if mapped.starts_with(crate::archive::MAGIC) || path.extension().is_some_and(|e| e == "kpack") {
        bad.push(format!("{shown}: a .kpack archive in a generic artifact"));
        return (None, bad);
    }
    match classify(&mapped) {
        Class::Fat => {
            bad.push(format!(
                "{shown}: still carries device code (PROGBITS {FATBIN_SECTION}): not offloaded"
            ));
            return (None, bad);
        }
        Class::Offloaded | Class::Inconsistent(_) => {}
        // Debug-info files (TheRock's `*_dbg` artifacts) have no device
        // code to offload; anything else is not a binary to check.
        _ => return (None, bad),
    }
    drop(mapped);
    match verify_file(&path) {
        Ok(v) => {
            let b = Binary {
                rel: n.rel.clone(),
                shown,
                metadata: v.metadata.clone(),
                kernel_name: v.metadata.kernel_name.clone(),
                co_indices: v.co_indices.clone(),
            };
            (Some(b), bad)
        }
        Err(e) => {
            bad.push(format!(
                "{shown}: NOBITS {FATBIN_SECTION} but not a valid offloaded binary: {e}"
            ));
            (None, bad)
        }
    }
}

/// What one entry of a device artifact is.
struct Found {
    /// An archive that checked out: (gfx_arches, kernel names, code objects).
    archive: Option<(Vec<String>, BTreeSet<String>, usize)>,
    database: bool,
    bad: Vec<String>,
    /// The limits of ROCm's HRX runtime an archive exceeds.
    warnings: Vec<String>,
}

/// The checks of a device artifact (every entry, in parallel); returns what
/// it serves.
fn check_device(
    a: &Artifact,
    nodes: &[(String, Node)],
    allowed: &(dyn Fn(&str) -> bool + Sync),
    report: &mut VerifyReport,
    found: &mut Findings,
) -> Served {
    let mut served = Served::default();
    let entries: Vec<&(String, Node)> = nodes
        .iter()
        .filter(|(_, n)| !matches!(n.kind, NodeKind::Dir))
        .collect();
    let results: Vec<Found> = entries
        .par_iter()
        .map(|(p, n)| check_device_entry(a, p, n, allowed))
        .collect();
    for r in results {
        found.problems.extend(r.bad);
        found.warnings.extend(r.warnings);
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

/// One file or symlink of a device artifact: an archive of its own
/// target(s), or a database file of one; no host binary.
fn check_device_entry(
    a: &Artifact,
    p: &str,
    n: &Node,
    allowed: &(dyn Fn(&str) -> bool + Sync),
) -> Found {
    let path = a.dir.join(p).join(&n.rel);
    let shown = format!("{}/{p}/{}", a.name, n.rel.display());
    let rel = rel_string(&n.rel).unwrap_or_default();
    let name = n
        .rel
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut f = Found {
        archive: None,
        database: false,
        bad: Vec::new(),
        warnings: Vec::new(),
    };
    let is_file = matches!(n.kind, NodeKind::File { .. });
    if is_file && name.ends_with(".kpack") {
        match check_archive(&path, &shown, &a.component, &name, allowed) {
            Ok((x, warnings)) => {
                f.archive = Some(x);
                f.warnings = warnings;
            }
            Err(mut bad) => f.bad.append(&mut bad),
        }
        return f;
    }
    // A file a database handler claims is a database file, whatever it
    // holds (MIOpen's per-target CK libraries are host libraries): the
    // claim is checked before the host-binary rule. Database files are
    // keyed by their base target.
    let host_code = || is_file && map_file(&path).is_ok_and(|m| classify(&m).is_host_code());
    match databases::classify(&Database::ALL, &rel) {
        Some(c) if allowed(&c.base) => f.database = true,
        Some(c) => f.bad.push(format!(
            "{shown}: a database file of {} ({} handler, key {}), which does not belong in {}",
            c.base, c.handler, c.key, a.name
        )),
        None if host_code() => f.bad.push(format!(
            "{shown}: a host binary in a per-target artifact (only archives and database files belong there)"
        )),
        None => f.bad.push(format!(
            "{shown}: neither a .kpack archive nor a database file of a target: does not belong in a per-target artifact"
        )),
    }
    f
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
) -> std::result::Result<CheckedArchive, Vec<String>> {
    let archive = kpack_loader::open_archive(path).map_err(|e| vec![format!("{shown}: {e}")])?;
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
    let warnings = kpack_format::hrx::check_archive(&archive)
        .into_iter()
        .map(|e| format!("{shown}: {e}"))
        .collect();
    Ok(((arches, names, entries.len()), warnings))
}

/// An archive that checked out: (gfx_arches, kernel names, code objects),
/// and the limits of ROCm's HRX runtime it exceeds (warnings).
type CheckedArchive = ((Vec<String>, BTreeSet<String>, usize), Vec<String>);

/// Install `artifacts` into `root` the way a package does, flattening every
/// prefix of each into the root, with symlinks to the files instead of
/// copies. Two different files at one path are a problem.
fn install_links(artifacts: &[&Artifact], root: &Path, problems: &mut Vec<String>) -> Result<()> {
    let names: Vec<&str> = artifacts.iter().map(|a| a.name.as_str()).collect();
    let installing = names.join(" and ");
    // Where each installed file or symlink came from.
    let mut placed: BTreeMap<PathBuf, String> = BTreeMap::new();
    let origin = |placed: &BTreeMap<PathBuf, String>, rel: &Path| {
        placed
            .get(rel)
            .cloned()
            .unwrap_or_else(|| "another prefix".to_string())
    };
    for a in artifacts {
        for p in &a.prefixes {
            let src_root = a.dir.join(p);
            let from = format!("{}/{p}", a.name);
            // Directories that collided with a file or symlink: nothing
            // below them is installed (it would go through a symlink).
            let mut blocked: Vec<PathBuf> = Vec::new();
            for n in scan(&src_root)? {
                if blocked.iter().any(|b| n.rel.starts_with(b)) {
                    continue;
                }
                let dst = root.join(&n.rel);
                if n.kind == NodeKind::Dir {
                    if fs::symlink_metadata(&dst).is_ok_and(|m| !m.is_dir()) {
                        problems.push(format!(
                            "installing {installing}: {} is a directory in {from} but not in {}",
                            n.rel.display(),
                            origin(&placed, &n.rel)
                        ));
                        blocked.push(n.rel.clone());
                        continue;
                    }
                    make_dirs(&dst)?;
                    continue;
                }
                if dst.symlink_metadata().is_ok() {
                    problems.push(format!(
                        "installing {installing}: {} comes from both {} and {from}",
                        n.rel.display(),
                        origin(&placed, &n.rel)
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
                placed.insert(n.rel.clone(), from.clone());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::test_util::{killed_run_leftovers, small_artifact};
    use crate::artifact::{split_artifact, SplitOptions};
    use crate::Silent;
    use kpack_host::output::StagedDir;

    /// Hidden staging directories are never artifacts: those of killed runs
    /// are reported as leftovers, those of runs in progress as such.
    #[test]
    fn staging_directories_are_not_artifacts() {
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("in/blas_lib_x");
        small_artifact(&input, &["gfx1100"]);
        let out = t.path().join("out");
        let mut o = SplitOptions::new(&out);
        o.databases = vec![Database::Rocblas];
        split_artifact(&input, "blas_lib", &o, &Silent).unwrap();
        let live = StagedDir::in_dir(&out).unwrap();
        fs::create_dir(live.path().join("blas_lib_gfx942")).unwrap();
        killed_run_leftovers(&out);
        let r = verify_artifacts(&out, &VerifyOptions::default(), &Silent).unwrap();
        assert!(r.ok(), "{:?}", r.problems);
        assert_eq!(r.artifacts, 2);
        assert_eq!(r.database_files, 1);
        let leftovers = r.warnings.iter().filter(|w| w.contains("leftover staging"));
        assert_eq!(leftovers.count(), 2, "{:?}", r.warnings);
        let live_name = live.path().display().to_string();
        assert!(
            r.warnings
                .iter()
                .any(|w| w.starts_with(&live_name) && w.contains("in progress")),
            "{:?}",
            r.warnings
        );
    }
}
