//! Section `python-upstream` (`cargo xtask bench --only python-upstream`):
//! the reference `rocm_kpack` library API on a ROCm library build's job,
//! kpack's wheel against upstream's pure-Python package, side by side in
//! one run.
//!
//! Upstream's package is not on PyPI: `$KPACK_UPSTREAM_PYTHON` names its
//! `python/` directory (`cargo xtask bench` passes it on, made absolute;
//! without it the rows say it is missing). Two virtual environments, both with PyPI's
//! `msgpack` and `zstandard` (from the wheelhouse of `$KPACK_PY_VENV`): one
//! with upstream's package on its path, one with kpack's release wheel
//! (`$KPACK_PY_WHEEL`); both provide `rocm_kpack`, hence two.
//!
//! `kpack-bench/c/python_upstream.py` runs the job in each: per archive
//! `PackedKernelArchive` + `ZstdCompressor(3)` or `NoOpCompressor`,
//! `prepare_kernel` on a thread pool, `add_kernel`, `finalize_archive`,
//! `write`; then `PackedKernelArchive.read` and `get_kernel` of every
//! kernel. Shapes: (a) 50 archives × 3 kernels, (b) 142 code objects into
//! 50 archives, (c) one archive of 300 kernels, (d) 200 archives × 1
//! kernel; kernels are prefixes of the real code objects of librocsparse
//! (gfx1030) and librocrand, 10 kB to 500 kB (log-uniform). The floor of
//! each shape is the same script with `--floor`: what any implementation
//! must do (the thread pool's hand-off, compressing with a context kept
//! per thread, writing and reading the bytes, decompressing), without
//! `rocm_kpack`; no package can beat upstream by more than upstream's time
//! over it. The three run alternately, twice each (in two orders), `reps`
//! runs every time; each row's time is the median of pack + read.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use xshell::{cmd, Shell};

use crate::context::Ctx;
use crate::report::{FloorRatio, Row, Stats, Target};

/// Names upstream's `python/` directory.
pub const UPSTREAM_ENV: &str = "KPACK_UPSTREAM_PYTHON";
/// Libraries whose code objects the kernels are cut from (those installed),
/// and the target to take (all when `None`).
const SOURCES: &[(&str, Option<&str>)] = &[
    (
        "/usr/lib/x86_64-linux-gnu/librocsparse.so.0.1",
        Some("gfx1030"),
    ),
    ("/usr/lib/x86_64-linux-gnu/librocrand.so.1.1", None),
];
/// Kernel sizes, bytes (log-uniform between).
const SIZES: (u64, u64) = (10_000, 500_000);
const SHAPES: &[&str] = &["a", "b", "c", "d"];
const COMPRESSORS: &[&str] = &["zstd", "none"];
/// kpack's speed over upstream's required on every shape.
const SPEEDUP: f64 = 2.0;

section!(
    "python-upstream",
    "the reference rocm_kpack API on a library build's job: kpack's wheel against upstream's pure-Python package (KPACK_UPSTREAM_PYTHON)",
    run
);

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let work = "the reference API: kpack's wheel against upstream's rocm_kpack";
    let upstream = match std::env::var_os(UPSTREAM_ENV) {
        Some(p) if Path::new(&p).join("rocm_kpack/kpack.py").is_file() => PathBuf::from(p),
        Some(p) => {
            let why = format!("upstream's package is missing: no rocm_kpack/kpack.py in {p:?}");
            return Ok(vec![Row::unavailable(NAME, "all", work, why)]);
        }
        None => {
            let why = format!(
                "upstream's package is missing: ${UPSTREAM_ENV} is not set (set it to the python/ directory of upstream's rocm-kpack, e.g. the copy vendored beside the repository)"
            );
            return Ok(vec![Row::unavailable(NAME, "all", work, why)]);
        }
    };
    let dir = ctx.work.join(NAME);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let kernels = dir.join("kernels");
    if extract_sources(ctx, &kernels)? == 0 {
        let why = "no code objects: neither librocsparse0 nor librocrand1 is installed".into();
        return Ok(vec![Row::unavailable(NAME, "all", work, why)]);
    }
    let sh = Shell::new()?;
    let envs = Envs::make(&sh, &dir, &upstream)?;
    let runs = envs.measure(&sh, ctx, &kernels, &dir.join("out"))?;
    Ok(rows(&runs))
}

/// Write the code objects of the installed [`SOURCES`] into `out`; returns
/// how many.
fn extract_sources(ctx: &Ctx, out: &Path) -> Result<usize> {
    let sh = Shell::new()?;
    let kpack = &ctx.kpack;
    let mut n = 0;
    for (i, (lib, target)) in SOURCES.iter().enumerate() {
        if !Path::new(lib).is_file() {
            continue;
        }
        let to = out.join(i.to_string());
        let target: Vec<&str> = target.iter().flat_map(|t| ["--target", t]).collect();
        cmd!(sh, "{kpack} extract {lib} -o {to} {target...}")
            .quiet()
            .ignore_stdout()
            .run()?;
        for e in std::fs::read_dir(&to)? {
            let e = e?;
            std::fs::rename(e.path(), out.join(format!("{i}-{n}.hsaco")))?;
            n += 1;
        }
        std::fs::remove_dir(&to)?;
    }
    Ok(n)
}

