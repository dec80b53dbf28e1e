//! Compressed bundles: kpack on librocsparse re-bundled into
//! CCOB v3 bundles inside a linked library ([`kpack_testkit::inputs::ccob`]), against
//! the floor of the same bytes measured in the same run: `zstd -d` of the
//! compressed bundles' payloads piped into `zstd -3 -T1` (two processes on
//! two cores: the decompression that cannot be avoided and the compression
//! kpack does).
//!
//! Rows: offload, split, extract and pack-tree of the 1× library, restore
//! of its offloaded form (peak RSS ≤ 256 MiB each; offload and split ≤ 1.2×
//! the floor); `ls` of the 4× library (≤ 1 s, ≤ 32 MiB); offload of the 1×,
//! 2× and 4× libraries (peak RSS must not grow with the bundles: 4×'s ≤
//! 1.25× 1×'s); `split-wheels -j 2` of a torch-like wheel holding two such
//! libraries (≤ 256 MiB). The archives offload writes are checked to be
//! byte-identical to those of the same bundles stored plainly (the plain
//! twin of [`kpack_testkit::inputs::ccob::plain_twin`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::json;

use super::split_wheels::{split_wheels_args, TORCH};
use crate::args;
use crate::context::Ctx;
use crate::measure::{load_average, note_load, resident, timed, tree_size, warm, Runs};
use crate::report::{FloorRatio, Row, Stats, Target};
use kpack_testkit::inputs::ccob::{self, library, plain_twin, CompressedLib};
use kpack_testkit::inputs::rocm::ROCSPARSE;
use kpack_testkit::tree::{link_or_copy, remove};

const RSS_LIMIT_MIB: f64 = 256.0;
const FLOOR_FACTOR: f64 = 1.2;
const LS_LIMIT_S: f64 = 1.0;
const LS_RSS_MIB: f64 = 32.0;
/// Most peak RSS may grow from 1× to 4× the bundles.
const GROWTH: f64 = 1.25;

section!(
    "compressed",
    "offload, split, extract, pack-tree, restore, ls and split-wheels of librocsparse re-bundled into compressed bundles (clang-19, lld-19)",
    run
);

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    if !Path::new(ROCSPARSE.path).is_file() {
        return Ok(vec![Row::not_installed(
            NAME,
            "offload",
            "offload, compressed librocsparse",
            ROCSPARSE.path,
        )]);
    }
    let libs = [
        library(&ctx.root, &[0])?,
        library(&ctx.root, &[0, 1])?,
        library(&ctx.root, &[0, 1, 2, 3])?,
    ];
    let wheel = ccob::wheel(&ctx.root, &ctx.work)?;
    let dir = ctx.work.join(NAME);
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let load_before = load_average();
    let identical = same_archives_as_plain(ctx, &libs[0], &dir)?;
    let m = measure(ctx, &libs, &wheel, &dir)?;
    let load_after = load_average();
    remove(&dir)?;
    let mut rows = rows(&libs, &wheel, &m, identical);
    note_load(&mut rows, load_before, load_after);
    Ok(rows)
}

/// The runs of every measured process.
#[derive(Default)]
struct Measured {
    floor: Runs,
    offload: [Runs; 3],
    split: Runs,
    extract: Runs,
    pack_tree: Runs,
    restore: Runs,
    ls: Runs,
    wheel: Runs,
    /// Sizes of the last outputs.
    offload_out: u64,
    split_out: u64,
    wheel_out: u64,
}

fn offload_args(lib: &Path, out: &Path) -> Vec<OsString> {
    args![
        "offload",
        lib,
        "-o",
        out.join(ROCSPARSE.file_name()),
        "--archive-dir",
        out.join(".kpack"),
        "--json"
    ]
    .to_vec()
}

/// Where the measured processes read and write, under the section's
/// directory.
struct Paths {
    /// An artifact holding the 1× library (split's input).
    artifact: PathBuf,
    /// An install tree holding it (pack-tree's input).
    tree: PathBuf,
    offload: PathBuf,
    split: PathBuf,
    extract: PathBuf,
    pack_tree: PathBuf,
    restored: PathBuf,
    wheel_out: PathBuf,
    wheel_tmp: PathBuf,
}

