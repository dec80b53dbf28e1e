//! `kpack split-wheels -j 2` over a synthetic torch-like wheel: several
//! copies of Debian's librocsparse (1.3 GB, seven targets) as
//! `torch/lib/libtorch_hip_<i>.so`, one target's code objects as rocBLAS
//! database files, a MIOpen database, a host-only library and Python
//! files, packed by PyPI's `wheel pack` (deflate). The copies differ in one
//! byte of every code object, so that no two share code objects (split
//! stores a shared one once: identical copies would be compressed once where
//! the floor compresses each). The wheels are built once and kept in
//! `target/bench/cache/`.
//!
//! Floors on the same bytes: `unzip` of the wheel (every split reads it
//! all) and `zstd -3 -T1` over the device code (what split compresses):
//! their sum is the floor of the target (≤ 1.5×); `zip -r` of the unpacked
//! tree (repacking it, once: it is slow) is shown too. Peak RSS ≤ 256 MiB,
//! whatever the wheel's size: a wheel with one copy is split too, and the
//! five-copy wheel's peak must stay within 1.25× of its. Many wheels, one
//! run (`many_row`): the five-copy wheel and a torchvision-like copy of the
//! one-copy wheel in one `split-wheels`, its peak RSS held to the five-copy
//! wheel's alone.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::json;
use xshell::Shell;

use crate::args;
use crate::context::Ctx;
use crate::inputs::{link_or_copy, remove, write_device_code, ROCSPARSE};
use crate::measure::{resident, timed, tree_size, warm, Runs};
use crate::report::{FloorRatio, Row, Stats, Target};

/// Copies of librocsparse in the wheel (its content is then ~6.5 GB and the
/// deflated wheel about 1 GB).
const COPIES: usize = 5;
/// Copies in the small wheel, against which memory must not grow.
const SMALL_COPIES: usize = 1;
/// Most the peak RSS may grow from the small wheel to the large one.
const RSS_GROWTH: f64 = 1.25;
const VERSION: &str = "2.10.0+bench";
const TAG: &str = "cp311-cp311-linux_x86_64";
const RSS_LIMIT_MIB: f64 = 256.0;
const TIME_FACTOR: f64 = 1.5;

/// The cached wheel and device-code file.
struct Inputs {
    wheel: PathBuf,
    /// One copy of librocsparse's device code, concatenated.
    device: PathBuf,
    device_bytes: u64,
}

section!(
    "wheels",
    "kpack split-wheels over a torch-like wheel of several librocsparse copies",
    run
);

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let small = prepare(ctx, SMALL_COPIES)?;
    let inputs = prepare(ctx, COPIES)?;
    let wheel_size = std::fs::metadata(&inputs.wheel)?.len();
    eprintln!(
        "wheel: {} ({:.2} GB)",
        inputs.wheel.display(),
        wheel_size as f64 / 1e9
    );
    let out = ctx.work.join("wheels-out");
    let scratch = ctx.work.join("wheels-tmp");
    let unzipped = ctx.work.join("wheels-unzipped");
    let mut split = Runs::default();
    let mut split_small = Runs::default();
    let mut unzip = Runs::default();
    let mut zstd = Runs::default();
    // The split's outputs, measured before each next run removes them.
    let mut outputs = 0;
    warm(&[&inputs.wheel, &inputs.device])?;
    let small_args = split_args(&small.wheel, &out, &scratch);
    let split_args = split_args(&inputs.wheel, &out, &scratch);
    for rep in 0..ctx.reps {
        eprintln!("  rep {}/{}", rep + 1, ctx.reps);
        remove(&out)?;
        let r = resident(&[&small.wheel]);
        split_small.push(timed(&ctx.kpack, &small_args, &ctx.work)?, r);
        remove(&out)?;
        let r = resident(&[&inputs.wheel]);
        split.push(timed(&ctx.kpack, &split_args, &ctx.work)?, r);
        outputs = tree_size(&out);
        remove(&out)?;
        remove(&unzipped)?;
        let unzip_args = args!["-q", "-o", &inputs.wheel, "-d", &unzipped];
        unzip.push(
            timed(Path::new("unzip"), &unzip_args, &ctx.work)?,
            resident(&[&inputs.wheel]),
        );
        let zstd_cmd = format!(
            "zstd -q -3 -T1 -c {} > /dev/null",
            vec![inputs.device.display().to_string(); COPIES].join(" ")
        );
        zstd.push(
            timed(Path::new("sh"), &args!["-c", &zstd_cmd], &ctx.work)?,
            resident(&[&inputs.device]),
        );
    }
    let zip_cmd = format!(
        "cd {} && zip -q -r {} .",
        unzipped.display(),
        ctx.work.join("rezipped.whl").display()
    );
    let mut zip = Runs::default();
    zip.push(
        timed(Path::new("sh"), &args!["-c", &zip_cmd], &ctx.work)?,
        1.0,
    );
    let content = tree_size(&unzipped);
    remove(&unzipped)?;
    remove(&ctx.work.join("rezipped.whl"))?;
    let summary: serde_json::Value =
        serde_json::from_str(&split.last_stdout).context("split-wheels --json")?;
    let mut v = rows(
        &inputs,
        wheel_size,
        content,
        outputs,
        &summary,
        [&split, &unzip, &zstd, &zip],
    )?;
    v.insert(1, small_row(&small, &split_small, &split)?);
    v.insert(2, many_row(ctx, &small, &inputs, &split, &split_small)?);
    Ok(v)
}

