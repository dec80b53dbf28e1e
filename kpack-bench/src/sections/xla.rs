//! A real library of the size ROCm ships: `xla_rocm_plugin.so` from
//! PyPI's `jax-rocm7-pjrt` 0.12.0 wheel (ROCm 7; 459 MB, of which 414 MB
//! host code, and 45 compressed bundles (CCOB v3, zstd) of 27 targets,
//! 2.44 GB of device code once decompressed). The wheel is fetched once by
//! `pip download --no-deps` into `target/bench/cache/xla/`; without it
//! (no access to PyPI) the rows say why.
//!
//! One repetition runs, interleaved: the floor, in two processes: `zstd -d`
//! of every compressed bundle's payload piped into `zstd -3 -T1` (the
//! decompression of the device code and its compression into archive
//! frames) and `cp` of the file (writing the host part); `kpack offload`
//! (targets: ≤ 1.2× the sum of the two floors' medians, peak RSS ≤
//! 256 MiB); `unzip` of the wheel; `kpack split-wheels -j 2` of the wheel
//! (peak RSS ≤ 256 MiB).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;

use super::job::Job;
use super::split_wheels::{split_wheels_args, WheelShape};
use crate::args;
use crate::context::Ctx;
use crate::measure::{load_average, note_load, warm};
use crate::report::{FloorRatio, Row, Target};
use kpack_testkit::tree::remove;

const REQUIREMENT: &str = "jax-rocm7-pjrt==0.12.0";
const WHEEL: &str = "jax_rocm7_pjrt-0.12.0-py3-none-manylinux_2_27_x86_64.whl";
const PLUGIN: &str = "xla_rocm_plugin.so";
/// Where the plugin lies in the wheel (its package: the overlay root).
const PACKAGE: &str = "jax_plugins/xla_rocm7/";
/// The jax plugin wheel's device wheels.
const JAX: WheelShape<'static> = WheelShape {
    device_package_prefix: "jax-rocm7-pjrt-device",
    overlay_root: PACKAGE,
    wheel_type: None,
};
const RSS_LIMIT_MIB: f64 = 256.0;
const FLOOR_FACTOR: f64 = 1.2;

/// The plugin's compressed bundles, as files of their zstd payloads.
struct Payloads {
    dir: PathBuf,
    files: Vec<PathBuf>,
    decompressed: u64,
    /// The code objects' bytes (what offload compresses).
    code_bytes: u64,
    targets: usize,
}

section!(
    "xla",
    "offload and split-wheels of JAX's ROCm plugin, downloaded from PyPI",
    run
);

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let cache = ctx.root.join("target/bench/cache/xla");
    let (wheel, plugin) = match fetch(ctx, &cache) {
        Ok(w) => w,
        Err(e) => return Ok(unavailable(format!("{e:#}"))),
    };
    let payloads = payloads(&cache, &plugin)?;
    let dir = ctx.work.join(NAME);
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let mut jobs = jobs(ctx, &wheel, &plugin, &payloads, &dir);
    let mut inputs: Vec<&Path> = vec![&wheel, &plugin];
    inputs.extend(payloads.files.iter().map(PathBuf::as_path));
    warm(&inputs)?;
    let before = load_average();
    Job::run_all(ctx, &mut jobs, NAME, &dir)?;
    let mut rows = rows(&jobs, &payloads);
    note_load(&mut rows, before, load_average());
    Ok(rows)
}

/// The rows when the wheel cannot be had, with their targets.
fn unavailable(why: String) -> Vec<Row> {
    eprintln!("xla: not measured: {why}");
    let rss = format!("peak RSS ≤ {RSS_LIMIT_MIB} MiB");
    let floor = format!("≤ {FLOOR_FACTOR}× the floor: zstd -d into zstd -3 -T1, + cp");
    let mut v = Vec::new();
    for (id, work, targets) in [
        (
            "offload",
            format!("offload, {PLUGIN} (jax-rocm7-pjrt 0.12.0)"),
            vec![floor, rss.clone()],
        ),
        (
            "split_wheels",
            format!("split-wheels -j 2, {WHEEL}"),
            vec![rss],
        ),
    ] {
        let mut row = Row::unavailable(NAME, id, work, why.clone());
        row.targets = targets
            .into_iter()
            .map(|t| Target::at_most(t, f64::NAN, f64::NAN))
            .collect();
        v.push(row);
    }
    v
}