impl Paths {
    /// The paths, the inputs laid out (hard links to the 1× library).
    fn lay_out(dir: &Path, one: &CompressedLib) -> Result<Paths> {
        let p = Paths {
            artifact: dir.join("artifacts/sparse_lib_gfx-all"),
            tree: dir.join("tree"),
            offload: dir.join("offload"),
            split: dir.join("split"),
            extract: dir.join("extract"),
            pack_tree: dir.join("pack-tree"),
            restored: dir.join("restored.so"),
            wheel_out: dir.join("wheel-out"),
            wheel_tmp: dir.join("wheel-tmp"),
        };
        let stage = p.artifact.join("stage/lib");
        std::fs::create_dir_all(&stage)?;
        std::fs::write(p.artifact.join("artifact_manifest.txt"), "stage\n")?;
        link_or_copy(&one.path, &stage.join(ROCSPARSE.file_name()))?;
        link_or_copy(&one.path, &p.tree.join("lib").join(ROCSPARSE.file_name()))?;
        Ok(p)
    }
}

/// The floor's shell command: the 1× library's payloads decompressed,
/// piped into `zstd -3 -T1`.
fn floor_command(one: &CompressedLib) -> String {
    let payloads: Vec<String> = one
        .payloads
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    format!(
        "zstd -q -d -c {} | zstd -q -3 -T1 -c > /dev/null",
        payloads.join(" ")
    )
}

fn measure(ctx: &Ctx, libs: &[CompressedLib; 3], wheel: &Path, dir: &Path) -> Result<Measured> {
    let one = &libs[0];
    let p = Paths::lay_out(dir, one)?;
    let payloads: Vec<&Path> = one.payloads.iter().map(|p| p.as_path()).collect();
    let mut inputs: Vec<&Path> = libs.iter().map(|l| l.path.as_path()).collect();
    inputs.extend(&payloads);
    inputs.push(wheel);
    warm(&inputs)?;
    let floor_cmd = floor_command(one);
    let mut m = Measured::default();
    for rep in 0..ctx.reps {
        eprintln!("  rep {}/{}", rep + 1, ctx.reps);
        let r = resident(&[&one.path]);
        m.floor.push(
            timed(Path::new("sh"), &args!["-c", &floor_cmd], &ctx.work)?,
            resident(&payloads),
        );
        measure_one(ctx, one, &p, r, &mut m)?;
        measure_scaling(ctx, libs, wheel, &p, &mut m)?;
    }
    Ok(m)
}

/// One run of each command on the 1× library (`r`: its residency before
/// offload).
fn measure_one(ctx: &Ctx, one: &CompressedLib, p: &Paths, r: f64, m: &mut Measured) -> Result<()> {
    let kpack = |a: &[OsString]| timed(&ctx.kpack, a, &ctx.work);
    let lib = ROCSPARSE.file_name();
    remove(&p.offload)?;
    m.offload[0].push(kpack(&offload_args(&one.path, &p.offload))?, r);
    m.offload_out = tree_size(&p.offload);
    remove(&p.restored)?;
    let a = args!["restore", p.offload.join(lib), "-o", &p.restored];
    m.restore.push(kpack(&a)?, 1.0);
    remove(&p.restored)?;
    remove(&p.offload)?;
    remove(&p.split)?;
    let a = args![
        "split",
        "--artifact-dir",
        &p.artifact,
        "--artifact-prefix",
        "sparse_lib",
        "--output-dir",
        &p.split,
        "--json"
    ];
    m.split.push(kpack(&a)?, resident(&[&one.path]));
    m.split_out = tree_size(&p.split);
    remove(&p.split)?;
    remove(&p.extract)?;
    let a = args!["extract", &one.path, "-o", &p.extract];
    m.extract.push(kpack(&a)?, resident(&[&one.path]));
    remove(&p.extract)?;
    remove(&p.pack_tree)?;
    let a = args![
        "pack-tree",
        "--input",
        &p.tree,
        "--output",
        &p.pack_tree,
        "--group-name",
        "sparse"
    ];
    m.pack_tree.push(kpack(&a)?, resident(&[&one.path]));
    remove(&p.pack_tree)
}

