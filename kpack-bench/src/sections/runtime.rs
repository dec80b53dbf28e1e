//! The runtime, measured through the C API as users get it:
//! `kpack-bench/c/kpack_bench.c` compiled against the release
//! `librocm_kpack.a` (prelinked, as installed).
//!
//! Archives: librocsparse's per-target archives (`kpack offload`), one
//! archive holding all of librocsparse's code objects (every target;
//! written here with `ArchiveWriter`, keys `librocsparse.so.0.1#N`),
//! librocrand's per-target archives (for the 1.7 MB code object), and an
//! uncompressed (scheme `none`) archive of the targets of librocsparse's
//! median and largest code objects, for the zero-copy loads.
//!
//! Floors of a load: the same zstd frame decompressed into a reused buffer
//! with a reused context, in process, by the system's libzstd (Debian's,
//! through the C program) and by kpack's bundled zstd (the `zstd` crate, as
//! the library links it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kpack_format::archive::Scheme;
use kpack_format::hipk::HipkMetadata;
use kpack_format::msgpack::Value;
use kpack_host::ArchiveWriter;
use kpack_testkit::cprog::Program;
use serde_json::json;

use crate::args;
use crate::context::Ctx;
use crate::measure::{resident, timed, warm};
use crate::report::{fmt_bytes, FloorRatio, Row, Stats, Target};
use kpack_testkit::inputs::rocm::{ROCRAND, ROCSPARSE};
use kpack_testkit::tree::remove;

/// The librocrand code object of the warm-load target (1.7 MB).
const WARM_TARGET_SIZE: usize = 1_716_776;

/// A code object chosen for a measurement.
#[derive(Debug, Clone)]
struct Pick {
    bundle: usize,
    target: String,
    size: usize,
}

impl Pick {
    fn agent(&self) -> String {
        format!("amdgcn-amd-amdhsa--{}", self.target)
    }

    /// `target#bundle`: the key of its decompression floor.
    fn key(&self) -> String {
        format!("{}#{}", self.target, self.bundle)
    }
}

/// The code objects of a fat binary: (bundle, target, size), sorted by
/// size (then bundle, target).
fn sizes(path: &Path) -> Result<Vec<Pick>> {
    let mapped = kpack_loader::map_file(path)?;
    let cos = kpack_host::offload::code_objects(path, &mapped)?;
    let mut v: Vec<Pick> = cos
        .iter()
        .map(|c| Pick {
            bundle: c.bundle,
            target: c.target.clone(),
            size: c.data.len(),
        })
        .collect();
    v.sort_by(|a, b| (a.size, a.bundle, &a.target).cmp(&(b.size, b.bundle, &b.target)));
    Ok(v)
}

/// One archive with every code object of `input`, keys `<name>#N`.
fn write_all_targets(input: &Path, name: &str, out: &Path) -> Result<(u64, f64)> {
    let mapped = kpack_loader::map_file(input)?;
    let cos = kpack_host::offload::code_objects(input, &mapped)?;
    let mut targets: Vec<String> = cos.iter().map(|c| c.target.clone()).collect();
    targets.sort();
    targets.dedup();
    let group = name.split('.').next().unwrap_or(name).to_string();
    let mut w = ArchiveWriter::new(group, "all", targets);
    for c in &cos {
        w.add(
            kpack_host::offload::archive_key(name, c.bundle),
            c.target.clone(),
            c.source(&mapped),
            Some(vec![("target".to_string(), Value::from(c.triple.as_str()))]),
        )?;
    }
    let t0 = Instant::now();
    let s = w.write(out)?;
    Ok((s.bytes_out, t0.elapsed().as_secs_f64()))
}

/// One uncompressed (scheme `none`) archive with every code object of
/// `input` for `targets`, keys `<name>#N`.
fn write_uncompressed(input: &Path, name: &str, targets: &[&str], out: &Path) -> Result<u64> {
    let mapped = kpack_loader::map_file(input)?;
    let cos = kpack_host::offload::code_objects(input, &mapped)?;
    let group = name.split('.').next().unwrap_or(name).to_string();
    let arches: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
    let mut w = ArchiveWriter::new(group, targets[0], arches).scheme(Scheme::None);
    for c in cos.iter().filter(|c| targets.contains(&c.target.as_str())) {
        w.add(
            kpack_host::offload::archive_key(name, c.bundle),
            c.target.clone(),
            c.source(&mapped),
            None,
        )?;
    }
    Ok(w.write(out)?.bytes_out)
}

/// The zstd frame of `data` as the archive writer makes it (level 3,
/// content size and checksum).
fn frame_of(data: &[u8], checksum: bool) -> Result<Vec<u8>> {
    let mut c = zstd::bulk::Compressor::new(3)?;
    c.include_checksum(checksum)?;
    c.include_contentsize(true)?;
    Ok(c.compress(data)?)
}

