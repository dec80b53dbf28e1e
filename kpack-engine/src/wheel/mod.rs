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
//! - optionally a PEP 817 **variant wheel** (`--generate-variant-wheel`).
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
use kpack_host::binary::{classify, could_be_binary, Class};
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

/// What to write: wheel files or unpacked trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    Wheel,
    Directory,
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
    /// Also write the PEP 817 variant wheel, with this label.
    pub variant_label: Option<String>,
    /// Scratch space (default: the output directory).
    pub tmp_dir: Option<PathBuf>,
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
            tmp_dir: None,
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
    pub variant: Option<WheelOutput>,
    pub devices: Vec<DeviceOutput>,
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
}

/// Split the wheel `input` (a `.whl` or an unpacked wheel directory).
pub fn split_wheel(
    input: &Path,
    opts: &SplitWheelOptions,
    observer: &dyn Observer,
) -> Result<WheelSummary> {
    let start = Instant::now();
    check_input(input, opts)?;
    fs::create_dir_all(&opts.output_dir).map_err(|e| WheelError::io(&opts.output_dir, e))?;
    let scratch = ScratchDir::new(opts.tmp_dir.as_deref().unwrap_or(&opts.output_dir))?;
    let input = unpack(input, scratch.path(), observer)?;
    let id = identity::read(&input.path, &input.root)?;
    observer.note(&format!("wheel {} {} ({})", id.name, id.version, id.tag()));
    let scan = scan_wheel(&input, opts, observer)?;
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
    let fat: Vec<Option<String>> = files
        .par_iter()
        .map(|rel| is_fat(input, rel, observer).map(|f| f.then(|| rel.clone())))
        .collect::<Result<_>>()?;
    let fat: BTreeSet<String> = fat.into_iter().flatten().collect();
    if fat.is_empty() {
        return Err(WheelError::invalid(
            &input.path,
            format!("no fat binaries found under {overlay}/"),
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
    })
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

/// Is the file at `rel` a fat binary? (A binary whose device-code parts
/// contradict each other is left as it is, with a warning.)
fn is_fat(input: &Input, rel: &str, observer: &dyn Observer) -> Result<bool> {
    let path = input.root.join(rel);
    let mut head = [0u8; 8];
    let n = fs::File::open(&path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| input.member_error(WheelError::io(&path, e)))?;
    if !could_be_binary(&head[..n]) {
        return Ok(false);
    }
    let map = map_file(&path).map_err(|e| input.member_error(e))?;
    Ok(match classify(&map) {
        Class::Fat => true,
        Class::Inconsistent(why) => {
            observer.warn(&format!(
                "{}: {rel}: {why}: left as it is",
                input.path.display()
            ));
            false
        }
        _ => false,
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