/// Many wheels, one run: the large wheel and a torchvision-like copy of
/// the small one (`torchvision/`, its own name) split by one `split-wheels
/// -j 2` (`--input` twice, `@NAME@` in prefix and overlay root). Peak RSS
/// must stay that of the largest wheel alone (the wheels are split one
/// after the other); the wall time is shown against the two runs alone.
fn many_row(
    ctx: &Ctx,
    small: &Inputs,
    large: &Inputs,
    alone: &Runs,
    small_alone: &Runs,
) -> Result<Row> {
    let vision = vision_wheel(ctx, &small.wheel)?;
    let out = ctx.work.join("wheels-many-out");
    let scratch = ctx.work.join("wheels-tmp");
    let args: Vec<OsString> = crate::args![
        "split-wheels",
        "--input",
        &large.wheel,
        "--input",
        &vision,
        "--output-dir",
        &out,
        "--device-package-prefix",
        "amd-@NAME@-device",
        "--overlay-root",
        "@NAME@/",
        "--wheel-type",
        "torch-fat",
        "-j",
        "2",
        "--tmp-dir",
        &scratch,
        "--json"
    ]
    .to_vec();
    let mut runs = Runs::default();
    for _ in 0..ctx.reps {
        remove(&out)?;
        let r = resident(&[&large.wheel, &vision]);
        runs.push(timed(&ctx.kpack, &args, &ctx.work)?, r);
    }
    remove(&out)?;
    let mut row = Row::new(
        NAME,
        "split_wheels_many",
        format!(
            "split-wheels -j 2 of two wheels in one run ({COPIES} × and {SMALL_COPIES} × librocsparse)"
        ),
    );
    runs.fill(&mut row);
    row.bytes_in = Some(std::fs::metadata(&large.wheel)?.len() + std::fs::metadata(&vision)?.len());
    let (rss, alone_rss) = (worst_rss_mib(&runs), worst_rss_mib(alone));
    let separate = median(alone) + median(small_alone);
    row.floors = vec![FloorRatio {
        floor: "the two wheels split in separate runs".into(),
        ratio: median(&runs) / separate.max(1e-9),
    }];
    row.targets = vec![
        Target::at_most(
            format!("peak RSS ≤ {RSS_LIMIT_MIB} MiB (worst run)"),
            rss,
            RSS_LIMIT_MIB,
        ),
        Target::at_most(
            format!("peak RSS ≤ {RSS_GROWTH}× the large wheel's alone ({alone_rss:.0} MiB)"),
            rss / alone_rss.max(1.0),
            RSS_GROWTH,
        ),
    ];
    Ok(row)
}