/// The bytes of code object (bundle, target) of `path`.
fn code_object(path: &Path, pick: &Pick) -> Result<Vec<u8>> {
    let mapped = kpack_loader::map_file(path)?;
    let cos = kpack_host::offload::code_objects(path, &mapped)?;
    cos.iter()
        .find(|c| c.bundle == pick.bundle && c.target == pick.target)
        .map(|c| c.data.to_vec())
        .context("code object not found")
}

/// The floor of a load: decompressing the code object's zstd frame (level
/// 3, content size and checksum, as the archive writer makes it) with the
/// same zstd library, one reused context and output buffer. Per run, the
/// median of `iterations`. (`checksum` false: a frame without the content
/// checksum, to show what verifying it costs.)
fn decompress_floor(
    data: &[u8],
    checksum: bool,
    reps: usize,
    iterations: usize,
) -> Result<Vec<f64>> {
    let frame = frame_of(data, checksum)?;
    let mut d = zstd::bulk::Decompressor::new()?;
    let mut buf = Vec::with_capacity(data.len());
    let mut runs = Vec::new();
    for _ in 0..reps {
        let mut t = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            buf.clear();
            let t0 = Instant::now();
            d.decompress_to_buffer(&frame[..], &mut buf)?;
            t.push(t0.elapsed().as_secs_f64());
        }
        if buf != data {
            bail!("zstd round trip differs");
        }
        runs.push(Stats::of(t).map_or(f64::NAN, |s| s.median));
    }
    Ok(runs)
}

fn write_metadata(path: &Path, kernel_name: &str, search_path: &str) -> Result<()> {
    let m = HipkMetadata::new(kernel_name.to_string(), vec![search_path.to_string()]);
    std::fs::write(path, m.encode())?;
    Ok(())
}

/// Figures printed by the C program: name → (median, p10, p90, min, max,
/// n, bytes), times in µs.
fn parse_lines(out: &str) -> Vec<(String, Vec<f64>)> {
    out.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?.to_string();
            let v: Vec<f64> = it.filter_map(|x| x.parse().ok()).collect();
            Some((name, v))
        })
        .collect()
}

