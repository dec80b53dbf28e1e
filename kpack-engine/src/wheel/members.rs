//! Steps 4 to 6 of [`split_wheel`](super::split_wheel): the bundles, the
//! members of every output wheel (with the device payloads checked), and
//! writing and committing the outputs.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::bootstrap::{self, Bundle};
use super::metadata::{self, Devices};
use super::zipio::{self, sort_members, Member, Written};
use super::{
    overlay_prefix, permission_bits, DeviceOutput, Identity, Input, Offload, OutputFormat, Result,
    Scan, SplitWheelOptions, VariantFormat, VariantOutput, WheelError, WheelOutput, WheelSummary,
};
use crate::tree::{rel_string, same_bytes, Node, NodeKind};
use crate::Observer;
use kpack_host::output::StagedDir;

/// What planning the outputs reads: the input, its identity, scan and
/// offload, and the options.
#[derive(Clone, Copy)]
struct Plan<'a> {
    input: &'a Input,
    id: &'a Identity,
    scan: &'a Scan,
    offload: &'a Offload,
    opts: &'a SplitWheelOptions,
}

/// One output wheel before it is written.
struct Output {
    /// The wheel file's name (`.whl`).
    file_name: String,
    dist_info: String,
    members: Vec<Member>,
}

impl Output {
    /// The name in the output directory (without `.whl` for directory
    /// output).
    fn entry_name(&self, format: OutputFormat) -> String {
        match format {
            OutputFormat::Wheel => self.file_name.clone(),
            OutputFormat::Directory => self.file_name.trim_end_matches(".whl").to_string(),
        }
    }

    /// Write this output into the directory `dir`, as `format` says.
    fn write(&self, dir: &Path, format: OutputFormat, observer: &dyn Observer) -> Result<Written> {
        let path = dir.join(self.entry_name(format));
        observer.note(&format!("writing {}", self.entry_name(format)));
        match format {
            OutputFormat::Wheel => {
                zipio::write_wheel(&path, &self.members, &self.dist_info, observer)
            }
            OutputFormat::Directory => {
                zipio::write_directory(&path, &self.members, &self.dist_info, observer)
            }
        }
    }

    /// What the summary says about this output, once written.
    fn summary(&self, written: &Written, opts: &SplitWheelOptions) -> WheelOutput {
        WheelOutput {
            path: opts
                .output_dir
                .join(self.entry_name(opts.output_format))
                .display()
                .to_string(),
            files: written.files,
            bytes: written.bytes_in,
            size: written.bytes_out,
        }
    }
}

struct Device {
    bundle: Bundle,
    archives: Vec<String>,
    database_files: usize,
    output: Output,
}

impl Device {
    /// What the summary says about this device wheel, once written.
    fn summary(&self, written: &Written, opts: &SplitWheelOptions) -> DeviceOutput {
        DeviceOutput {
            bundle_key: self.bundle.key.clone(),
            level: self.bundle.level,
            dist_name: bootstrap::device_dist_name(&opts.device_package_prefix, &self.bundle.key),
            known: self.bundle.known,
            archives: self.archives.clone(),
            database_files: self.database_files,
            wheel: self.output.summary(written, opts),
        }
    }
}

/// The PEP 825 index file: its name and content.
type Index = (String, String);

/// Every output of a split, ready to write.
pub(super) struct Outputs {
    id: Identity,
    fat_binaries: usize,
    code_objects: usize,
    database_files: usize,
    architectures: Vec<String>,
    host: Output,
    variant: Option<Output>,
    /// PEP 825 variant wheels, by label.
    variants: Vec<(String, Output)>,
    index: Option<Index>,
    devices: Vec<Device>,
    notes: Vec<String>,
    warnings: Vec<String>,
}

impl Outputs {
    /// Steps 4 and 5: bundles and members.
    pub fn plan(
        input: &Input,
        id: &Identity,
        scan: &Scan,
        offload: &Offload,
        opts: &SplitWheelOptions,
        scratch: &Path,
        observer: &dyn Observer,
    ) -> Result<Outputs> {
        let plan = Plan {
            input,
            id,
            scan,
            offload,
            opts,
        };
        let mut warnings = Vec::new();
        let bundles = bundles(plan, &mut warnings);
        for w in &warnings {
            observer.warn(w);
        }
        let devices_meta = Devices {
            prefix: &opts.device_package_prefix,
            bundles: &bundles,
        };
        let (host, classic) = host_output(plan, &devices_meta, scratch, &mut warnings, observer)?;
        let pep825 = opts.variant_format == VariantFormat::Pep825;
        let variant = opts
            .variant_label
            .as_deref()
            .filter(|_| !pep825)
            .map(|label| variant_output(&host, id, &classic, &devices_meta, label));
        let (variants, index) = match &opts.variant_label {
            Some(_) if pep825 => pep825_outputs(&host, id, &classic, &devices_meta),
            _ => (Vec::new(), None),
        };
        let host_names: BTreeSet<&str> = host.members.iter().map(|m| m.name.as_str()).collect();
        let devices = bundles
            .iter()
            .map(|b| device_output(plan, b, &devices_meta, &host_names))
            .collect::<Result<Vec<_>>>()?;
        Ok(Outputs {
            id: id.clone(),
            fat_binaries: scan.fat.len(),
            code_objects: offload.code_objects,
            database_files: scan.databases.len(),
            architectures: architectures(scan, offload),
            host,
            variant,
            variants,
            index,
            devices,
            notes: scan.notes.clone(),
            warnings,
        })
    }