/// The small wheel as another distribution (`torchvision`, package
/// `torchvision/`), built once into the cache.
fn vision_wheel(ctx: &Ctx, small: &Path) -> Result<PathBuf> {
    let cache = ctx.root.join("target/bench/cache/torchvision-wheel");
    let wheel = cache.join(format!("torchvision-{VERSION}-{TAG}.whl"));
    if wheel.is_file() {
        return Ok(wheel);
    }
    let tree = ctx.work.join("wheels-vision-tree");
    remove(&tree)?;
    let sh = Shell::new()?;
    xshell::cmd!(sh, "unzip -q {small} -d {tree}").run()?;
    std::fs::rename(tree.join("torch"), tree.join("torchvision"))?;
    let di = tree.join(format!("torchvision-{VERSION}.dist-info"));
    std::fs::rename(tree.join(format!("torch-{VERSION}.dist-info")), &di)?;
    let metadata = std::fs::read_to_string(di.join("METADATA"))?;
    std::fs::write(
        di.join("METADATA"),
        metadata.replace("Name: torch\n", "Name: torchvision\n"),
    )?;
    std::fs::write(di.join("RECORD"), "")?;
    std::fs::create_dir_all(&cache)?;
    let python = python(ctx)?;
    xshell::cmd!(sh, "{python} -m wheel pack {tree} -d {cache}")
        .quiet()
        .run()?;
    remove(&tree)?;
    Ok(wheel)
}

/// The one-copy wheel: peak RSS, against which the large wheel's is held.
fn small_row(small: &Inputs, runs: &Runs, large: &Runs) -> Result<Row> {
    let mut row = Row::new(
        NAME,
        "split_wheels_small",
        format!("split-wheels -j 2, the same wheel with {SMALL_COPIES} × librocsparse"),
    );
    runs.fill(&mut row);
    row.bytes_in = Some(std::fs::metadata(&small.wheel)?.len());
    let (rss, large_rss) = (worst_rss_mib(runs), worst_rss_mib(large));
    row.targets = vec![
        Target::at_most(
            format!("peak RSS ≤ {RSS_LIMIT_MIB} MiB (worst run)"),
            rss,
            RSS_LIMIT_MIB,
        ),
        Target::at_most(
            format!(
                "the {COPIES}-copy wheel's peak RSS ≤ {RSS_GROWTH}× this one's ({large_rss:.0} MiB)"
            ),
            large_rss / rss.max(1.0),
            RSS_GROWTH,
        ),
    ];
    Ok(row)
}

fn worst_rss_mib(runs: &Runs) -> f64 {
    Stats::of(runs.rss.clone()).map_or(0.0, |s| s.max) / 1024.0
}

fn split_args(wheel: &Path, out: &Path, scratch: &Path) -> Vec<OsString> {
    args![
        "split-wheels",
        "--input",
        wheel,
        "--output-dir",
        out,
        "--device-package-prefix",
        "amd-torch-device",
        "--overlay-root",
        "torch/",
        "--wheel-type",
        "torch-fat",
        "--compression",
        "zstd",
        "-j",
        "2",
        "--tmp-dir",
        scratch,
        "--json"
    ]
    .to_vec()
}

fn rows(
    inputs: &Inputs,
    wheel_size: u64,
    content: u64,
    outputs: u64,
    summary: &serde_json::Value,
    [split, unzip, zstd, zip]: [&Runs; 4],
) -> Result<Vec<Row>> {
    let device = inputs.device_bytes * COPIES as u64;
    let floor_rows = floor_rows(wheel_size, device, content, [unzip, zstd, zip]);
    let mut row = Row::new(
        NAME,
        "split_wheels",
        format!("split-wheels -j 2, torch-like wheel ({COPIES} × librocsparse + databases)"),
    );
    split.fill(&mut row);
    row.bytes_in = Some(wheel_size);
    row.bytes_out = Some(outputs);
    row.compression_ratio = Some(device as f64 / outputs.max(1) as f64);
    let floor = median(unzip) + median(zstd);
    row.floors = split_floors(median(split), floor, [unzip, zstd, zip]);
    row.targets = split_targets(split, floor);
    row.details = json!({
        "wheel_content_bytes": content,
        "device_code_bytes": device,
        "devices": summary["devices"].as_array().map(|d| d.len()),
        "architectures": summary["architectures"],
        "host_wheel_bytes": summary["host"]["size"],
        "fat_binaries": summary["fat_binaries"],
        "database_files": summary["database_files"],
    });
    let mut v = vec![row];
    v.extend(floor_rows);
    Ok(v)
}