/// One run of `ls` of the 4× library, offload of the 2× and 4× ones, and
/// split-wheels of the wheel.
fn measure_scaling(
    ctx: &Ctx,
    libs: &[CompressedLib; 3],
    wheel: &Path,
    p: &Paths,
    m: &mut Measured,
) -> Result<()> {
    let kpack = |a: &[OsString]| timed(&ctx.kpack, a, &ctx.work);
    m.ls.push(
        kpack(&args!["ls", &libs[2].path])?,
        resident(&[&libs[2].path]),
    );
    for (i, lib) in libs.iter().enumerate().skip(1) {
        remove(&p.offload)?;
        let r = resident(&[&lib.path]);
        m.offload[i].push(kpack(&offload_args(&lib.path, &p.offload))?, r);
        remove(&p.offload)?;
    }
    remove(&p.wheel_out)?;
    let r = resident(&[wheel]);
    m.wheel.push(
        kpack(&split_wheels_args(wheel, &p.wheel_out, &p.wheel_tmp, TORCH))?,
        r,
    );
    m.wheel_out = tree_size(&p.wheel_out);
    remove(&p.wheel_out)
}

/// Offload the 1× library and its plain twin (the same host objects and
/// code objects, bundles stored plainly): whether every archive is
/// byte-identical.
fn same_archives_as_plain(ctx: &Ctx, one: &CompressedLib, dir: &Path) -> Result<bool> {
    let (a, b) = (dir.join("check-ccob"), dir.join("check-plain"));
    let twin_dir = dir.join("plain-twin");
    let twin = plain_twin(&ctx.root, &twin_dir)?;
    timed(&ctx.kpack, &offload_args(&one.path, &a), &ctx.work)?;
    timed(&ctx.kpack, &offload_args(&twin, &b), &ctx.work)?;
    remove(&twin_dir)?;
    let names = |d: &Path| -> Result<Vec<String>> {
        let mut v: Vec<String> = std::fs::read_dir(d.join(".kpack"))?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        v.sort();
        Ok(v)
    };
    let (na, nb) = (names(&a)?, names(&b)?);
    let mut same = na == nb && !na.is_empty();
    for n in &na {
        let (x, y) = (a.join(".kpack").join(n), b.join(".kpack").join(n));
        if same && std::fs::read(&x)? != std::fs::read(&y)? {
            eprintln!("archive {n} differs from the plain library's");
            same = false;
        }
    }
    remove(&a)?;
    remove(&b)?;
    Ok(same)
}

fn median(r: &Runs) -> f64 {
    Stats::of(r.wall.clone()).map_or(f64::NAN, |s| s.median)
}

fn worst_rss_mib(r: &Runs) -> f64 {
    Stats::of(r.rss.clone()).map_or(f64::NAN, |s| s.max) / 1024.0
}

fn describe(l: &CompressedLib) -> String {
    format!(
        "{} compressed bundles holding {} bundles, {:.2} GB decompressed (largest {:.0} MB), file {:.0} MB",
        l.ccobs,
        l.bundles,
        l.decompressed as f64 / 1e9,
        l.largest as f64 / 1e6,
        std::fs::metadata(&l.path).map_or(0, |m| m.len()) as f64 / 1e6
    )
}

