//! `kpack split-wheels` (formats.md §8): a Python wheel whose package carries
//! HIP fat binaries (TheRock's PyTorch wheels) into
//!
//! - a **host wheel** of the same name: every fat binary under the overlay
//!   root offloaded (its kernel name its path below the overlay root, one
//!   search path `"../" * depth + ".kpack/<G>_@GFXARCH@.kpack"`), kernel
//!   database files removed, `METADATA` gaining `rocm-bootstrap` and one
//!   `device-<target>` extra per target plus `device-all`;
//! - one **device wheel** per bundle key (target, or sub-family/family for
//!   AOTriton's shared images), `<prefix>-<key>`, holding
//!   `<overlay>/.kpack/<G>_<target>.kpack` for every target it owns and its
//!   database files at their paths;
//! - optionally a PEP 817 **variant wheel** (`--generate-variant-wheel`),
//!   or, with [`VariantFormat::Pep825`], one PEP 825 variant wheel per
//!   target and the index's `<name>-<version>-variants.json`.
//!
//! The steps, in order ([`split_wheel`]): unpack the input into a scratch
//! directory (a `.whl`; a directory is read in place and never written),
//! read its identity ([`identity`]), scan the overlay for fat binaries
//! ([`kpack_host::binary::classify`]) and database files
//! ([`crate::artifact::databases`]), offload the fat binaries and write one
//! archive per target (the engine split and pack-tree use), group targets
//! into bundles ([`bootstrap`]: rocm-bootstrap 0.3.0's tables), list the
//! members of every output wheel and check the device payloads, write the
//! outputs ([`zipio`], in parallel) into a hidden staging directory of the
//! output directory, and rename them into place together. Bad input fails
//! before anything is renamed, and the scratch and staging directories go
//! away with the run, so the output directory holds complete outputs or
//! nothing new.
//!
//! Binaries are handled only through [`kpack_host::binary`] and
//! [`kpack_host::offload`], whatever their container.

pub mod bootstrap;
pub mod identity;
mod members;
pub mod metadata;
pub(crate) mod zipio;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::archive::{Scheme, DEFAULT_ZSTD_LEVEL};
use crate::databases::{classify as claim_database, Database};
use crate::input::map_file;
use crate::pack::search_path;
use crate::pack::{FileJob, Offloaded, Outcome, Packer};
use crate::target::normalize_feature_spelling;
use crate::tree::{rel_string, scan, Node, NodeKind};
use crate::{ArtifactError, Observer};
use kpack_host::binary::{as_is_note, classify_parsed, could_be_binary, no_device_code, Class};
use kpack_host::offload::archive_file_name;
use kpack_host::output::ScratchDir;

pub use bootstrap::{Bundle, Level};
pub use identity::Identity;
use members::Outputs;

/// The wheel types (`--wheel-type`) and the database handlers each enables.
pub(crate) const WHEEL_TYPES: &[(&str, &[&str])] = &[(
    "torch-fat",
    &["rocblas", "hipblaslt", "hipsparselt", "aotriton", "miopen"],
)];

/// The database handlers of a wheel type.
pub fn wheel_type_databases(wheel_type: &str) -> Result<Vec<Database>> {
    let (_, names) = WHEEL_TYPES
        .iter()
        .find(|(n, _)| *n == wheel_type)
        .ok_or_else(|| WheelError::UnknownWheelType {
            name: wheel_type.to_string(),
        })?;
    Ok(Database::parse_list(names)?)
}

/// The database handlers of a split: `databases` when given (even empty:
/// none), else the `wheel_type` preset, else none. A wheel type is checked
/// even when `databases` replaces it; a bad name is an error about
/// `wheel`, the (first) input, before anything is read.
pub fn databases_for(
    wheel: &Path,
    wheel_type: Option<&str>,
    databases: Option<&[String]>,
) -> Result<Vec<Database>> {
    let named = |e: &dyn std::fmt::Display| WheelError::invalid(wheel, e.to_string());
    if let Some(t) = wheel_type {
        wheel_type_databases(t).map_err(|e| named(&e))?;
    }
    match (databases, wheel_type) {
        (Some(names), _) => Database::parse_list(names).map_err(|e| named(&e)),
        (None, Some(t)) => wheel_type_databases(t),
        (None, None) => Ok(Vec::new()),
    }
}