/// The median wall time of `runs` (0 if none).
fn median(runs: &Runs) -> f64 {
    Stats::of(runs.wall.clone()).map_or(0.0, |s| s.median)
}

/// The floor rows: unzip of the wheel, zstd over the device code
/// (`device` bytes), zip of the unpacked wheel (`content` bytes).
fn floor_rows(
    wheel_size: u64,
    device: u64,
    content: u64,
    [unzip, zstd, zip]: [&Runs; 3],
) -> Vec<Row> {
    let mut floor_rows = Vec::new();
    for (id, work, runs, bytes) in [
        (
            "unzip",
            "floor: unzip of the wheel".to_string(),
            unzip,
            wheel_size,
        ),
        (
            "zstd_t1",
            format!("floor: zstd -3 -T1 over the device code ({COPIES} × librocsparse's)"),
            zstd,
            device,
        ),
        (
            "zip",
            "floor: zip -r of the unpacked wheel (one run)".to_string(),
            zip,
            content,
        ),
    ] {
        let mut row = Row::new(NAME, id, work);
        runs.fill(&mut row);
        row.bytes_in = Some(bytes);
        floor_rows.push(row);
    }
    floor_rows
}

/// The split's wall time `wall` over the floors' (`floor`: unzip + zstd
/// -T1).
fn split_floors(wall: f64, floor: f64, [unzip, zstd, zip]: [&Runs; 3]) -> Vec<FloorRatio> {
    vec![
        FloorRatio {
            floor: "unzip + zstd -T1".into(),
            ratio: wall / floor,
        },
        FloorRatio {
            floor: format!("{NAME}.unzip"),
            ratio: wall / median(unzip),
        },
        FloorRatio {
            floor: format!("{NAME}.zstd_t1"),
            ratio: wall / median(zstd),
        },
        FloorRatio {
            floor: "unzip + zip".into(),
            ratio: wall / (median(unzip) + median(zip)),
        },
    ]
}

/// The split's targets: its time against the unzip + zstd -T1 `floor`, and
/// its worst peak RSS.
fn split_targets(split: &Runs, floor: f64) -> Vec<Target> {
    let wall = median(split);
    let rss_mib = worst_rss_mib(split);
    vec![
        Target::at_most(
            format!(
                "≤ {TIME_FACTOR}× the unzip + zstd -T1 floor ({:.1} s)",
                floor * TIME_FACTOR
            ),
            wall,
            floor * TIME_FACTOR,
        ),
        Target::at_most(
            format!("peak RSS ≤ {RSS_LIMIT_MIB} MiB (worst run)"),
            rss_mib,
            RSS_LIMIT_MIB,
        ),
    ]
}

/// The cached wheel with `copies` copies (built when missing) and the
/// device-code file of one copy.
fn prepare(ctx: &Ctx, copies: usize) -> Result<Inputs> {
    let lib = Path::new(ROCSPARSE.path);
    if !lib.is_file() {
        bail!("{} missing (Debian package librocsparse0)", lib.display());
    }
    let cache = ctx.root.join("target/bench/cache");
    let device_dir = cache.join("torch-wheel-device");
    std::fs::create_dir_all(&device_dir)?;
    let device = device_dir.join("device.bin");
    let device_bytes = match std::fs::metadata(&device) {
        Ok(m) => m.len(),
        Err(_) => {
            let files = ctx.work.join("wheels-device-files");
            let (n, _) = write_device_code(lib, &device, &files)?;
            remove(&files)?;
            n
        }
    };
    let dir = cache.join(format!("torch-wheel-distinct-{copies}"));
    let wheel = dir.join(format!("torch-{VERSION}-{TAG}.whl"));
    if !wheel.is_file() {
        std::fs::create_dir_all(&dir)?;
        build_wheel(ctx, lib, &dir, copies)?;
    }
    Ok(Inputs {
        wheel,
        device,
        device_bytes,
    })
}