fn file_size(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

fn rss_target(r: &Runs) -> Target {
    Target::at_most(
        format!("peak RSS ≤ {RSS_LIMIT_MIB} MiB (worst run)"),
        worst_rss_mib(r),
        RSS_LIMIT_MIB,
    )
}

fn floor_target(r: &Runs, floor: f64) -> Target {
    Target::at_most(
        format!("≤ {FLOOR_FACTOR}× the floor (zstd -d into zstd -3 -T1)"),
        median(r) / floor,
        FLOOR_FACTOR,
    )
}

fn vs_floor(r: &Runs, floor: f64) -> Vec<FloorRatio> {
    vec![FloorRatio {
        floor: format!("{NAME}.floor"),
        ratio: median(r) / floor,
    }]
}

fn rows(libs: &[CompressedLib; 3], wheel: &Path, m: &Measured, identical: bool) -> Vec<Row> {
    let mut rows = one_rows(&libs[0], m, identical);
    rows.extend(scaling_rows(libs, wheel, m));
    rows
}

/// The rows of the 1× library: the floor, offload, split, extract,
/// pack-tree and restore.
fn one_rows(one: &CompressedLib, m: &Measured, identical: bool) -> Vec<Row> {
    let floor = median(&m.floor);
    let mut row = Row::new(
        NAME,
        "floor",
        "floor: zstd -d of the compressed bundles' payloads, piped into zstd -3 -T1, 1× library",
    );
    m.floor.fill(&mut row);
    row.bytes_in = Some(one.payloads.iter().map(|p| file_size(p)).sum());
    row.details = json!({ "decompressed_bytes": one.decompressed });
    let mut rows = vec![row];

    let mut row = Row::new(NAME, "offload", "offload, 1× compressed librocsparse");
    m.offload[0].fill(&mut row);
    row.bytes_in = Some(file_size(&one.path));
    row.bytes_out = Some(m.offload_out);
    row.compression_ratio = Some(one.code_bytes as f64 / m.offload_out.max(1) as f64);
    row.floors = vs_floor(&m.offload[0], floor);
    row.targets = vec![
        floor_target(&m.offload[0], floor),
        rss_target(&m.offload[0]),
        Target::at_most(
            "archives byte-identical to offloading the same bundles stored plainly (0 = yes)",
            if identical { 0.0 } else { 1.0 },
            0.0,
        ),
    ];
    row.details = json!({ "input": describe(one) });
    rows.push(row);

    let mut row = Row::new(
        NAME,
        "split",
        "split, 1× compressed librocsparse (one artifact)",
    );
    m.split.fill(&mut row);
    row.bytes_in = Some(file_size(&one.path));
    row.bytes_out = Some(m.split_out);
    row.floors = vs_floor(&m.split, floor);
    row.targets = vec![floor_target(&m.split, floor), rss_target(&m.split)];
    rows.push(row);

    for (id, work, runs) in [
        ("extract", "extract, 1× compressed librocsparse", &m.extract),
        (
            "pack_tree",
            "pack-tree, tree holding the 1× compressed librocsparse",
            &m.pack_tree,
        ),
        (
            "restore",
            "restore of the offloaded 1× compressed librocsparse",
            &m.restore,
        ),
    ] {
        let mut row = Row::new(NAME, id, work);
        runs.fill(&mut row);
        row.bytes_in = Some(file_size(&one.path));
        row.floors = vs_floor(runs, floor);
        row.targets = vec![rss_target(runs)];
        rows.push(row);
    }
    rows
}

/// The rows of the larger inputs: ls of the 4× library, offload of the 2×
/// and 4× ones (memory against the 1×'s), split-wheels of the wheel.
fn scaling_rows(libs: &[CompressedLib; 3], wheel: &Path, m: &Measured) -> Vec<Row> {
    let mut row = Row::new(NAME, "ls", "ls, 4× compressed librocsparse");
    m.ls.fill(&mut row);
    row.bytes_in = Some(file_size(&libs[2].path));
    row.targets = vec![
        Target::at_most(format!("≤ {LS_LIMIT_S} s"), median(&m.ls), LS_LIMIT_S),
        Target::at_most(
            format!("peak RSS ≤ {LS_RSS_MIB} MiB (worst run)"),
            worst_rss_mib(&m.ls),
            LS_RSS_MIB,
        ),
    ];
    row.details = json!({ "input": describe(&libs[2]) });
    let mut rows = vec![row];

    let base = worst_rss_mib(&m.offload[0]);
    for (i, mult) in [(1, 2), (2, 4)] {
        let mut row = Row::new(
            NAME,
            &format!("offload_{mult}x"),
            format!("offload, {mult}× compressed librocsparse (memory against the bundles)"),
        );
        m.offload[i].fill(&mut row);
        row.bytes_in = Some(file_size(&libs[i].path));
        row.targets = vec![
            rss_target(&m.offload[i]),
            Target::at_most(
                format!("peak RSS ≤ {GROWTH}× the 1× library's ({base:.0} MiB)"),
                worst_rss_mib(&m.offload[i]) / base,
                GROWTH,
            ),
        ];
        row.details = json!({ "input": describe(&libs[i]) });
        rows.push(row);
    }

    let mut row = Row::new(
        NAME,
        "split_wheels",
        "split-wheels -j 2, torch-like wheel (2 compressed librocsparse, distinct)",
    );
    m.wheel.fill(&mut row);
    row.bytes_in = Some(file_size(wheel));
    row.bytes_out = Some(m.wheel_out);
    row.targets = vec![rss_target(&m.wheel)];
    rows.push(row);
    rows
}