fn run_c(exe: &Path, args: &[std::ffi::OsString]) -> Result<String> {
    let out = Command::new(exe)
        .args(args)
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!(
            "{} {:?} failed ({}): {}",
            exe.display(),
            args,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The C program, built against the release static library as it is
/// installed (prelinked, as `cargo xtask dist` does).
fn build_program(ctx: &Ctx, dir: &Path) -> Result<PathBuf> {
    let exe = dir.join("kpack_bench");
    let lib = kpack_testkit::cprog::prelinked(
        &ctx.root.join("target/release"),
        &dir.join("lib"),
        &dir.join("include"),
    )?;
    let mut c = Program::c("c11");
    c.strict()
        .cc()
        .opt_level(2)
        .debug(false)
        .include(ctx.root.join("kpack-cxx/include"));
    c.input(ctx.root.join("kpack-bench/c/kpack_bench.c"))
        .static_runtime(&lib)
        .link(&exe)?;
    Ok(exe)
}

/// Where a measured code object is read from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// The one archive holding all of librocsparse's code objects.
    All,
    /// librocsparse's per-target archives.
    SparsePerTarget,
    /// librocrand's per-target archives.
    RandPerTarget,
    /// The uncompressed archive (scheme `none`).
    Uncompressed,
}

/// A target on a latency: its text and its limit (seconds).
type Limit = (&'static str, f64);

/// A latency configuration: which code object, in which archive.
struct Latency<'a> {
    /// Row ids start with it (`all_median_cold`).
    id: &'static str,
    label: &'static str,
    source: Source,
    pick: &'a Pick,
    iterations: usize,
    /// Also a row for kpack_open + kpack_close.
    open_close: bool,
    /// The targets of the cold and of the warm load, if any.
    cold_target: Option<Limit>,
    warm_target: Option<Limit>,
    /// The warm load's limit as a multiple of the system libzstd floor.
    warm_vs_floor: Option<f64>,
    /// Also a row for a warm load followed by reading every page.
    touch: bool,
}

impl<'a> Latency<'a> {
    fn new(
        id: &'static str,
        label: &'static str,
        source: Source,
        pick: &'a Pick,
        iterations: usize,
    ) -> Self {
        Latency {
            id,
            label,
            source,
            pick,
            iterations,
            open_close: false,
            cold_target: None,
            warm_target: None,
            warm_vs_floor: None,
            touch: false,
        }
    }

    fn with_warm_vs_floor(mut self, limit: f64) -> Self {
        self.warm_vs_floor = Some(limit);
        self
    }

    fn with_touch(mut self) -> Self {
        self.touch = true;
        self
    }

    fn with_open_close(mut self) -> Self {
        self.open_close = true;
        self
    }

    fn with_cold_target(mut self, t: Limit) -> Self {
        self.cold_target = Some(t);
        self
    }

    fn with_warm_target(mut self, t: Limit) -> Self {
        self.warm_target = Some(t);
        self
    }
}

/// The latency configurations, in the order they are measured.
fn latencies(p: &Picks) -> [Latency<'_>; 7] {
    use Source::{All, RandPerTarget, SparsePerTarget, Uncompressed};
    [
        Latency::new("all_median", "median code object", All, &p.median, 200)
            .with_open_close()
            .with_cold_target(("≤ 2 ms", 2e-3))
            .with_warm_vs_floor(1.1),
        Latency::new("all_largest", "largest code object", All, &p.largest, 20),
        Latency::new(
            "pt_median",
            "median code object",
            SparsePerTarget,
            &p.median,
            200,
        )
        .with_open_close()
        .with_warm_vs_floor(1.1),
        Latency::new(
            "pt_largest",
            "largest code object",
            SparsePerTarget,
            &p.largest,
            20,
        ),
        Latency::new(
            "rand",
            "librocrand code object",
            RandPerTarget,
            &p.warm,
            100,
        )
        .with_warm_vs_floor(1.1),
        Latency::new(
            "none_median",
            "median code object",
            Uncompressed,
            &p.median,
            200,
        )
        .with_touch(),
        Latency::new(
            "none_largest",
            "largest code object",
            Uncompressed,
            &p.largest,
            200,
        )
        .with_warm_target(("≤ 50 µs", 50e-6))
        .with_touch(),
    ]
}

/// The code objects measured.
struct Picks {
    /// How many code objects librocsparse has, and their bytes.
    count: usize,
    device_bytes: usize,
    /// librocsparse's median and largest code objects.
    median: Pick,
    largest: Pick,
    /// The librocrand code object nearest `WARM_TARGET_SIZE`.
    warm: Pick,
}

impl Picks {
    fn of(sparse: &Path, rand: &Path) -> Result<Picks> {
        let cos = sizes(sparse)?;
        let median = cos[cos.len() / 2].clone();
        let largest = cos[cos.len() - 1].clone();
        let warm = sizes(rand)?
            .into_iter()
            .min_by_key(|c| c.size.abs_diff(WARM_TARGET_SIZE))
            .context("librocrand has no code objects")?;
        Ok(Picks {
            count: cos.len(),
            device_bytes: cos.iter().map(|c| c.size).sum(),
            median,
            largest,
            warm,
        })
    }
}

/// The metadata of the loads, one per kind of archive.
struct Metadata {
    all: PathBuf,
    per_target: PathBuf,
    rand: PathBuf,
    uncompressed: PathBuf,
}

impl Metadata {
    /// Write it in `dir`: search paths `all`, and the per-target archives
    /// under `sparse_dir` and `rand_dir`.
    fn write(
        dir: &Path,
        sparse_dir: &Path,
        rand_dir: &Path,
        all: &Path,
        uncompressed: &Path,
    ) -> Result<Metadata> {
        let m = Metadata {
            all: dir.join("meta-all"),
            per_target: dir.join("meta-per-target"),
            rand: dir.join("meta-rand"),
            uncompressed: dir.join("meta-uncompressed"),
        };
        let sparse_name = ROCSPARSE.file_name();
        write_metadata(&m.all, sparse_name, &all.display().to_string())?;
        write_metadata(
            &m.uncompressed,
            sparse_name,
            &uncompressed.display().to_string(),
        )?;
        write_metadata(
            &m.per_target,
            sparse_name,
            &format!(
                "{}/librocsparse_@GFXARCH@.kpack",
                sparse_dir.join("arch").display()
            ),
        )?;
        write_metadata(
            &m.rand,
            ROCRAND.file_name(),
            &format!(
                "{}/librocrand_@GFXARCH@.kpack",
                rand_dir.join("arch").display()
            ),
        )?;
        Ok(m)
    }
}

/// The inputs of the measurements: per-target archives as `kpack offload`
/// writes them, one archive of all of librocsparse's code objects, the
/// metadata pointing at them, and the code objects measured.
struct Setup {
    /// The offload outputs of librocsparse and librocrand (binary and
    /// `arch/`).
    sparse_dir: PathBuf,
    rand_dir: PathBuf,
    /// The all-targets archive, its size, how long writing it took, and its
    /// description in the rows.
    all: PathBuf,
    all_size: u64,
    all_write_s: f64,
    all_desc: String,
    /// The uncompressed archive, and its size.
    uncompressed: PathBuf,
    uncompressed_size: u64,
    picks: Picks,
    meta: Metadata,
    /// librocsparse's per-target archives, sorted.
    pt_archives: Vec<PathBuf>,
}

impl Setup {
    /// Offload both libraries, write the all-targets archive and the
    /// metadata, and warm the outputs.
    fn prepare(ctx: &Ctx, dir: &Path) -> Result<Setup> {
        let sparse = Path::new(ROCSPARSE.path);
        let sparse_dir = dir.join("sparse");
        let rand_dir = dir.join("rand");
        eprintln!("runtime: offloading librocsparse and librocrand");
        offload(ctx, dir, sparse, &sparse_dir, ROCSPARSE.file_name())?;
        offload(
            ctx,
            dir,
            Path::new(ROCRAND.path),
            &rand_dir,
            ROCRAND.file_name(),
        )?;
        eprintln!("runtime: writing one archive with all of librocsparse's code objects");
        let all = sparse_dir.join("librocsparse_all.kpack");
        let (all_size, all_write_s) = write_all_targets(sparse, ROCSPARSE.file_name(), &all)?;
        let picks = Picks::of(sparse, Path::new(ROCRAND.path))?;
        eprintln!("runtime: writing an uncompressed archive of two of librocsparse's targets");
        let uncompressed = sparse_dir.join("librocsparse_none.kpack");
        let mut targets = vec![picks.median.target.as_str(), picks.largest.target.as_str()];
        targets.dedup();
        let uncompressed_size =
            write_uncompressed(sparse, ROCSPARSE.file_name(), &targets, &uncompressed)?;
        let meta = Metadata::write(dir, &sparse_dir, &rand_dir, &all, &uncompressed)?;
        let pt_archives = kpack_files(&sparse_dir.join("arch"))?;
        warm(&[&sparse_dir, &rand_dir])?;
        let all_desc = format!(
            "all-targets archive ({} kernels, {})",
            picks.count,
            fmt_bytes(all_size as f64)
        );
        Ok(Setup {
            sparse_dir,
            rand_dir,
            all,
            all_size,
            all_write_s,
            all_desc,
            uncompressed,
            uncompressed_size,
            picks,
            meta,
            pt_archives,
        })
    }

    /// The archive holding `pick` in `source`.
    fn archive(&self, source: Source, pick: &Pick) -> PathBuf {
        match source {
            Source::All => self.all.clone(),
            Source::SparsePerTarget => per_target(&self.sparse_dir, "librocsparse", &pick.target),
            Source::RandPerTarget => per_target(&self.rand_dir, "librocrand", &pick.target),
            Source::Uncompressed => self.uncompressed.clone(),
        }
    }

    fn meta(&self, source: Source) -> &Path {
        match source {
            Source::All => &self.meta.all,
            Source::SparsePerTarget => &self.meta.per_target,
            Source::RandPerTarget => &self.meta.rand,
            Source::Uncompressed => &self.meta.uncompressed,
        }
    }

    /// The offloaded binary whose code objects `source` holds.
    fn binary(&self, source: Source) -> PathBuf {
        match source {
            Source::All | Source::SparsePerTarget | Source::Uncompressed => {
                self.sparse_dir.join(ROCSPARSE.file_name())
            }
            Source::RandPerTarget => self.rand_dir.join(ROCRAND.file_name()),
        }
    }

    /// `source` in the rows' text.
    fn where_(&self, source: Source) -> &str {
        match source {
            Source::All => &self.all_desc,
            Source::SparsePerTarget => "librocsparse per-target archive",
            Source::RandPerTarget => "librocrand per-target archive",
            Source::Uncompressed => "uncompressed archive (scheme none, no copy)",
        }
    }
}

/// `kpack offload input -o out_dir/name --archive-dir out_dir/arch`, in
/// `dir`: per-target archives as users get them.
fn offload(ctx: &Ctx, dir: &Path, input: &Path, out_dir: &Path, name: &str) -> Result<()> {
    timed(
        &ctx.kpack,
        &args![
            "offload",
            input,
            "-o",
            out_dir.join(name),
            "--archive-dir",
            out_dir.join("arch")
        ],
        dir,
    )?;
    Ok(())
}

/// The per-target archive of `group` for `target`, under `offload_dir`.
fn per_target(offload_dir: &Path, group: &str, target: &str) -> PathBuf {
    offload_dir
        .join("arch")
        .join(kpack_host::offload::archive_file_name(group, target))
}

/// The `.kpack` files in `dir`, sorted.
fn kpack_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "kpack"))
        .collect();
    v.sort();
    Ok(v)
}