    /// Step 6: every output written (in parallel) into a staging directory
    /// of the output directory, then renamed into place: device wheels
    /// first, the host wheel last. Existing outputs of the same names are
    /// replaced.
    pub fn write(self, opts: &SplitWheelOptions, observer: &dyn Observer) -> Result<WheelSummary> {
        let format = opts.output_format;
        let stage = StagedDir::in_dir(&opts.output_dir)?;
        let outputs = self.in_order();
        let work: u64 = outputs
            .iter()
            .flat_map(|o| &o.members)
            .map(|m| m.len().unwrap_or(0))
            .sum();
        observer.add_work(work);
        let written: Vec<Written> = outputs
            .par_iter()
            .map(|o| o.write(stage.path(), format, observer))
            .collect::<Result<_>>()?;
        let mut names: Vec<String> = outputs.iter().map(|o| o.entry_name(format)).collect();
        if let Some((name, text)) = &self.index {
            let path = stage.path().join(name);
            fs::write(&path, text).map_err(|e| WheelError::io(&path, e))?;
            names.insert(names.len() - 1, name.clone());
        }
        commit(stage, &opts.output_dir, &names)?;
        Ok(self.summary(&written, opts))
    }

    /// Every output in the order they are written and committed: the
    /// device wheels, the variant wheel (or the PEP 825 ones), the host
    /// wheel.
    fn in_order(&self) -> Vec<&Output> {
        let mut outputs: Vec<&Output> = self.devices.iter().map(|d| &d.output).collect();
        outputs.extend(self.variant.iter());
        outputs.extend(self.variants.iter().map(|(_, o)| o));
        outputs.push(&self.host);
        outputs
    }

    /// The summary of the split, given what was written for each output
    /// (in the order of [`Outputs::in_order`]).
    fn summary(&self, written: &[Written], opts: &SplitWheelOptions) -> WheelSummary {
        let n = self.devices.len();
        let devices = self
            .devices
            .iter()
            .zip(written)
            .map(|(d, w)| d.summary(w, opts))
            .collect();
        let first = n + usize::from(self.variant.is_some());
        let variants = self
            .variants
            .iter()
            .zip(&written[first..])
            .map(|((label, o), w)| VariantOutput {
                label: label.clone(),
                wheel: o.summary(w, opts),
            })
            .collect();
        WheelSummary {
            input: String::new(),
            name: self.id.name.clone(),
            version: self.id.version.clone(),
            fat_binaries: self.fat_binaries,
            code_objects: self.code_objects,
            database_files: self.database_files,
            architectures: self.architectures.clone(),
            host: self.host.summary(&written[written.len() - 1], opts),
            variant: self.variant.as_ref().map(|v| v.summary(&written[n], opts)),
            variants,
            variants_index: self
                .index
                .as_ref()
                .map(|(name, _)| opts.output_dir.join(name).display().to_string()),
            devices,
            notes: self.notes.clone(),
            warnings: self.warnings.clone(),
            seconds: 0.0,
        }
    }
}

/// Rename the staged entries `names` into the output directory `out`,
/// replacing existing entries of the same names.
fn commit(mut stage: StagedDir, out: &Path, names: &[String]) -> Result<()> {
    for n in names {
        if out.join(n).symlink_metadata().is_ok() {
            stage.retire(n)?;
        }
    }
    stage.commit_entries(names)?;
    Ok(())
}

/// Every target found (archives and database files), sorted.
fn architectures(scan: &Scan, offload: &Offload) -> Vec<String> {
    let mut architectures: BTreeSet<String> = offload.archives.keys().cloned().collect();
    architectures.extend(scan.databases.values().cloned());
    architectures.into_iter().collect()
}