/// The label of the upstream-format variant wheel unless one is given.
pub const DEFAULT_VARIANT_LABEL: &str = "variant";

/// The summaries of one run, as `--json` gives them: one wheel's summary
/// alone, several as a list.
pub struct Summaries<'a>(pub &'a [WheelSummary]);

impl Serialize for Summaries<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self.0 {
            [one] => one.serialize(s),
            all => all.serialize(s),
        }
    }
}

/// What to write: wheel files or unpacked trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    Wheel,
    Directory,
}

impl OutputFormat {
    /// The format named `name` (`--output-format`): `wheel`, `directory`.
    pub fn from_name(name: &str) -> Result<OutputFormat> {
        match name {
            "wheel" => Ok(OutputFormat::Wheel),
            "directory" => Ok(OutputFormat::Directory),
            _ => Err(ArtifactError::BadOption {
                option: "output format",
                what: format!("unknown format {name:?} (known: wheel, directory)"),
            }
            .into()),
        }
    }
}

/// The format of the variant wheels (`--variant-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VariantFormat {
    /// Upstream's (PEP 817 draft): one variant wheel holding every target's
    /// variant.
    #[default]
    Upstream,
    /// PEP 825 (schema v0.1.1): one variant wheel per target, labelled by
    /// it, and the index file `<name>-<version>-variants.json`.
    Pep825,
}

/// How to split.
#[derive(Debug, Clone)]
pub struct SplitWheelOptions {
    pub output_dir: PathBuf,
    /// Distribution-name prefix of the device wheels (`amd-torch-device`).
    pub device_package_prefix: String,
    /// The directory in the wheel that gets `.kpack/` (`torch/`); `/` at
    /// either end is ignored.
    pub overlay_root: String,
    /// More `Requires-Dist` values of device wheels; `@GFXARCH@` stands for
    /// the bundle key (kept only in target-level wheels).
    pub device_requires_dist: Vec<String>,
    pub databases: Vec<Database>,
    pub scheme: Scheme,
    pub level: i32,
    pub output_format: OutputFormat,
    /// Also write the PEP 817 variant wheel, with this label (upstream
    /// format; PEP 825 wheels are labelled by their target).
    pub variant_label: Option<String>,
    pub variant_format: VariantFormat,
    /// Scratch space (default: the output directory).
    pub tmp_dir: Option<PathBuf>,
    /// `--expect-targets`: targets each of which must have code objects in
    /// the wheel (checked per wheel, before any output of it is written;
    /// [`crate::expect`]).
    pub expect_targets: Vec<String>,
}

impl SplitWheelOptions {
    pub fn new(
        output_dir: impl Into<PathBuf>,
        device_package_prefix: impl Into<String>,
        overlay_root: impl Into<String>,
    ) -> Self {
        SplitWheelOptions {
            output_dir: output_dir.into(),
            device_package_prefix: device_package_prefix.into(),
            overlay_root: overlay_root.into(),
            device_requires_dist: Vec::new(),
            databases: Vec::new(),
            scheme: Scheme::ZstdPerKernel,
            level: DEFAULT_ZSTD_LEVEL,
            output_format: OutputFormat::Wheel,
            variant_label: None,
            variant_format: VariantFormat::Upstream,
            tmp_dir: None,
            expect_targets: Vec::new(),
        }
    }

    fn overlay(&self) -> &str {
        self.overlay_root.trim_matches('/')
    }
}

/// One output wheel.
#[derive(Debug, Clone, Serialize)]
pub struct WheelOutput {
    pub path: String,
    pub files: usize,
    /// Bytes of the files in it.
    pub bytes: u64,
    /// Size of the wheel file (directory output: the files' sizes).
    pub size: u64,
}