/// Per-figure medians of each run (µs), and the last run's lines.
type Figures = Vec<(String, Vec<f64>)>;

/// Run the C program's latency mode `reps` times on `l` (with the floor's
/// frame, for a warm load checked against it, interleaved with it).
fn latency(
    exe: &Path,
    dir: &Path,
    reps: usize,
    s: &Setup,
    l: &Latency,
) -> Result<(Figures, String)> {
    let mut per: Vec<(String, Vec<f64>)> = Vec::new();
    let mut last = String::new();
    let frame = match l.warm_vs_floor {
        Some(_) => format!("frame={}", frame_file(dir, l.pick).display()),
        None => String::new(),
    };
    for _ in 0..reps {
        let out = run_c(
            exe,
            &args![
                "latency",
                s.archive(l.source, l.pick),
                s.meta(l.source),
                s.binary(l.source),
                l.pick.agent(),
                l.pick.bundle.to_string(),
                l.iterations.to_string(),
                if l.touch { "touch" } else { "" },
                &frame
            ],
        )?;
        for (name, v) in parse_lines(&out) {
            let median = v.first().copied().unwrap_or(f64::NAN);
            match per.iter_mut().find(|(n, _)| *n == name) {
                Some((_, runs)) => runs.push(median),
                None => per.push((name, vec![median])),
            }
        }
        last = out;
    }
    Ok((per, last))
}