/// The two environments' interpreters.
struct Envs {
    upstream: PathBuf,
    kpack: PathBuf,
}

impl Envs {
    fn make(sh: &Shell, dir: &Path, upstream: &Path) -> Result<Envs> {
        let whl = std::env::var_os("KPACK_PY_WHEEL")
            .context("$KPACK_PY_WHEEL (the wheel to measure; `cargo xtask bench` builds it)")?;
        let up = venv(sh, &dir.join("venv-upstream"), &[])?;
        // Upstream's package on the path, as `pip install -e` would put it.
        let site = cmd!(
            sh,
            "{up} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'"
        )
        .read()?;
        std::fs::write(
            Path::new(site.trim()).join("rocm_kpack_upstream.pth"),
            format!("{}\n", upstream.display()),
        )?;
        let kp = venv(sh, &dir.join("venv-kpack"), &[whl])?;
        Ok(Envs {
            upstream: up,
            kpack: kp,
        })
    }

    /// Run upstream's job, kpack's and the floor alternately; the runs of
    /// each.
    fn measure(&self, sh: &Shell, ctx: &Ctx, kernels: &Path, out: &Path) -> Result<[Value; 3]> {
        let mut got: [Vec<Value>; 3] = Default::default();
        for order in [[0, 1, 2], [2, 1, 0]] {
            for which in order {
                let python = [&self.upstream, &self.kpack, &self.upstream][which];
                got[which].push(job(sh, ctx, python, kernels, out, which == 2)?);
            }
        }
        let [up, kp, floor] = got.map(merge);
        let file = ctx.root.join("target/bench/python-upstream.json");
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let all = json!({"upstream": up, "kpack": kp, "floor": floor});
        std::fs::write(&file, serde_json::to_string_pretty(&all)?)?;
        Ok([up, kp, floor])
    }
}

/// A virtual environment of `$KPACK_PY_VENV`'s Python with msgpack,
/// zstandard and `extra` installed offline; its interpreter.
fn venv(sh: &Shell, env: &Path, extra: &[std::ffi::OsString]) -> Result<PathBuf> {
    let base = std::env::var_os("KPACK_PY_VENV").context("$KPACK_PY_VENV")?;
    let base = PathBuf::from(base);
    let python = base.join("bin/python");
    let house = base.join("wheelhouse");
    cmd!(sh, "{python} -m venv --without-pip {env}").run()?;
    let target = env.join("bin/python");
    cmd!(sh, "{python} -m pip --python {target} install --quiet --no-index --disable-pip-version-check --find-links {house} zstandard msgpack {extra...}")
        .run()
        .with_context(|| format!("installing into {}", env.display()))?;
    Ok(target)
}

/// One run of `python_upstream.py` under `python` (of the floor job with
/// `floor`).
fn job(
    sh: &Shell,
    ctx: &Ctx,
    python: &Path,
    kernels: &Path,
    out: &Path,
    floor: bool,
) -> Result<Value> {
    let script = ctx.root.join("kpack-bench/c/python_upstream.py");
    let reps = ctx.reps.max(3).to_string();
    let (lo, hi) = (SIZES.0.to_string(), SIZES.1.to_string());
    let flag: &[&str] = if floor { &["--floor"] } else { &[] };
    let text = cmd!(
        sh,
        "{python} {script} {kernels} {out} {reps} {lo} {hi} {flag...}"
    )
    .read()
    .with_context(|| format!("{} under {}", script.display(), python.display()))?;
    Ok(serde_json::from_str(text.trim())?)
}

/// One package's runs of several jobs: the first job's shapes with the
/// runs of all of them.
fn merge(jobs: Vec<Value>) -> Value {
    let mut it = jobs.into_iter();
    let mut first = it.next().unwrap_or(Value::Null);
    for other in it {
        for s in SHAPES {
            for c in COMPRESSORS {
                for k in ["pack_s", "read_s"] {
                    let more = other["shapes"][s][c][k]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    if let Some(v) = first["shapes"][s][c][k].as_array_mut() {
                        v.extend(more);
                    }
                }
            }
        }
    }
    first
}

/// Pack + read of each run.
fn totals(v: &Value) -> Vec<f64> {
    let f = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .collect()
    };
    f("pack_s")
        .iter()
        .zip(f("read_s"))
        .map(|(p, r)| p + r)
        .collect()
}

fn median(v: &Value, k: &str) -> f64 {
    let runs: Vec<f64> = v[k]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_f64)
        .collect();
    Stats::of(runs).map_or(f64::NAN, |s| s.median)
}