/// The bundle key that owns the target `target`.
fn bundle_key(target: &str) -> String {
    bootstrap::lookup(&bootstrap::package_owner(target)).key
}

/// The bundles of the split, sorted by key: the package owners of every
/// archive's and database file's target. A key rocm-bootstrap does not
/// know gets a wheel of its own and a warning.
fn bundles(plan: Plan, warnings: &mut Vec<String>) -> Vec<Bundle> {
    let keys: BTreeSet<String> = plan
        .offload
        .archives
        .keys()
        .chain(plan.scan.databases.values())
        .map(|t| bundle_key(t))
        .collect();
    let bundles: Vec<Bundle> = keys.iter().map(|k| bootstrap::lookup(k)).collect();
    for b in bundles.iter().filter(|b| !b.known) {
        warnings.push(format!(
            "{}: {} is not a target rocm-bootstrap 0.3.0 knows: device wheel {} has no sub-family or family",
            plan.input.path.display(),
            b.key,
            bootstrap::device_dist_name(&plan.opts.device_package_prefix, &b.key)
        ));
    }
    bundles
}

/// The host wheel: every file of the input but the database files and the
/// old RECORD, fat binaries in their offloaded form, `METADATA` with the
/// extras, symlinks followed. Also returns the new `METADATA`.
fn host_output(
    plan: Plan,
    devices: &Devices,
    scratch: &Path,
    warnings: &mut Vec<String>,
    observer: &dyn Observer,
) -> Result<(Output, String)> {
    let (input, id) = (plan.input, plan.id);
    let host = HostFiles::new(plan, devices, scratch)?;
    let mut members = Vec::new();
    for n in &plan.scan.nodes {
        let rel = rel_string(&n.rel).expect("checked by the scan");
        let Some((from, mode)) = host.source(n, &rel, warnings, observer) else {
            continue;
        };
        members.extend(host.member(rel, &from, mode));
    }
    sort_members(&mut members);
    let file_name = input
        .file_name
        .clone()
        .unwrap_or_else(|| id.file_name(&id.name));
    Ok((
        Output {
            file_name,
            dist_info: id.dist_info.clone(),
            members,
        },
        host.classic,
    ))
}

/// How the files of the input become members of the host wheel.
struct HostFiles<'a> {
    plan: Plan<'a>,
    scratch: &'a Path,
    /// The input's root, canonical (to tell links out of the wheel).
    canon_root: PathBuf,
    metadata_name: String,
    record_name: String,
    /// The host wheel's `METADATA`.
    classic: String,
}

impl<'a> HostFiles<'a> {
    /// Reads the input's `METADATA` and makes the host wheel's.
    fn new(plan: Plan<'a>, devices: &Devices, scratch: &'a Path) -> Result<Self> {
        let (input, id) = (plan.input, plan.id);
        let metadata_name = format!("{}/METADATA", id.dist_info);
        let record_name = format!("{}/RECORD", id.dist_info);
        let original = fs::read_to_string(input.root.join(&metadata_name))
            .map_err(|e| WheelError::io(&input.root.join(&metadata_name), e))?;
        let classic = metadata::host_metadata(&original, id, devices);
        let canon_root =
            fs::canonicalize(&input.root).map_err(|e| WheelError::io(&input.root, e))?;
        Ok(HostFiles {
            plan,
            scratch,
            canon_root,
            metadata_name,
            record_name,
            classic,
        })
    }

    /// Where the bytes of the node `n` at `rel` come from (see [`follow`])
    /// and its mode; `None` for a directory, or a symlink left out (with a
    /// warning).
    fn source(
        &self,
        n: &Node,
        rel: &str,
        warnings: &mut Vec<String>,
        observer: &dyn Observer,
    ) -> Option<(String, u32)> {
        match &n.kind {
            NodeKind::Dir => None,
            NodeKind::File { .. } => Some((rel.to_string(), n.mode)),
            NodeKind::Symlink(_) => {
                let input = self.plan.input;
                let followed = follow(input, &self.canon_root, rel, self.plan.scan);
                if let Err(why) = &followed {
                    let msg = format!(
                        "{}: {rel}: {why}: left out of the host wheel",
                        input.path.display()
                    );
                    observer.warn(&msg);
                    warnings.push(msg);
                }
                followed.ok()
            }
        }
    }