/// One device wheel.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceOutput {
    pub bundle_key: String,
    pub level: Level,
    pub dist_name: String,
    /// Whether rocm-bootstrap 0.3.0 knows the bundle key.
    pub known: bool,
    pub archives: Vec<String>,
    pub database_files: usize,
    #[serde(flatten)]
    pub wheel: WheelOutput,
}

/// One PEP 825 variant wheel.
#[derive(Debug, Clone, Serialize)]
pub struct VariantOutput {
    pub label: String,
    #[serde(flatten)]
    pub wheel: WheelOutput,
}

/// What split-wheels did (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct WheelSummary {
    pub input: String,
    pub name: String,
    pub version: String,
    pub fat_binaries: usize,
    pub code_objects: usize,
    pub database_files: usize,
    /// Every target found (archives and database files), sorted.
    pub architectures: Vec<String>,
    pub host: WheelOutput,
    /// The upstream-format variant wheel.
    pub variant: Option<WheelOutput>,
    /// The PEP 825 variant wheels, by label.
    pub variants: Vec<VariantOutput>,
    /// The PEP 825 index file `<name>-<version>-variants.json`.
    pub variants_index: Option<String>,
    pub devices: Vec<DeviceOutput>,
    /// Files of the wheel that are binaries without device code.
    pub notes: Vec<String>,
    pub warnings: Vec<String>,
    pub seconds: f64,
}