fn figure(f: &Figures, name: &str) -> Option<Stats> {
    f.iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| Stats::of(v.iter().map(|us| us / 1e6).collect()))
}

fn latency_row(
    id: &str,
    work: String,
    figures: &Figures,
    name: &str,
    last: &str,
    size: usize,
) -> Row {
    let mut row = Row::new(NAME, id, work);
    row.wall_s = figure(figures, name);
    row.bytes_out = Some(size as u64);
    let line = last
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_default();
    row.details = json!({"last_run": line, "fields": "name median p10 p90 min max n bytes (µs)"});
    row
}

/// The decompression floors, each keyed by its code object (`Pick::key`).
type Floors = Vec<(String, Row)>;

/// Floors: the decompression alone of each code object measured, by the
/// system's libzstd (in the C program) and by kpack's bundled zstd.
fn floor_rows(exe: &Path, dir: &Path, reps: usize, p: &Picks) -> Result<Floors> {
    let mut floors = Vec::new();
    for (id, pick, bin, iterations) in [
        ("median", &p.median, ROCSPARSE.path, 200),
        ("largest", &p.largest, ROCSPARSE.path, 20),
        ("rand", &p.warm, ROCRAND.path, 100),
    ] {
        eprintln!("runtime: floors of {id}");
        let data = code_object(Path::new(bin), pick)?;
        let system = libzstd_floor_row(exe, dir, reps, id, pick, &data, iterations)?;
        let mut bundled = floor_row(reps, &format!("decompress_{id}"), pick, &data, iterations)?;
        if let (Some(b), Some(s)) = (bundled.wall(), system.wall()) {
            bundled.floors.push(FloorRatio {
                floor: system.id.clone(),
                ratio: b / s,
            });
            bundled.targets.push(Target::at_most(
                "not slower than system libzstd (≤ 1.05×, noise)",
                b / s,
                1.05,
            ));
        }
        floors.push((pick.key(), system));
        floors.push((pick.key(), bundled));
    }
    Ok(floors)
}

/// The floor of `pick` by the system's libzstd: the C program decompresses
/// the frame (as the archive writer makes it) `iterations` times per run.
fn libzstd_floor_row(
    exe: &Path,
    dir: &Path,
    reps: usize,
    id: &str,
    pick: &Pick,
    data: &[u8],
    iterations: usize,
) -> Result<Row> {
    let frame_file = frame_file(dir, pick);
    std::fs::write(&frame_file, frame_of(data, true)?)?;
    let mut runs = Vec::new();
    let mut version = String::new();
    for _ in 0..reps {
        let out = run_c(
            exe,
            &args![
                "floor",
                &frame_file,
                data.len().to_string(),
                iterations.to_string()
            ],
        )?;
        for line in out.lines() {
            if let Some(v) = line.strip_prefix("libzstd_version ") {
                version = v.to_string();
            }
        }
        for (name, v) in parse_lines(&out) {
            if name == "libzstd_floor" {
                runs.push(v.first().copied().unwrap_or(f64::NAN) / 1e6);
            }
        }
    }
    let mut row = Row::new(
        NAME,
        &format!("libzstd_{id}"),
        format!(
            "floor: system libzstd {version} decompressing the same frame (reused context and buffer, in process), {} #{} ({})",
            pick.target,
            pick.bundle,
            fmt_bytes(pick.size as f64)
        ),
    );
    row.wall_s = Stats::of(runs);
    row.bytes_out = Some(pick.size as u64);
    row.details = json!({ "libzstd_version": version });
    Ok(row)
}

/// Where the floor's frame of `pick` is written (in the section's work
/// directory).
fn frame_file(dir: &Path, pick: &Pick) -> PathBuf {
    dir.join(format!("frame-{}.zst", pick.key().replace([':', '#'], "_")))
}

/// The decompression floor of `pick` by kpack's bundled zstd (the `zstd`
/// crate, as librocm_kpack links it), with and without the content
/// checksum.
fn floor_row(reps: usize, id: &str, pick: &Pick, data: &[u8], iterations: usize) -> Result<Row> {
    let mut row = Row::new(
        NAME,
        id,
        format!(
            "floor: kpack's bundled zstd {} decompressing the same frame (reused context and buffer), {} #{} ({})",
            zstd::zstd_safe::version_string(),
            pick.target,
            pick.bundle,
            fmt_bytes(pick.size as f64)
        ),
    );
    row.wall_s = Stats::of(decompress_floor(data, true, reps, iterations)?);
    row.bytes_out = Some(pick.size as u64);
    row.details = json!({
        "without_content_checksum_s":
            Stats::of(decompress_floor(data, false, reps, iterations)?),
    });
    Ok(row)
}