/// A row per shape and compressor for each package and the floor (kpack's
/// against both), and the targets over all of them.
fn rows(runs: &[Value; 3]) -> Vec<Row> {
    let [up, kp, floor] = runs;
    let mut rows = Vec::new();
    let mut speedups = Vec::new();
    for s in SHAPES {
        for c in COMPRESSORS {
            let shape = &kp["shapes"][s];
            let runs = [&up["shapes"][s][c], &shape[c], &floor["shapes"][s][c]];
            let what = format!(
                "{} ({} kernels, {:.1} MB), {}",
                shape["what"].as_str().unwrap_or(s),
                shape["kernels"],
                shape["bytes"].as_f64().unwrap_or(0.0) / 1e6,
                if *c == "zstd" {
                    "ZstdCompressor(3)"
                } else {
                    "NoOpCompressor"
                }
            );
            let id = format!("{s}_{c}");
            let [urow, frow, mut krow] = [
                (format!("{id}_upstream"), "upstream rocm_kpack", runs[0]),
                (format!("{id}_floor"), "floor", runs[2]),
                (id.clone(), "kpack rocm_kpack", runs[1]),
            ]
            .map(|(id, who, v)| {
                let mut r = Row::new(NAME, &id, format!("{who}: {what}"));
                r.wall_s = Stats::of(totals(v));
                r
            });
            krow.bytes_in = shape["bytes"].as_u64();
            let (Some(ut), Some(kt), Some(_)) = (urow.wall(), krow.wall(), frow.wall()) else {
                continue;
            };
            speedups.push((id, ut / kt));
            compare(&mut krow, &urow, &frow, runs);
            print_pair(&what, runs, ut / kt);
            rows.extend([urow, frow, krow]);
        }
    }
    rows.push(summary(&speedups));
    rows
}

/// kpack's row against upstream's and the floor's, with the target.
fn compare(krow: &mut Row, urow: &Row, frow: &Row, runs: [&Value; 3]) {
    let (ut, kt, ft) = (
        urow.wall().unwrap_or(f64::NAN),
        krow.wall().unwrap_or(f64::NAN),
        frow.wall().unwrap_or(f64::NAN),
    );
    for (floor, t) in [(urow, ut), (frow, ft)] {
        krow.floors.push(FloorRatio {
            floor: floor.id.clone(),
            ratio: kt / t,
        });
    }
    krow.targets.push(Target::at_most(
        format!(
            "≥ {SPEEDUP}× upstream's speed (here {:.2}×; at most {:.2}× for any package)",
            ut / kt,
            ut / ft
        ),
        kt / ut,
        1.0 / SPEEDUP,
    ));
    let [u, k, f] = runs;
    krow.details = json!({
        "upstream_pack_s": median(u, "pack_s"), "upstream_read_s": median(u, "read_s"),
        "kpack_pack_s": median(k, "pack_s"), "kpack_read_s": median(k, "read_s"),
        "floor_pack_s": median(f, "pack_s"), "floor_read_s": median(f, "read_s"),
        "speedup": ut / kt,
        "most_any_package_could": ut / ft,
    });
}

fn print_pair(what: &str, runs: [&Value; 3], speedup: f64) {
    let ms = |v: &Value, key: &str| median(v, key) * 1e3;
    let [u, k, f] = runs;
    println!(
        "python-upstream: {what}: upstream pack {:.1} ms read {:.1} ms; kpack pack {:.1} ms read {:.1} ms; floor pack {:.1} ms read {:.1} ms; {speedup:.2}x upstream",
        ms(u, "pack_s"),
        ms(u, "read_s"),
        ms(k, "pack_s"),
        ms(k, "read_s"),
        ms(f, "pack_s"),
        ms(f, "read_s")
    );
}

/// The targets over every shape: at least [`SPEEDUP`]×, and never slower.
fn summary(speedups: &[(String, f64)]) -> Row {
    let mut row = Row::new(
        NAME,
        "every_shape",
        "kpack against upstream, every shape above",
    );
    let worst = speedups
        .iter()
        .map(|(_, s)| *s)
        .fold(f64::INFINITY, f64::min);
    let worst_id = speedups
        .iter()
        .find(|(_, s)| *s == worst)
        .map_or("", |(id, _)| id.as_str());
    row.targets.push(Target::at_most(
        format!("≥ {SPEEDUP}× upstream on every shape (slowest: {worst_id}, {worst:.2}×)"),
        1.0 / worst,
        1.0 / SPEEDUP,
    ));
    row.targets.push(Target::at_most(
        "never slower than upstream",
        1.0 / worst,
        1.0,
    ));
    row.details = json!({ "speedups": speedups.iter().map(|(id, s)| json!({"shape": id, "speedup": s})).collect::<Vec<_>>() });
    row
}