/// What went wrong. Every message names the input wheel (or the file) and
/// the problem.
#[derive(Debug, thiserror::Error)]
pub enum WheelError {
    #[error("{}: {what}", wheel.display())]
    Invalid { wheel: PathBuf, what: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unknown wheel type {name:?} (known: {})", WHEEL_TYPES.iter().map(|t| t.0).collect::<Vec<_>>().join(", "))]
    UnknownWheelType { name: String },
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Core(#[from] kpack_host::Error),
}

impl WheelError {
    pub(crate) fn invalid(wheel: &Path, what: impl Into<String>) -> Self {
        WheelError::Invalid {
            wheel: wheel.to_path_buf(),
            what: what.into(),
        }
    }

    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        WheelError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

pub type Result<T, E = WheelError> = std::result::Result<T, E>;

/// The input wheel, unpacked.
struct Input {
    /// As given (for messages).
    path: PathBuf,
    /// The unpacked tree.
    root: PathBuf,
    /// The wheel file's name (`None` for a directory).
    file_name: Option<String>,
}

impl Input {
    /// An error about a file of the unpacked tree: named by its path in
    /// the wheel.
    fn member_error(&self, e: impl std::fmt::Display) -> WheelError {
        let root = format!("{}/", self.root.display());
        WheelError::invalid(&self.path, e.to_string().replace(&root, ""))
    }
}

/// The files of the wheel and what they are.
struct Scan {
    nodes: Vec<Node>,
    /// Wheel-relative paths of the fat binaries under the overlay.
    fat: BTreeSet<String>,
    /// Wheel-relative path → target of every database file under the
    /// overlay.
    databases: BTreeMap<String, String>,
    /// One per binary under the overlay that carries no device code.
    notes: Vec<String>,
}

/// Split the wheel `input` (a `.whl` or an unpacked wheel directory).
pub fn split_wheel(
    input: &Path,
    opts: &SplitWheelOptions,
    observer: &dyn Observer,
) -> Result<WheelSummary> {
    let start = Instant::now();
    check_input(input, opts)?;
    crate::expect::parse(&opts.expect_targets)?;
    fs::create_dir_all(&opts.output_dir).map_err(|e| WheelError::io(&opts.output_dir, e))?;
    let scratch = ScratchDir::new(opts.tmp_dir.as_deref().unwrap_or(&opts.output_dir))?;
    let input = unpack(input, scratch.path(), observer)?;
    let id = identity::read(&input.path, &input.root)?;
    observer.note(&format!("wheel {} {} ({})", id.name, id.version, id.tag()));
    let scan = scan_wheel(&input, opts, observer)?;
    check_expected(&input, &scan, opts)?;
    let offloaded = offload(&input, &id, &scan, opts, scratch.path(), observer)?;
    let outputs = Outputs::plan(
        &input,
        &id,
        &scan,
        &offloaded,
        opts,
        scratch.path(),
        observer,
    )?;
    let mut summary = outputs.write(opts, observer)?;
    summary.input = input.path.display().to_string();
    summary.seconds = start.elapsed().as_secs_f64();
    Ok(summary)
}

/// The wheels of the inputs given (`--input`, repeatable), in order: a
/// `.whl` file or an unpacked wheel directory (one with a `*.dist-info` at
/// its top) as it is; another directory stands for the `*.whl` files in it,
/// in name order (none is an error). The same wheel twice, or two wheels of
/// one name and version (whose outputs would replace each other), is an
/// error.
pub fn wheel_inputs(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut wheels = Vec::new();
    for input in inputs {
        if !input.is_dir() || has_dist_info(input) {
            wheels.push(input.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = fs::read_dir(input)
            .map_err(|e| WheelError::io(input, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "whl"))
            .collect();
        if found.is_empty() {
            return Err(WheelError::invalid(
                input,
                "neither an unpacked wheel (no *.dist-info) nor a directory of wheels (no *.whl)",
            ));
        }
        found.sort();
        wheels.extend(found);
    }
    let mut seen: BTreeMap<String, &Path> = BTreeMap::new();
    for w in &wheels {
        let canon = fs::canonicalize(w).unwrap_or_else(|_| w.clone());
        let keys = [
            canon.display().to_string(),
            wheel_key(w).unwrap_or_default(),
        ];
        for key in keys.into_iter().filter(|k| !k.is_empty()) {
            if let Some(other) = seen.insert(key, w) {
                return Err(WheelError::invalid(
                    w,
                    format!(
                        "given twice, or the same name, version and tags as {}: their outputs would replace each other",
                        other.display()
                    ),
                ));
            }
        }
    }
    Ok(wheels)
}

fn has_dist_info(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|rd| {
        rd.filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().ends_with(".dist-info"))
    })
}

/// `<name>-<version>-<tags>` of a wheel file's name, or of an unpacked
/// wheel (its `*.dist-info` and the first `Tag` of its `WHEEL`), the name
/// normalized (lower case, `-` and `.` → `_`): wheels with the same key
/// have outputs of the same names.
fn wheel_key(wheel: &Path) -> Option<String> {
    let stem = if wheel.is_dir() {
        let di = dist_info_name(wheel)?;
        let text = fs::read_to_string(wheel.join(format!("{di}.dist-info/WHEEL"))).ok()?;
        format!("{di}-{}", identity::header(&text, "Tag")?)
    } else {
        wheel.file_stem()?.to_string_lossy().into_owned()
    };
    let (name, rest) = stem.split_once('-')?;
    Some(format!("{}-{rest}", normalized_name(name)))
}

/// The `*.dist-info` of an unpacked wheel, without the suffix.
fn dist_info_name(dir: &Path) -> Option<String> {
    fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find_map(|n| n.strip_suffix(".dist-info").map(str::to_string))
}

fn normalized_name(name: &str) -> String {
    name.to_lowercase().replace(['-', '.'], "_")
}

/// The distribution name of a wheel (file name or `*.dist-info`),
/// normalized.
fn wheel_name(wheel: &Path) -> Option<String> {
    let stem = if wheel.is_dir() {
        dist_info_name(wheel)?
    } else {
        wheel.file_stem()?.to_string_lossy().into_owned()
    };
    Some(normalized_name(stem.split('-').next()?))
}

/// What `@NAME@` in `--device-package-prefix` and `--overlay-root` stands
/// for, so that one run splits wheels of several distributions
/// (`amd-@NAME@-device`, `@NAME@/`).
pub const NAME_PLACEHOLDER: &str = "@NAME@";

/// The options for one wheel of a run: `@NAME@` replaced by its name
/// (`_` → `-` in the prefix, as distribution names are written).
fn options_for(wheel: &Path, opts: &SplitWheelOptions) -> SplitWheelOptions {
    let mut o = opts.clone();
    if let Some(name) = wheel_name(wheel) {
        o.device_package_prefix = o
            .device_package_prefix
            .replace(NAME_PLACEHOLDER, &name.replace('_', "-"));
        o.overlay_root = o.overlay_root.replace(NAME_PLACEHOLDER, &name);
    }
    o
}

/// Split several wheels in one run: each exactly as [`split_wheel`] alone
/// would (same outputs, same summary), one after the other, each using the
/// whole thread pool, so that memory stays that of the largest split.
/// Every input is checked first; the run stops at the first wheel that
/// fails (the outputs of the wheels before it are complete and stay).
pub fn split_wheels(
    inputs: &[PathBuf],
    opts: &SplitWheelOptions,
    observer: &dyn Observer,
) -> Result<Vec<WheelSummary>> {
    let wheels = wheel_inputs(inputs)?;
    for w in &wheels {
        check_input(w, opts)?;
    }
    // Device wheels are named by the prefix: wheels of several
    // distributions need one prefix each.
    let names: BTreeSet<String> = wheels.iter().filter_map(|w| wheel_name(w)).collect();
    if names.len() > 1 && !opts.device_package_prefix.contains(NAME_PLACEHOLDER) {
        return Err(WheelError::invalid(
            &wheels[0],
            format!(
                "wheels of several distributions ({}) would get device wheels of the same names: put {NAME_PLACEHOLDER} in --device-package-prefix (e.g. amd-{NAME_PLACEHOLDER}-device)",
                names.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    wheels
        .iter()
        .map(|w| split_wheel(w, &options_for(w, opts), observer))
        .collect()
}

/// Step 0: the input exists and is a `.whl` or a directory; the output
/// directory is not inside an input directory.
fn check_input(input: &Path, opts: &SplitWheelOptions) -> Result<()> {
    let meta = fs::metadata(input).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => WheelError::invalid(input, "input does not exist"),
        _ => WheelError::io(input, e),
    })?;
    if meta.is_dir() {
        let canon = fs::canonicalize(input).map_err(|e| WheelError::io(input, e))?;
        let out = std::path::absolute(&opts.output_dir)
            .map_err(|e| WheelError::io(&opts.output_dir, e))?;
        let out = fs::canonicalize(&out).unwrap_or(out);
        if out.starts_with(&canon) {
            return Err(WheelError::invalid(
                input,
                format!(
                    "the output directory {} lies inside the input wheel",
                    opts.output_dir.display()
                ),
            ));
        }
        return Ok(());
    }
    if input.extension().is_none_or(|e| e != "whl") {
        return Err(WheelError::invalid(
            input,
            "not a wheel: the input must be a .whl file or an unpacked wheel directory",
        ));
    }
    Ok(())
}

/// Step 1: a `.whl` unpacked into the scratch directory; a directory as it
/// is.
fn unpack(path: &Path, scratch: &Path, observer: &dyn Observer) -> Result<Input> {
    if path.is_dir() {
        return Ok(Input {
            path: path.to_path_buf(),
            root: fs::canonicalize(path).map_err(|e| WheelError::io(path, e))?,
            file_name: None,
        });
    }
    let root = scratch.join("wheel");
    fs::create_dir(&root).map_err(|e| WheelError::io(&root, e))?;
    observer.note(&format!("unpacking {}", path.display()));
    zipio::extract(path, &root, observer)?;
    Ok(Input {
        path: path.to_path_buf(),
        root,
        file_name: path.file_name().map(|n| n.to_string_lossy().into_owned()),
    })
}

/// Step 2: every file of the wheel; below the overlay, the fat binaries
/// (any name) and the files a database handler claims for a target.
fn scan_wheel(input: &Input, opts: &SplitWheelOptions, observer: &dyn Observer) -> Result<Scan> {
    let overlay = opts.overlay();
    let overlay_dir = input.root.join(overlay);
    if !overlay_dir.is_dir() {
        return Err(WheelError::invalid(
            &input.path,
            format!("overlay root '{overlay}' does not exist in the wheel"),
        ));
    }
    let nodes = scan(&input.root).map_err(|e| input.member_error(e))?;
    let prefix = overlay_prefix(overlay);
    let mut files = Vec::new();
    for n in &nodes {
        let rel = rel_string(&n.rel).ok_or_else(|| {
            input.member_error(format!("{}: file name is not UTF-8", n.rel.display()))
        })?;
        if matches!(n.kind, NodeKind::File { .. }) && rel.starts_with(&prefix) {
            files.push(rel);
        }
    }
    let probes: Vec<Probe> = files
        .par_iter()
        .map(|rel| probe(input, rel, observer))
        .collect::<Result<_>>()?;
    let mut fat = BTreeSet::new();
    let mut notes = Vec::new();
    let mut binaries = 0;
    for (rel, p) in files.iter().zip(probes) {
        match p {
            Probe::Fat => {
                fat.insert(rel.clone());
            }
            Probe::AsIs(note) => {
                let note = format!(
                    "{}: {rel}: {note}: stays in the host wheel as it is",
                    input.path.display()
                );
                observer.note(&note);
                notes.push(note);
                binaries += 1;
            }
            Probe::Binary => binaries += 1,
            Probe::Other => {}
        }
    }
    if fat.is_empty() && notes.is_empty() && binaries == 0 {
        return Err(WheelError::invalid(
            &input.path,
            format!("no fat binaries found under {overlay}/: no binaries at all (a pure-Python wheel?), nothing to split"),
        ));
    }
    let mut databases = BTreeMap::new();
    for rel in &files {
        if let Some(claim) = claim_database(&opts.databases, &rel[prefix.len()..]) {
            databases.insert(rel.clone(), normalize_feature_spelling(&claim.key));
        }
    }
    observer.note(&format!(
        "{} fat binaries and {} database files under {overlay}/",
        fat.len(),
        databases.len()
    ));
    Ok(Scan {
        nodes,
        fat,
        databases,
        notes,
    })
}

/// `--expect-targets`: every target expected has code objects in the
/// wheel's fat binaries, before anything of it is written.
fn check_expected(input: &Input, scan: &Scan, opts: &SplitWheelOptions) -> Result<()> {
    if opts.expect_targets.is_empty() {
        return Ok(());
    }
    let mut present = crate::expect::Present::default();
    for rel in &scan.fat {
        let path = input.root.join(rel);
        present
            .add_binary(&path)
            .map_err(|e| input.member_error(e))?;
    }
    for key in scan.databases.values() {
        present.add(key, false);
    }
    crate::expect::check(
        &opts.expect_targets,
        &present,
        "device wheel set",
        &input.path,
    )?;
    Ok(())
}

/// `overlay/` (empty for the wheel's root).
fn overlay_prefix(overlay: &str) -> String {
    if overlay.is_empty() {
        String::new()
    } else {
        format!("{overlay}/")
    }
}

/// The permission bits of a file (`st_mode & 0o7777`).
fn permission_bits(meta: &fs::Metadata) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777
}

/// What a file under the overlay is, for splitting.
enum Probe {
    Fat,
    /// A binary left as it is although device code could be in it
    /// (offloaded already, debug info, an empty `.hip_fatbin`...), and
    /// what every command says about it ([`as_is_note`]).
    AsIs(String),
    /// Another binary or link input.
    Binary,
    Other,
}

/// What the file at `rel` is. (A binary whose device-code parts
/// contradict each other is left as it is, with a warning.)
fn probe(input: &Input, rel: &str, observer: &dyn Observer) -> Result<Probe> {
    let path = input.root.join(rel);
    let mut head = [0u8; 8];
    let n = fs::File::open(&path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| input.member_error(WheelError::io(&path, e)))?;
    if !could_be_binary(&head[..n]) {
        return Ok(Probe::Other);
    }
    let map = map_file(&path).map_err(|e| input.member_error(e))?;
    let classified = classify_parsed(&map);
    if let Some(note) = as_is_note(&classified) {
        return Ok(Probe::AsIs(note));
    }
    Ok(match classified.class {
        Class::Fat => Probe::Fat,
        Class::HostOnly => match classified.binary.as_ref().ok().and_then(no_device_code) {
            Some(why) => Probe::AsIs(format!("no device code ({why})")),
            None => Probe::Binary,
        },
        Class::Inconsistent(why) => {
            observer.warn(&format!(
                "{}: {rel}: {why}: left as it is",
                input.path.display()
            ));
            Probe::Binary
        }
        c if c.is_host_code() => Probe::Binary,
        _ => Probe::Other,
    })
}

/// Step 3's result: the offloaded binaries and the archives.
pub(crate) struct Offload {
    /// Target → archive file (in the scratch directory) and code objects.
    pub archives: BTreeMap<String, (PathBuf, usize)>,
    pub code_objects: usize,
}

/// Step 3: offload every fat binary (its host form into the scratch
/// directory) and write one archive per target.
fn offload(
    input: &Input,
    id: &Identity,
    scan: &Scan,
    opts: &SplitWheelOptions,
    scratch: &Path,
    observer: &dyn Observer,
) -> Result<Offload> {
    let prefix = overlay_prefix(opts.overlay());
    let group = id.group();
    let jobs = offload_jobs(input, scan, &prefix, &group, &scratch.join("host"))?;
    let spill = scratch.join("spill");
    fs::create_dir_all(&spill).map_err(|e| WheelError::io(&spill, e))?;
    let packer = Packer {
        scheme: opts.scheme,
        level: opts.level,
        scratch: &spill,
        observer,
        keep_target: None,
    };
    observer.add_work(jobs.iter().map(|j| j.size).sum());
    let done = packer.run(&jobs).map_err(|e| input.member_error(e))?;
    let binaries: Vec<&Offloaded> = done
        .iter()
        .filter_map(|d| match &d.outcome {
            Outcome::Offloaded(b) => Some(b.as_ref()),
            _ => None,
        })
        .collect();
    let archive_dir = scratch.join("archives");
    write_archives(input, &packer, &binaries, &group, &prefix, &archive_dir)
}

/// One offload job per fat binary: its host form goes to the same path
/// below `host_dir`, its kernel name is its path below the overlay.
fn offload_jobs(
    input: &Input,
    scan: &Scan,
    prefix: &str,
    group: &str,
    host_dir: &Path,
) -> Result<Vec<FileJob>> {
    scan.fat
        .iter()
        .map(|rel| {
            let below = &rel[prefix.len()..];
            let src = input.root.join(rel);
            let meta = fs::metadata(&src).map_err(|e| WheelError::io(&src, e))?;
            Ok(FileJob {
                src,
                size: meta.len(),
                mode: permission_bits(&meta),
                dst: host_dir.join(rel),
                kernel_name: Some(below.to_string()),
                search_path: search_path(below, group),
                source_prefix: None,
                database: None,
            })
        })
        .collect()
}

/// Write one archive per target of `binaries` into `archive_dir`, named
/// for the wheel's `<overlay>/.kpack/`.
fn write_archives(
    input: &Input,
    packer: &Packer,
    binaries: &[&Offloaded],
    group: &str,
    prefix: &str,
    archive_dir: &Path,
) -> Result<Offload> {
    let place = |target: &str, _: &[String]| {
        let name = archive_file_name(group, target);
        (archive_dir.join(&name), format!("{prefix}.kpack/{name}"))
    };
    let family = |target: &str| target.to_string();
    let infos = packer
        .write_archives(binaries, group, &family, &place)
        .map_err(|e| input.member_error(e))?;
    let code_objects = binaries.iter().map(|b| b.code_objects.len()).sum();
    let archives = infos
        .into_iter()
        .map(|a| (a.target.clone(), (place(&a.target, &[]).0, a.code_objects)))
        .collect();
    Ok(Offload {
        archives,
        code_objects,
    })
}