/// Copy `i` of the library at `dst`: copy 0 as it is, any other with the
/// middle byte of every code object XORed with `i` (the layout and sizes
/// unchanged, no code object shared with another copy).
fn write_copy(lib: &Path, dst: &Path, i: usize) -> Result<()> {
    use std::os::unix::fs::FileExt;
    if i == 0 {
        return link_or_copy(lib, dst);
    }
    std::fs::copy(lib, dst)?;
    let mapped = kpack_loader::map_file(lib)?;
    let cos = kpack_host::offload::code_objects(lib, &mapped)?;
    let f = std::fs::OpenOptions::new().write(true).open(dst)?;
    for co in cos.iter().filter(|co| !co.data.is_empty()) {
        let at = mapped
            .offset_of(&co.data)
            .with_context(|| format!("{}: a compressed bundle", lib.display()))?;
        let mid = co.data.len() / 2;
        f.write_all_at(&[co.data[mid] ^ i as u8], at + mid as u64)?;
    }
    Ok(f.sync_all()?)
}

fn build_wheel(ctx: &Ctx, lib: &Path, cache: &Path, copies: usize) -> Result<()> {
    eprintln!(
        "building the torch-like wheel with {copies} copies (once; kept in {})",
        cache.display()
    );
    let tree = ctx.work.join("wheels-tree");
    remove(&tree)?;
    let t = tree.join("torch");
    std::fs::create_dir_all(t.join("lib/rocblas/library"))?;
    std::fs::create_dir_all(t.join("share/miopen/db"))?;
    for i in 0..copies {
        write_copy(lib, &t.join(format!("lib/libtorch_hip_{i}.so")), i)?;
    }
    std::fs::write(t.join("__init__.py"), "# torch-like bench wheel\n")?;
    std::fs::copy(
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
        t.join("lib/libz_host.so.1"),
    )?;
    // One target's code objects as rocBLAS kernel libraries (database files).
    let extracted = ctx.work.join("wheels-db");
    remove(&extracted)?;
    let sh = Shell::new()?;
    let kpack = &ctx.kpack;
    xshell::cmd!(sh, "{kpack} extract {lib} --target gfx1030 -o {extracted}")
        .quiet()
        .ignore_stdout()
        .run()?;
    for (n, e) in std::fs::read_dir(&extracted)?.enumerate() {
        let e = e?;
        std::fs::rename(
            e.path(),
            t.join(format!(
                "lib/rocblas/library/TensileLibrary_Type_{n}_gfx1030.co"
            )),
        )?;
    }
    remove(&extracted)?;
    std::fs::write(t.join("share/miopen/db/gfx1030.kdb"), vec![7u8; 4 << 20])?;
    let di = tree.join(format!("torch-{VERSION}.dist-info"));
    std::fs::create_dir_all(&di)?;
    std::fs::write(
        di.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: torch\nVersion: {VERSION}\n"),
    )?;
    std::fs::write(
        di.join("WHEEL"),
        format!("Wheel-Version: 1.0\nGenerator: kpack-bench\nRoot-Is-Purelib: false\nTag: {TAG}\n"),
    )?;
    std::fs::write(di.join("RECORD"), "")?;
    let python = python(ctx)?;
    xshell::cmd!(sh, "{python} -m wheel pack {tree} -d {cache}")
        .quiet()
        .run()?;
    remove(&tree)
}

/// The Python of the wheel tests' virtual environment (PyPI's `wheel`):
/// `$KPACK_PY_VENV`, else `target/py-venv` (`cargo xtask bench` and
/// `cargo xtask py-env` make it).
pub(crate) fn python(ctx: &Ctx) -> Result<PathBuf> {
    let venv = std::env::var_os("KPACK_PY_VENV")
        .map_or_else(|| ctx.root.join("target/py-venv"), PathBuf::from);
    let python = venv.join("bin/python");
    if !python.is_file() {
        bail!(
            "{} missing (`cargo xtask py-env` makes it)",
            python.display()
        );
    }
    Ok(python)
}