    /// The member at `rel` with the bytes of `from`: the new `METADATA`, a
    /// fat binary's offloaded form, or the file itself; `None` for the old
    /// RECORD and the database files.
    fn member(&self, rel: String, from: &str, mode: u32) -> Option<Member> {
        let (input, scan) = (self.plan.input, self.plan.scan);
        if rel == self.record_name || scan.databases.contains_key(&rel) {
            return None;
        }
        Some(if rel == self.metadata_name {
            Member {
                name: rel,
                mode,
                source: zipio::Source::Bytes(self.classic.clone().into_bytes()),
            }
        } else if scan.fat.contains(from) {
            Member::file(rel, mode, self.scratch.join("host").join(from))
        } else if Path::new(from).is_absolute() {
            Member::file(rel, mode, from)
        } else {
            Member::file(rel, mode, input.root.join(from))
        })
    }
}

/// Where the symlink at `rel` leads: a file of the wheel (its path in the
/// wheel) or, outside it, an absolute path; and that file's mode. Links to
/// directories, dangling links and links to database files are left out.
fn follow(
    input: &Input,
    canon_root: &Path,
    rel: &str,
    scan: &Scan,
) -> std::result::Result<(String, u32), String> {
    let path = input.root.join(rel);
    let target = fs::canonicalize(&path).map_err(|e| format!("a dangling symlink ({e})"))?;
    let meta = fs::metadata(&target).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("a symlink to a directory".into());
    }
    let mode = permission_bits(&meta);
    match target.strip_prefix(canon_root) {
        Ok(inside) => {
            let t = rel_string(inside).ok_or("a link target whose name is not UTF-8")?;
            if scan.databases.contains_key(&t) {
                return Err(format!(
                    "a symlink to the database file {t}, which goes to a device wheel"
                ));
            }
            Ok((t, mode))
        }
        Err(_) => Ok((target.display().to_string(), mode)),
    }
}

/// The variant wheel: the host wheel with the variant `METADATA` and
/// `variant.json`.
fn variant_output(
    host: &Output,
    id: &Identity,
    classic: &str,
    devices: &Devices,
    label: &str,
) -> Output {
    let metadata_name = format!("{}/METADATA", id.dist_info);
    let mut members: Vec<Member> = host
        .members
        .iter()
        .map(|m| {
            if m.name == metadata_name {
                Member::bytes(m.name.clone(), metadata::variant_metadata(classic))
            } else {
                m.clone()
            }
        })
        .collect();
    members.push(Member::bytes(
        format!("{}/variant.json", id.dist_info),
        metadata::variant_json(devices),
    ));
    sort_members(&mut members);
    Output {
        file_name: host.file_name.replace(".whl", &format!("-{label}.whl")),
        dist_info: id.dist_info.clone(),
        members,
    }
}

/// The PEP 825 variant wheels (one per target bundle key: the host wheel
/// with the `METADATA` of [`metadata::pep825_metadata`] and its own
/// `variant.json`, named `<host wheel name>-<label>.whl`) and the index
/// file naming them all.
fn pep825_outputs(
    host: &Output,
    id: &Identity,
    classic: &str,
    devices: &Devices,
) -> (Vec<(String, Output)>, Option<Index>) {
    let metadata_name = format!("{}/METADATA", id.dist_info);
    let keys = devices.target_keys();
    let labels: Vec<String> = keys.iter().map(|k| metadata::pep825_label(k)).collect();
    let variants: Vec<(String, Output)> = keys
        .iter()
        .zip(&labels)
        .map(|(key, label)| {
            let mut members: Vec<Member> = host
                .members
                .iter()
                .map(|m| {
                    if m.name == metadata_name {
                        Member::bytes(
                            m.name.clone(),
                            metadata::pep825_metadata(classic, id, devices, key),
                        )
                    } else {
                        m.clone()
                    }
                })
                .collect();
            members.push(Member::bytes(
                format!("{}/variant.json", id.dist_info),
                metadata::pep825_variant_json(devices, std::slice::from_ref(label)),
            ));
            sort_members(&mut members);
            let output = Output {
                file_name: host.file_name.replace(".whl", &format!("-{label}.whl")),
                dist_info: id.dist_info.clone(),
                members,
            };
            (label.clone(), output)
        })
        .collect();
    let index = (!labels.is_empty()).then(|| {
        let name = format!("{}-{}-variants.json", id.name.replace('-', "_"), id.version);
        (name, metadata::pep825_variant_json(devices, &labels))
    });
    (variants, index)
}

/// A device wheel's payload: path in the wheel → source file and mode.
type Payload = BTreeMap<String, (PathBuf, u32)>;

