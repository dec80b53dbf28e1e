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
    overlay_prefix, DeviceOutput, Identity, Input, Offload, OutputFormat, Result, Scan,
    SplitWheelOptions, WheelError, WheelOutput, WheelSummary,
};
use crate::artifact::tree::{rel_string, same_bytes, NodeKind};
use crate::artifact::Observer;
use crate::output::StagedDir;

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
}

struct Device {
    bundle: Bundle,
    archives: Vec<String>,
    database_files: usize,
    output: Output,
}

/// Every output of a split, ready to write.
pub(super) struct Outputs {
    id: Identity,
    fat_binaries: usize,
    code_objects: usize,
    database_files: usize,
    architectures: Vec<String>,
    host: Output,
    variant: Option<Output>,
    devices: Vec<Device>,
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
        let mut warnings = Vec::new();
        let bundles = bundles(input, scan, offload, opts, &mut warnings);
        for w in &warnings {
            observer.warn(w);
        }
        let devices_meta = Devices {
            prefix: &opts.device_package_prefix,
            bundles: &bundles,
        };
        let (host, classic) = host_output(
            input,
            id,
            scan,
            &devices_meta,
            scratch,
            &mut warnings,
            observer,
        )?;
        let variant = opts
            .variant_label
            .as_deref()
            .map(|label| variant_output(&host, id, &classic, &devices_meta, label));
        let host_names: BTreeSet<&str> = host.members.iter().map(|m| m.name.as_str()).collect();
        let devices = bundles
            .iter()
            .map(|b| {
                device_output(
                    input,
                    id,
                    scan,
                    offload,
                    opts,
                    b,
                    &devices_meta,
                    &host_names,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let mut architectures: BTreeSet<String> = offload.archives.keys().cloned().collect();
        architectures.extend(scan.databases.values().cloned());
        Ok(Outputs {
            id: id.clone(),
            fat_binaries: scan.fat.len(),
            code_objects: offload.code_objects,
            database_files: scan.databases.len(),
            architectures: architectures.into_iter().collect(),
            host,
            variant,
            devices,
            warnings,
        })
    }

    /// Step 6: every output written (in parallel) into a staging directory
    /// of the output directory, then renamed into place: device wheels
    /// first, the host wheel last. Existing outputs of the same names are
    /// replaced.
    pub fn write(self, opts: &SplitWheelOptions, observer: &dyn Observer) -> Result<WheelSummary> {
        let format = opts.output_format;
        let mut stage = StagedDir::in_dir(&opts.output_dir)?;
        let mut outputs: Vec<&Output> = self.devices.iter().map(|d| &d.output).collect();
        outputs.extend(self.variant.iter());
        outputs.push(&self.host);
        let work: u64 = outputs
            .iter()
            .flat_map(|o| &o.members)
            .map(|m| match &m.source {
                zipio::Source::File(p) => fs::metadata(p).map_or(0, |m| m.len()),
                zipio::Source::Bytes(b) => b.len() as u64,
            })
            .sum();
        observer.add_work(work);
        let staged = stage.path().to_path_buf();
        let written: Vec<Written> = outputs
            .par_iter()
            .map(|o| {
                let path = staged.join(o.entry_name(format));
                observer.note(&format!("writing {}", o.entry_name(format)));
                match format {
                    OutputFormat::Wheel => {
                        zipio::write_wheel(&path, &o.members, &o.dist_info, observer)
                    }
                    OutputFormat::Directory => {
                        zipio::write_directory(&path, &o.members, &o.dist_info, observer)
                    }
                }
            })
            .collect::<Result<_>>()?;
        let names: Vec<String> = outputs.iter().map(|o| o.entry_name(format)).collect();
        for n in &names {
            if opts.output_dir.join(n).symlink_metadata().is_ok() {
                stage.retire(n)?;
            }
        }
        stage.commit_entries(&names)?;
        let shown = |o: &Output, w: &Written| WheelOutput {
            path: opts
                .output_dir
                .join(o.entry_name(format))
                .display()
                .to_string(),
            files: w.files,
            bytes: w.bytes_in,
            size: w.bytes_out,
        };
        let n = self.devices.len();
        let devices = self
            .devices
            .iter()
            .zip(&written)
            .map(|(d, w)| DeviceOutput {
                bundle_key: d.bundle.key.clone(),
                level: d.bundle.level,
                dist_name: bootstrap::device_dist_name(&opts.device_package_prefix, &d.bundle.key),
                known: d.bundle.known,
                archives: d.archives.clone(),
                database_files: d.database_files,
                wheel: shown(&d.output, w),
            })
            .collect();
        Ok(WheelSummary {
            input: String::new(),
            name: self.id.name.clone(),
            version: self.id.version.clone(),
            fat_binaries: self.fat_binaries,
            code_objects: self.code_objects,
            database_files: self.database_files,
            architectures: self.architectures.clone(),
            host: shown(&self.host, &written[written.len() - 1]),
            variant: self.variant.as_ref().map(|v| shown(v, &written[n])),
            devices,
            warnings: self.warnings.clone(),
            seconds: 0.0,
        })
    }
}

/// The bundles of the split, sorted by key: the package owners of every
/// archive's and database file's target. A key rocm-bootstrap does not
/// know gets a wheel of its own and a warning.
fn bundles(
    input: &Input,
    scan: &Scan,
    offload: &Offload,
    opts: &SplitWheelOptions,
    warnings: &mut Vec<String>,
) -> Vec<Bundle> {
    let keys: BTreeSet<String> = offload
        .archives
        .keys()
        .chain(scan.databases.values())
        .map(|t| bootstrap::lookup(&bootstrap::package_owner(t)).key)
        .collect();
    let bundles: Vec<Bundle> = keys.iter().map(|k| bootstrap::lookup(k)).collect();
    for b in bundles.iter().filter(|b| !b.known) {
        warnings.push(format!(
            "{}: {} is not a target rocm-bootstrap 0.3.0 knows: device wheel {} has no sub-family or family",
            input.path.display(),
            b.key,
            bootstrap::device_dist_name(&opts.device_package_prefix, &b.key)
        ));
    }
    bundles
}

/// The host wheel: every file of the input but the database files and the
/// old RECORD, fat binaries in their offloaded form, `METADATA` with the
/// extras, symlinks followed. Also returns the new `METADATA`.
fn host_output(
    input: &Input,
    id: &Identity,
    scan: &Scan,
    devices: &Devices,
    scratch: &Path,
    warnings: &mut Vec<String>,
    observer: &dyn Observer,
) -> Result<(Output, String)> {
    let metadata_name = format!("{}/METADATA", id.dist_info);
    let record_name = format!("{}/RECORD", id.dist_info);
    let original = fs::read_to_string(input.root.join(&metadata_name))
        .map_err(|e| WheelError::io(&input.root.join(&metadata_name), e))?;
    let classic = metadata::host_metadata(&original, id, devices);
    let canon_root = fs::canonicalize(&input.root).map_err(|e| WheelError::io(&input.root, e))?;
    let mut members = Vec::new();
    for n in &scan.nodes {
        let rel = rel_string(&n.rel).expect("checked by the scan");
        let source = match &n.kind {
            NodeKind::Dir => continue,
            NodeKind::File { .. } => Some((rel.clone(), n.mode)),
            NodeKind::Symlink(_) => {
                let followed = follow(input, &canon_root, &rel, scan);
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
        };
        let Some((from, mode)) = source else { continue };
        if rel == record_name || scan.databases.contains_key(&rel) {
            continue;
        }
        let member = if rel == metadata_name {
            Member {
                name: rel,
                mode,
                source: zipio::Source::Bytes(classic.clone().into_bytes()),
            }
        } else if scan.fat.contains(&from) {
            Member::file(rel, mode, scratch.join("host").join(&from))
        } else if Path::new(&from).is_absolute() {
            Member::file(rel, mode, &from)
        } else {
            Member::file(rel, mode, input.root.join(&from))
        };
        members.push(member);
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
        classic,
    ))
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
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
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

/// The device wheel of `bundle`: its archives and database files, and its
/// dist-info. Its payload paths are checked (no absolute path or `..`, no
/// two different sources for one path, no path under another, none in the
/// host wheel).
#[allow(clippy::too_many_arguments)]
fn device_output(
    input: &Input,
    id: &Identity,
    scan: &Scan,
    offload: &Offload,
    opts: &SplitWheelOptions,
    bundle: &Bundle,
    devices: &Devices,
    host_names: &BTreeSet<&str>,
) -> Result<Device> {
    let owner = |t: &str| bootstrap::lookup(&bootstrap::package_owner(t)).key;
    let prefix = overlay_prefix(opts.overlay());
    let mut payload: BTreeMap<String, (PathBuf, u32)> = BTreeMap::new();
    let mut archives = Vec::new();
    for (_, (path, _)) in offload
        .archives
        .iter()
        .filter(|(t, _)| owner(t) == bundle.key)
    {
        let name = format!(
            "{prefix}.kpack/{}",
            path.file_name().unwrap_or_default().to_string_lossy()
        );
        archives.push(name.clone());
        add_payload(input, &mut payload, name, path.clone(), 0o644)?;
    }
    let mut database_files = 0;
    for (rel, _) in scan
        .databases
        .iter()
        .filter(|(_, t)| owner(t) == bundle.key)
    {
        let src = input.root.join(rel);
        let meta = fs::metadata(&src).map_err(|e| WheelError::io(&src, e))?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
        add_payload(input, &mut payload, rel.clone(), src, mode)?;
        database_files += 1;
    }
    check_payload(input, &payload, host_names, &devices.dist_name(&bundle.key))?;
    let dist = devices.dist_name(&bundle.key);
    let dist_info = id.dist_info_of(&dist);
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
    Ok(Device {
        bundle: bundle.clone(),
        archives,
        database_files,
        output: Output {
            file_name: id.file_name(&dist),
            dist_info,
            members,
        },
    })
}

/// Add one payload file; a second source for the same path must have the
/// same bytes.
fn add_payload(
    input: &Input,
    payload: &mut BTreeMap<String, (PathBuf, u32)>,
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
    payload: &BTreeMap<String, (PathBuf, u32)>,
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