/// `row`'s ratios to the floors of the same code object.
fn floor_ratios(floors: &Floors, pick: &Pick, row: &Row) -> Vec<FloorRatio> {
    let key = pick.key();
    floors
        .iter()
        .filter(|(k, _)| *k == key)
        .filter_map(|(_, f)| {
            Some(FloorRatio {
                floor: f.id.clone(),
                ratio: row.wall()? / f.wall()?,
            })
        })
        .collect()
}

/// The loads of a latency run: row id suffix, the C program's figure, the
/// row's text.
const LOADS: [(&str, &str, &str); 3] = [
    ("cold", "cold_load", "cold first load (create+load+destroy)"),
    ("warm", "warm_load", "warm load"),
    (
        "warm_touch",
        "warm_load_touch",
        "warm load, then reading every page of it",
    ),
];

/// The rows of one latency configuration: kpack_open + kpack_close (where
/// asked), the cold and the warm load.
fn latency_rows(
    exe: &Path,
    dir: &Path,
    reps: usize,
    s: &Setup,
    l: &Latency,
    floors: &Floors,
) -> Result<Vec<Row>> {
    eprintln!("runtime: latency {}", l.id);
    let archive = s.archive(l.source, l.pick);
    let resident_before = resident(&[&archive]);
    let (f, last) = latency(exe, dir, reps, s, l)?;
    let mut rows = Vec::new();
    if l.open_close {
        rows.push(open_close_row(s, l, &f, &last, &archive));
    }
    let co = format!(
        "{} ({}, {} #{})",
        l.label,
        fmt_bytes(l.pick.size as f64),
        l.pick.target,
        l.pick.bundle
    );
    let where_ = s.where_(l.source);
    for ((suffix, name, text), target) in
        LOADS.into_iter().zip([l.cold_target, l.warm_target, None])
    {
        if suffix == "warm_touch" && !l.touch {
            continue;
        }
        let mut row = latency_row(
            &format!("{}_{suffix}", l.id),
            format!("{text}, {co}, {where_}"),
            &f,
            name,
            &last,
            l.pick.size,
        );
        row.floors = floor_ratios(floors, l.pick, &row);
        row.input_resident = Some(resident_before);
        if let (Some((text, limit)), Some(w)) = (target, row.wall()) {
            row.targets.push(Target::at_most(text, w, limit));
        }
        // Against the system libzstd decompressing the same frame in the
        // same process, interleaved with the loads (the noise of a busy
        // machine falls on both).
        if let (Some(limit), "warm", Some(w), Some(floor)) = (
            l.warm_vs_floor,
            suffix,
            row.wall(),
            figure(&f, "warm_floor"),
        ) {
            let ratio = w / floor.median;
            row.floors.insert(
                0,
                FloorRatio {
                    floor: "libzstd_same_process".into(),
                    ratio,
                },
            );
            row.targets.push(Target::at_most(
                format!("≤ {limit}× system libzstd, same process"),
                ratio,
                limit,
            ));
            if let Some(d) = row.details.as_object_mut() {
                d.insert("system_libzstd_same_process_s".into(), json!(floor));
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

/// kpack_open + kpack_close of `archive`.
fn open_close_row(s: &Setup, l: &Latency, f: &Figures, last: &str, archive: &Path) -> Row {
    let desc = match l.source {
        Source::All => s.all_desc.as_str(),
        _ => "per-target archive",
    };
    let mut r = latency_row(
        &format!("{}_open_close", l.id),
        format!("kpack_open + kpack_close, {desc}"),
        f,
        "open_close",
        last,
        0,
    );
    r.bytes_out = None;
    r.bytes_in = std::fs::metadata(archive).ok().map(|m| m.len());
    r
}

/// kpack_get_kernel over every kernel: of the all-targets archive, and of
/// the per-target archives.
fn get_kernel_rows(exe: &Path, reps: usize, s: &Setup) -> Result<Vec<Row>> {
    [
        (
            "get_all_all",
            format!("kpack_get_kernel × every kernel, {}", s.all_desc),
            vec![s.all.clone()],
        ),
        (
            "get_all_pt",
            format!(
                "kpack_get_kernel × every kernel, {} per-target archives",
                s.pt_archives.len()
            ),
            s.pt_archives.clone(),
        ),
    ]
    .into_iter()
    .map(|(id, work, archives)| {
        eprintln!("runtime: {id}");
        get_kernel_row(exe, reps, id, work, &archives)
    })
    .collect()
}

/// What the C program's get-all mode printed over the runs.
#[derive(Default)]
struct GetKernel {
    /// Each run's pass over every kernel, seconds.
    passes: Vec<f64>,
    /// The last run's per-call figures (µs, see `parse_lines`).
    each: Vec<f64>,
    /// The bytes of the kernels got.
    bytes: Option<u64>,
}

/// One pass per process (a fresh kpack_open each time), `reps` processes.
fn measure_get_kernel(exe: &Path, reps: usize, archives: &[PathBuf]) -> Result<GetKernel> {
    let mut a = args!["get-all", "1"].to_vec();
    a.extend(archives.iter().map(std::ffi::OsString::from));
    let mut g = GetKernel::default();
    for _ in 0..reps {
        for (k, v) in parse_lines(&run_c(exe, &a)?) {
            match k.as_str() {
                "get_kernel_all" => {
                    g.passes.push(v.first().copied().unwrap_or(f64::NAN) / 1e6);
                    g.bytes = v.get(6).map(|b| *b as u64);
                }
                "get_kernel_each" => g.each = v,
                _ => {}
            }
        }
    }
    Ok(g)
}

fn get_kernel_row(
    exe: &Path,
    reps: usize,
    id: &str,
    work: String,
    archives: &[PathBuf],
) -> Result<Row> {
    let g = measure_get_kernel(exe, reps, archives)?;
    let mut row = Row::new(NAME, id, work);
    row.wall_s = Stats::of(g.passes);
    row.bytes_in = archives
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).ok())
        .sum();
    row.bytes_out = g.bytes;
    let each = g.each;
    row.details = json!({
        "kernels": each.get(6),
        "per_call_median_us": each.first(),
        "per_call_p10_us": each.get(1),
        "per_call_p90_us": each.get(2),
        "per_call_max_us": each.get(4),
    });
    Ok(row)
}

/// Memory of a loader process after one load.
fn memory_rows(exe: &Path, reps: usize, s: &Setup) -> Result<Vec<Row>> {
    let p = &s.picks;
    [
        ("mem_all_median", &p.median, Source::All),
        ("mem_all_largest", &p.largest, Source::All),
        ("mem_pt_largest", &p.largest, Source::SparsePerTarget),
    ]
    .into_iter()
    .map(|(id, pick, source)| {
        eprintln!("runtime: {id}");
        memory_row(exe, reps, s, id, pick, source)
    })
    .collect()
}

/// What the C program's memory mode printed over the runs (KiB).
#[derive(Default)]
struct Memory {
    hwm: Vec<f64>,
    rss: Vec<f64>,
    rss_before: Vec<f64>,
}

/// Run the C program's memory mode `reps` times: one load of `pick`.
fn measure_memory(
    exe: &Path,
    reps: usize,
    meta: &Path,
    binary: &Path,
    pick: &Pick,
) -> Result<Memory> {
    let mut m = Memory::default();
    for _ in 0..reps {
        let out = run_c(
            exe,
            &args![
                "memory",
                meta,
                binary,
                pick.agent(),
                pick.bundle.to_string()
            ],
        )?;
        for (k, v) in parse_lines(&out) {
            let x = v.first().copied().unwrap_or(f64::NAN);
            match k.as_str() {
                "hwm_kb" => m.hwm.push(x),
                "rss_kb" => m.rss.push(x),
                "rss_before_kb" => m.rss_before.push(x),
                _ => {}
            }
        }
    }
    Ok(m)
}

/// The peak memory of a loader of `pick` in `source`, against the
/// limit.
fn memory_row(
    exe: &Path,
    reps: usize,
    s: &Setup,
    id: &str,
    pick: &Pick,
    source: Source,
) -> Result<Row> {
    let m = measure_memory(exe, reps, s.meta(source), &s.binary(source), pick)?;
    let which = if pick.size == s.picks.largest.size {
        "largest"
    } else {
        "median"
    };
    let mut row = Row::new(
        NAME,
        id,
        format!(
            "loader process after one load (VmHWM), {which} code object ({}), {}",
            fmt_bytes(pick.size as f64),
            s.where_(source)
        ),
    );
    row.peak_rss_kib = Stats::of(m.hwm);
    row.bytes_out = Some(pick.size as u64);
    let limit_kib = (1.5 * pick.size as f64 + 16.0 * 1024.0 * 1024.0) / 1024.0;
    if let Some(h) = row.peak_rss_kib.as_ref().map(|s| s.median) {
        row.targets.push(Target::at_most(
            format!("≤ 1.5× kernel + 16 MiB ({:.1} MiB)", limit_kib / 1024.0),
            h,
            limit_kib,
        ));
    }
    row.details = json!({
        "vm_rss_kib": Stats::of(m.rss),
        "vm_rss_before_load_kib": Stats::of(m.rss_before),
        "kernel_bytes": pick.size,
    });
    Ok(row)
}

/// How many processes hold the same code object at once.
const HOLDERS: usize = 4;

/// PSS of `HOLDERS` processes holding the largest code object at once:
/// loaded from the uncompressed archive (private mappings of one file: one
/// page-cache copy, shared), and from a compressed one for comparison
/// (decompressed: a copy each).
fn pss_rows(exe: &Path, reps: usize, s: &Setup) -> Result<Vec<Row>> {
    let pick = &s.picks.largest;
    let mut rows = Vec::new();
    for (id, source, limit) in [
        ("pss_none_largest", Source::Uncompressed, Some(1.3)),
        ("pss_pt_largest", Source::SparsePerTarget, None),
    ] {
        eprintln!("runtime: {id}");
        let mut totals = Vec::new();
        let mut processes = Vec::new();
        for _ in 0..reps {
            let (co, whole) = measure_pss(exe, s.meta(source), &s.binary(source), pick)?;
            totals.push(co.iter().sum::<f64>());
            processes.push(whole);
        }
        let mut row = Row::new(
            NAME,
            id,
            format!(
                "{HOLDERS} processes holding the largest code object ({}), {}: total PSS of the code object",
                fmt_bytes(pick.size as f64),
                s.where_(source)
            ),
        );
        let kib = pick.size as f64 / 1024.0;
        row.peak_rss_kib = Stats::of(totals.clone());
        row.bytes_out = Some(pick.size as u64);
        if let (Some(limit), Some(t)) = (limit, Stats::of(totals.clone())) {
            row.targets.push(Target::at_most(
                format!("total ≤ {limit}× one copy"),
                t.median / kib,
                limit,
            ));
        }
        row.details = json!({
            "total_pss_of_the_code_object_kib": totals,
            "copies": Stats::of(totals.iter().map(|t| t / kib).collect()),
            "whole_process_pss_kib": processes,
        });
        rows.push(row);
    }
    Ok(rows)
}

/// Start `HOLDERS` processes that each load `pick` and read it, then read
/// their PSS: of the pages holding the code object (KiB, per process), and
/// of the whole process.
fn measure_pss(
    exe: &Path,
    meta: &Path,
    binary: &Path,
    pick: &Pick,
) -> Result<(Vec<f64>, Vec<f64>)> {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut children = Vec::new();
    let mut held = Vec::new();
    for _ in 0..HOLDERS {
        let mut child = Command::new(exe)
            .args(args![
                "hold",
                meta,
                binary,
                pick.agent(),
                pick.bundle.to_string()
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        let mut it = line.split_whitespace().skip(1);
        let addr: u64 = it.next().context("hold: no address")?.parse()?;
        let size: u64 = it.next().context("hold: no size")?.parse()?;
        held.push((child.id(), addr, size));
        children.push(child);
    }
    // All of them hold it now.
    let mut co = Vec::new();
    let mut whole = Vec::new();
    for &(pid, addr, size) in &held {
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
        co.push(pss_in(&smaps, addr, addr + size));
        whole.push(pss_in(&smaps, 0, u64::MAX));
    }
    for mut c in children {
        drop(c.stdin.take());
        c.wait()?;
    }
    Ok((co, whole))
}

/// The PSS (KiB) of the mappings of `smaps` that overlap `start..end`.
fn pss_in(smaps: &str, start: u64, end: u64) -> f64 {
    let mut total = 0.0;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or_default();
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                inside = a < end && start < b;
                continue;
            }
        }
        if let (true, Some(v)) = (inside, line.strip_prefix("Pss:")) {
            total += v
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .unwrap_or(0.0);
        }
    }
    total
}

/// The row saying why nothing is measured, if a library is missing.
fn missing_library() -> Option<Row> {
    [ROCSPARSE.path, ROCRAND.path]
        .into_iter()
        .find(|p| !Path::new(p).is_file())
        .map(|p| Row::not_installed(NAME, "all", "runtime", p))
}

/// The section's inputs, in the details of its first row.
fn describe_inputs(rows: &mut [Row], s: &Setup) {
    if let Some(r) = rows.first_mut() {
        r.details = json!({
            "all_targets_archive_bytes": s.all_size,
            "uncompressed_archive_bytes": s.uncompressed_size,
            "all_targets_archive_write_seconds": s.all_write_s,
            "device_code_bytes": s.picks.device_bytes,
            "code_objects": s.picks.count,
            "last_run": r.details.get("last_run"),
        });
    }
}

section!(
    "runtime",
    "the C API against the release librocm_kpack.a: open, cold and warm loads, kpack_get_kernel over every kernel, memory after one load",
    run
);

/// The section's rows: latencies, their floors, kpack_get_kernel over
/// every kernel, memory.
pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    if let Some(row) = missing_library() {
        return Ok(vec![row]);
    }
    let dir = ctx.work.join(NAME);
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let exe = build_program(ctx, &dir)?;
    let s = Setup::prepare(ctx, &dir)?;
    let floors = floor_rows(&exe, &dir, ctx.reps, &s.picks)?;
    let mut rows = Vec::new();
    for l in &latencies(&s.picks) {
        rows.extend(latency_rows(&exe, &dir, ctx.reps, &s, l, &floors)?);
    }
    rows.extend(floors.into_iter().map(|(_, r)| r));
    rows.extend(get_kernel_rows(&exe, ctx.reps, &s)?);
    rows.extend(memory_rows(&exe, ctx.reps, &s)?);
    rows.extend(pss_rows(&exe, ctx.reps, &s)?);
    describe_inputs(&mut rows, &s);
    Ok(rows)
}