/// The device wheel of `bundle`: its archives and database files, and its
/// dist-info. Its payload paths are checked (no absolute path or `..`, no
/// two different sources for one path, no path under another, none in the
/// host wheel).
fn device_output(
    plan: Plan,
    bundle: &Bundle,
    devices: &Devices,
    host_names: &BTreeSet<&str>,
) -> Result<Device> {
    let mut payload = Payload::new();
    let archives = add_archives(plan, bundle, &mut payload)?;
    let database_files = add_databases(plan, bundle, &mut payload)?;
    let dist = devices.dist_name(&bundle.key);
    check_payload(plan.input, &payload, host_names, &dist)?;
    let dist_info = plan.id.dist_info_of(&dist);
    let members = device_members(plan, bundle, devices, &dist_info, payload);
    Ok(Device {
        bundle: bundle.clone(),
        archives,
        database_files,
        output: Output {
            file_name: plan.id.file_name(&dist),
            dist_info,
            members,
        },
    })
}

/// Add the archives of the targets `bundle` owns to `payload`, under
/// `<overlay>/.kpack/`; returns their paths in the wheel.
fn add_archives(plan: Plan, bundle: &Bundle, payload: &mut Payload) -> Result<Vec<String>> {
    let prefix = overlay_prefix(plan.opts.overlay());
    let mut archives = Vec::new();
    for (_, (path, _)) in plan
        .offload
        .archives
        .iter()
        .filter(|(t, _)| bundle_key(t) == bundle.key)
    {
        let name = format!(
            "{prefix}.kpack/{}",
            path.file_name().unwrap_or_default().to_string_lossy()
        );
        archives.push(name.clone());
        add_payload(plan.input, payload, name, path.clone(), 0o644)?;
    }
    Ok(archives)
}

/// Add the database files of the targets `bundle` owns to `payload`, at
/// their paths and with their modes; returns how many.
fn add_databases(plan: Plan, bundle: &Bundle, payload: &mut Payload) -> Result<usize> {
    let mut database_files = 0;
    for (rel, _) in plan
        .scan
        .databases
        .iter()
        .filter(|(_, t)| bundle_key(t) == bundle.key)
    {
        let src = plan.input.root.join(rel);
        let meta = fs::metadata(&src).map_err(|e| WheelError::io(&src, e))?;
        add_payload(
            plan.input,
            payload,
            rel.clone(),
            src,
            permission_bits(&meta),
        )?;
        database_files += 1;
    }
    Ok(database_files)
}

/// The members of the device wheel of `bundle`: its payload, and its
/// `METADATA`, `WHEEL` and `top_level.txt` in `dist_info`; sorted.
fn device_members(
    plan: Plan,
    bundle: &Bundle,
    devices: &Devices,
    dist_info: &str,
    payload: Payload,
) -> Vec<Member> {
    let (id, opts) = (plan.id, plan.opts);
    let mut members: Vec<Member> = payload
        .into_iter()
        .map(|(name, (path, mode))| Member::file(name, mode, path))
        .collect();
    members.push(Member::bytes(
        format!("{dist_info}/METADATA"),
        metadata::device_metadata(id, bundle, devices, &opts.device_requires_dist),
    ));
    members.push(Member::bytes(
        format!("{dist_info}/WHEEL"),
        metadata::device_wheel_file(id),
    ));
    members.push(Member::bytes(
        format!("{dist_info}/top_level.txt"),
        format!("{}\n", opts.overlay()),
    ));
    sort_members(&mut members);
    members
}

/// Add one payload file; a second source for the same path must have the
/// same bytes.
fn add_payload(
    input: &Input,
    payload: &mut Payload,
    name: String,
    src: PathBuf,
    mode: u32,
) -> Result<()> {
    let safe = !name.starts_with('/')
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if !safe {
        return Err(WheelError::invalid(
            &input.path,
            format!("invalid device payload path: {name}"),
        ));
    }
    if let Some((other, _)) = payload.get(&name) {
        if !same_bytes(other, &src)? {
            return Err(WheelError::invalid(
                &input.path,
                format!("conflicting device path {name}: two sources with different bytes"),
            ));
        }
        return Ok(());
    }
    payload.insert(name, (src, mode));
    Ok(())
}

/// No payload path lies below another, or is also in the host wheel.
fn check_payload(
    input: &Input,
    payload: &Payload,
    host_names: &BTreeSet<&str>,
    dist: &str,
) -> Result<()> {
    for name in payload.keys() {
        if host_names.contains(name.as_str()) {
            return Err(WheelError::invalid(
                &input.path,
                format!("conflicting payload path {name}: in the host wheel and in the device wheel {dist}"),
            ));
        }
        let dir = format!("{name}/");
        if let Some(child) = payload.keys().find(|k| k.starts_with(&dir)) {
            return Err(WheelError::invalid(
                &input.path,
                format!(
                    "conflicting device entry types: {name} is a file and the directory of {child}"
                ),
            ));
        }
    }
    Ok(())
}