/// The wheel (downloaded once) and the plugin unpacked from it, in
/// `cache`.
fn fetch(ctx: &Ctx, cache: &Path) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(cache)?;
    let wheel = cache.join(WHEEL);
    if !wheel.is_file() {
        download(ctx, cache)?;
        ensure!(wheel.is_file(), "pip download did not write {WHEEL}");
    }
    let plugin = cache.join(PLUGIN);
    if !plugin.is_file() {
        let member = format!("{PACKAGE}{PLUGIN}");
        let tmp = cache.join(format!(".{PLUGIN}.unzipping"));
        let out = Command::new("sh")
            .arg("-c")
            .arg(r#"unzip -p "$1" "$2" > "$3""#)
            .args([
                "sh".as_ref(),
                wheel.as_os_str(),
                member.as_ref(),
                tmp.as_os_str(),
            ])
            .output()
            .context("running unzip")?;
        ensure!(
            out.status.success() && tmp.metadata().is_ok_and(|m| m.len() > 0),
            "unzip -p {WHEEL} {member}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::fs::rename(&tmp, &plugin)?;
    }
    Ok((wheel, plugin))
}

/// `pip download --no-deps jax-rocm7-pjrt==0.12.0 -d cache`, with the
/// bench's virtual environment's pip (else `python3 -m pip`).
fn download(ctx: &Ctx, cache: &Path) -> Result<()> {
    let python = kpack_testkit::inputs::wheel::python(&ctx.root)
        .unwrap_or_else(|_| PathBuf::from("python3"));
    eprintln!(
        "downloading {REQUIREMENT} from PyPI into {} (once)",
        cache.display()
    );
    let out = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .arg(REQUIREMENT)
        .arg("-d")
        .arg(cache)
        .output()
        .with_context(|| format!("running {} -m pip", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        bail!(
            "could not download {REQUIREMENT} from PyPI (`pip download --no-deps {REQUIREMENT}`, {}): {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" ")
        );
    }
    Ok(())
}

/// The zstd payload of every compressed bundle of the plugin, one file
/// each in `cache/payloads/` (written once).
fn payloads(cache: &Path, plugin: &Path) -> Result<Payloads> {
    let dir = cache.join("payloads");
    let mapped = kpack_loader::map_file(plugin)?;
    let bin = kpack_host::binary::HostBinary::parse(&mapped)?;
    let section = bin.fatbin()?.context("the plugin has no .hip_fatbin")?;
    let bundles = kpack_bundle::list_fatbin(section.data)?;
    let mut ccobs: Vec<(std::ops::Range<usize>, u16, u64)> = Vec::new();
    let mut targets = std::collections::BTreeSet::new();
    let mut code_bytes = 0;
    for b in &bundles {
        targets.extend(b.device_entries().map(|e| e.target().to_string()));
        code_bytes += b.device_entries().map(|e| e.size).sum::<u64>();
        let (ccob, _) = b
            .compressed
            .as_ref()
            .context("a plain bundle in the plugin")?;
        ensure!(
            ccob.method == kpack_bundle::Method::Zstd,
            "a compressed bundle that is not zstd"
        );
        if ccobs.last().is_none_or(|(r, _, _)| *r != b.range) {
            ccobs.push((b.range.clone(), ccob.version, ccob.uncompressed_size));
        }
    }
    let done = dir.join("DONE");
    let mut files = Vec::new();
    if !done.is_file() {
        remove(&dir)?;
        std::fs::create_dir_all(&dir)?;
    }
    for (i, (range, version, _)) in ccobs.iter().enumerate() {
        let header = if *version >= 3 { 32 } else { 24 };
        let file = dir.join(format!("ccob-{i:02}.zst"));
        if !done.is_file() {
            std::fs::write(&file, &section.data[range.start + header..range.end])?;
        }
        files.push(file);
    }
    std::fs::write(&done, "")?;
    Ok(Payloads {
        dir,
        files,
        decompressed: ccobs.iter().map(|c| c.2).sum(),
        code_bytes,
        targets: targets.len(),
    })
}

/// The processes of one repetition, in order: the floors, offload,
/// unzip, split-wheels; their outputs in `dir`.
fn jobs(ctx: &Ctx, wheel: &Path, plugin: &Path, payloads: &Payloads, dir: &Path) -> Vec<Job> {
    let (off, unzipped, out) = (
        dir.join("offload"),
        dir.join("unzipped"),
        dir.join("split-wheels"),
    );
    let offload = args![
        "offload",
        plugin,
        "-o",
        off.join(PLUGIN),
        "--archive-dir",
        off.join(".kpack"),
        "--json"
    ];
    let mut jobs = Vec::from(floor_jobs(plugin, payloads, dir));
    jobs.extend([
        Job::new(
            "offload",
            format!("offload, {PLUGIN}"),
            &ctx.kpack,
            offload.to_vec(),
        )
        .files(plugin, &off, false)
        .archives(&off.join(".kpack")),
        Job::new(
            "unzip",
            format!("floor: unzip of {WHEEL}"),
            Path::new("unzip"),
            args!["-q", "-o", wheel, "-d", &unzipped].to_vec(),
        )
        .files(wheel, &unzipped, false),
        Job::new(
            "split_wheels",
            format!("split-wheels -j 2, {WHEEL}"),
            &ctx.kpack,
            split_wheels_args(wheel, &out, &dir.join("tmp"), &JAX),
        )
        .files(wheel, &out, false),
    ]);
    jobs
}

/// The offload's floor, in two processes: `zstd -d` of the payloads piped
/// into `zstd -3 -T1`, and `cp` of the plugin (into `dir`).
fn floor_jobs(plugin: &Path, payloads: &Payloads, dir: &Path) -> [Job; 2] {
    let files: Vec<String> = payloads
        .files
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    let zstd = format!(
        "zstd -q -d -c {} | zstd -q -3 -T1 -c > /dev/null",
        files.join(" ")
    );
    let copied = dir.join(PLUGIN);
    [
        Job::new(
            "zstd",
            format!(
                "floor: zstd -d of the {} compressed bundles' payloads, piped into zstd -3 -T1",
                files.len()
            ),
            Path::new("sh"),
            args!["-c", zstd].to_vec(),
        )
        .reads(&payloads.dir),
        Job::new(
            "cp",
            format!("floor: cp of {PLUGIN}"),
            Path::new("cp"),
            args!["--", plugin, &copied].to_vec(),
        )
        .files(plugin, &copied, false),
    ]
}

/// The rows: the floors, offload against their sum, split-wheels.
fn rows(jobs: &[Job], payloads: &Payloads) -> Vec<Row> {
    let [zstd, cp, offload, unzip, split] = jobs else {
        unreachable!("the jobs of xla::jobs")
    };
    let floor = zstd.median() + cp.median();
    let mut z = zstd.row(NAME);
    z.bytes_out = None;
    z.details = json!({ "decompressed_bytes": payloads.decompressed });
    let mut o = offload.row(NAME);
    o.compression_ratio = Some(payloads.code_bytes as f64 / offload.archive_bytes.max(1) as f64);
    o.floors = vec![FloorRatio {
        floor: "zstd -d into zstd -3 -T1, + cp".into(),
        ratio: offload.median() / floor,
    }];
    o.targets = vec![
        Target::at_most(
            format!(
                "≤ {FLOOR_FACTOR}× the floor: zstd -d into zstd -3 -T1, + cp ({:.2} s)",
                floor * FLOOR_FACTOR
            ),
            offload.median() / floor,
            FLOOR_FACTOR,
        ),
        offload.rss_target(RSS_LIMIT_MIB),
    ];
    o.details = json!({
        "archive_bytes": offload.archive_bytes,
        "compressed_bundles": payloads.files.len(),
        "targets": payloads.targets,
        "decompressed_bytes": payloads.decompressed,
        "code_object_bytes": payloads.code_bytes,
    });
    let mut s = split.row(NAME);
    s.floors = vec![FloorRatio {
        floor: "unzip + zstd -d into zstd -3 -T1".into(),
        ratio: split.median() / (unzip.median() + zstd.median()),
    }];
    s.targets = vec![split.rss_target(RSS_LIMIT_MIB)];
    s.details = split_summary(split.stdout());
    vec![z, cp.row(NAME), o, unzip.row(NAME), s]
}

/// What the row keeps of split-wheels' `--json` summary.
fn split_summary(stdout: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(stdout).unwrap_or_default();
    json!({
        "architectures": v["architectures"].as_array().map(Vec::len),
        "code_objects": v["code_objects"],
        "device_wheels": v["devices"].as_array().map(Vec::len),
        "device_wheel_bytes": v["devices"].as_array().map(|d| d.iter().filter_map(|w| w["size"].as_u64()).sum::<u64>()),
        "host_wheel_bytes": v["host"]["size"],
    })
}
