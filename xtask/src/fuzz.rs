//! `cargo xtask fuzz`: run the cargo-fuzz targets of `fuzz/` (libFuzzer)
//! on seed corpora built from the test fixtures.
//!
//! Seeds go to `target/fuzz/seeds/<target>/` (rebuilt on every run, from
//! `target/fixtures` and the reference archives), the growing corpus to
//! `target/fuzz/corpus/<target>/`, libFuzzer's log to
//! `target/fuzz/logs/<target>.log`, crashes to `fuzz/artifacts/<target>/`.
//! With a nightly toolchain the targets are built with AddressSanitizer
//! (`--sanitizer` picks another, or `none` for speed); on stable they run
//! without sanitizers (`-s none`). Inputs are capped at 64 KiB.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use object::{Object, ObjectSection};
use xshell::{cmd, Shell};

use crate::fixtures::{self, FIXTURES_DIR};

/// Every target of `fuzz/Cargo.toml`, with what it exercises.
pub const TARGETS: &[(&str, &str)] = &[
    ("bundle", "offload bundles and CCOB (parse_fatbin)"),
    ("archive", ".kpack reader: header, TOC, kernel reads"),
    ("hipk", "HIPK metadata, slice and pointer window"),
    ("msgpack", "MessagePack decoder"),
    ("target_id", "target-ID parsing and matching"),
    (
        "capi",
        "C API on archive bytes: open, queries, get_kernel, load",
    ),
    (
        "offload",
        "ELF offload transform + verifier on fixture binaries",
    ),
];

/// Largest input libFuzzer may build.
const MAX_LEN: usize = 65536;

pub struct Options {
    pub seconds: u64,
    pub runs: Option<u64>,
    pub targets: Vec<String>,
    pub sanitizer: Option<String>,
    /// Targets run at the same time (one libFuzzer process each).
    pub parallel: usize,
    pub extra: Vec<String>,
}

pub fn run(sh: &Shell, root: &Path, opts: Options) -> Result<()> {
    let targets: Vec<&str> = if opts.targets.is_empty() {
        TARGETS.iter().map(|(t, _)| *t).collect()
    } else {
        for t in &opts.targets {
            if !TARGETS.iter().any(|(n, _)| n == t) {
                let known: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
                bail!("unknown fuzz target {t} (known: {})", known.join(", "));
            }
        }
        opts.targets.iter().map(String::as_str).collect()
    };
    let nightly = cmd!(sh, "rustup run nightly rustc --version")
        .quiet()
        .ignore_stdout()
        .ignore_stderr()
        .run()
        .is_ok();
    let sanitizer = match (&opts.sanitizer, nightly) {
        (Some(s), false) if s != "none" => {
            bail!("sanitizer {s} needs a nightly toolchain (rustup toolchain install nightly)")
        }
        (Some(s), _) => s.clone(),
        (None, true) => "address".into(),
        (None, false) => "none".into(),
    };
    let toolchain: &[&str] = if nightly { &["+nightly"] } else { &[] };
    let has_cargo_fuzz = cmd!(sh, "cargo fuzz --version")
        .quiet()
        .ignore_stdout()
        .ignore_stderr()
        .run()
        .is_ok();
    if !has_cargo_fuzz {
        println!("installing cargo-fuzz (cargo install cargo-fuzz)");
        cmd!(sh, "cargo install cargo-fuzz").run()?;
    }

    fixtures::build_all(sh, root, false)?;
    let seeds = make_seeds(sh, root)?;

    let out = root.join("target/fuzz");
    let fuzz_dir = root.join("fuzz");
    // Build every target once, before running any (runs may overlap).
    println!("== building fuzz targets (sanitizer {sanitizer})");
    let mut build = Command::new("cargo");
    build
        .args(toolchain)
        .args(["fuzz", "build", "--release", "--debug-assertions", "-s"])
        .arg(&sanitizer)
        .current_dir(&fuzz_dir)
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR");
    if !build
        .status()
        .context("running cargo fuzz build")?
        .success()
    {
        bail!("cargo fuzz build failed");
    }
    let queue = std::sync::Mutex::new(targets.clone().into_iter());
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..opts.parallel.max(1) {
            scope.spawn(|| loop {
                let Some(target) = queue.lock().unwrap().next() else {
                    break;
                };
                let r = run_one(
                    target, &opts, &sanitizer, toolchain, &out, &fuzz_dir, &seeds,
                );
                results.lock().unwrap().push(r);
            });
        }
    });
    let mut results: Vec<(&str, u64, bool)> = results
        .into_inner()
        .unwrap()
        .into_iter()
        .collect::<Result<_>>()?;
    results.sort_by_key(|r| targets.iter().position(|t| *t == r.0));
    println!("\n{:<10} {:>14}  result", "target", "executions");
    for (t, runs, ok) in &results {
        println!("{t:<10} {runs:>14}  {}", if *ok { "ok" } else { "FAILED" });
    }
    let failed: Vec<&str> = results.iter().filter(|r| !r.2).map(|r| r.0).collect();
    if !failed.is_empty() {
        bail!("fuzz targets failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Run one target; returns (target, executions, passed).
fn run_one<'t>(
    target: &'t str,
    opts: &Options,
    sanitizer: &str,
    toolchain: &[&str],
    out: &Path,
    fuzz_dir: &Path,
    seeds: &Path,
) -> Result<(&'t str, u64, bool)> {
    let corpus = out.join("corpus").join(target);
    let log = out.join("logs").join(format!("{target}.log"));
    fs::create_dir_all(&corpus)?;
    fs::create_dir_all(log.parent().expect("logs dir"))?;
    let mut args: Vec<String> = vec![
        format!("-max_len={MAX_LEN}"),
        format!("-max_total_time={}", opts.seconds),
        "-timeout=20".into(),
        "-rss_limit_mb=4096".into(),
        "-print_final_stats=1".into(),
    ];
    if let Some(r) = opts.runs {
        args.push(format!("-runs={r}"));
    }
    args.extend(opts.extra.iter().cloned());
    println!(
        "== fuzz {target} (sanitizer {sanitizer}{})",
        match opts.runs {
            Some(r) => format!(", up to {r} runs or {} s", opts.seconds),
            None => format!(", {} s", opts.seconds),
        }
    );
    let clock = Instant::now();
    let status = Command::new("cargo")
        .args(toolchain)
        .args(["fuzz", "run", "--release", "--debug-assertions", "-s"])
        .arg(sanitizer)
        .arg(target)
        .arg(&corpus)
        .arg(seeds.join(target))
        .arg("--")
        .args(&args)
        .current_dir(fuzz_dir)
        // Let `+nightly` pick the toolchain: not the cargo that runs us.
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR")
        .stdout(fs::File::create(&log)?)
        .stderr(fs::File::options().append(true).open(&log)?)
        .status()
        .context("running cargo fuzz")?;
    let text = fs::read_to_string(&log).unwrap_or_default();
    let runs = stat(&text, "stat::number_of_executed_units:")
        .or_else(|| done_runs(&text))
        .unwrap_or(0);
    let corpus_size = fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
    let crash = text
        .lines()
        .find(|l| l.contains("Test unit written to"))
        .map(str::to_owned);
    println!(
        "   {target}: {runs} executions in {:.0} s, corpus {corpus_size} inputs, {}",
        clock.elapsed().as_secs_f64(),
        if status.success() {
            "nothing found".to_string()
        } else {
            format!(
                "FAILED ({}; log {})",
                crash.as_deref().unwrap_or("see the log"),
                log.display()
            )
        }
    );
    Ok((target, runs, status.success()))
}

fn stat(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

/// `Done 123 runs in 60 second(s)`.
fn done_runs(text: &str) -> Option<u64> {
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix("Done "))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Build `target/fuzz/seeds/<target>/` from the fixtures: small real inputs
/// of each format. Returns the seeds directory.
fn make_seeds(sh: &Shell, root: &Path) -> Result<PathBuf> {
    let seeds = root.join("target/fuzz/seeds");
    if seeds.exists() {
        fs::remove_dir_all(&seeds)?;
    }
    let dir = |t: &str| -> Result<PathBuf> {
        let d = seeds.join(t);
        fs::create_dir_all(&d)?;
        Ok(d)
    };
    let put = |t: &str, name: &str, bytes: &[u8]| -> Result<()> {
        if bytes.len() <= MAX_LEN {
            fs::write(dir(t)?.join(name), bytes)?;
        }
        Ok(())
    };
    let fixtures_dir = root.join(FIXTURES_DIR);
    let reference = root.join("tests/data/reference-kpack");

    // ELF fixtures: whole binaries for the transform, .hip_fatbin sections
    // for the bundle parser.
    let mut elf_fixtures = Vec::new();
    for e in fs::read_dir(&fixtures_dir)? {
        let p = e?.path();
        let Ok(bytes) = fs::read(&p) else { continue };
        if !bytes.starts_with(b"\x7fELF") || p.file_name().is_some_and(|n| n == "dlcheck") {
            continue;
        }
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        put("offload", &name, &bytes)?;
        if let Some(section) = section(&bytes, ".hip_fatbin") {
            put("bundle", &format!("{name}.hip_fatbin"), &section)?;
            elf_fixtures.push(p.clone());
        }
    }

    // Archives: the reference ones, and kpack's own from offloading the
    // small fixtures (both schemes); their TOCs and HIPK metadata.
    let kpack = crate::debug_kpack(sh)?;
    let scratch = root.join("target/fuzz/scratch");
    if scratch.exists() {
        fs::remove_dir_all(&scratch)?;
    }
    let mut archives: Vec<(String, Vec<u8>)> = Vec::new();
    for name in ["test_noop.kpack", "test_zstd.kpack"] {
        archives.push((name.into(), fs::read(reference.join(name))?));
    }
    for (i, fixture) in elf_fixtures.iter().enumerate() {
        for compression in ["zstd", "none"] {
            let out = scratch.join(format!("{i}-{compression}"));
            let host = out.join("lib").join(fixture.file_name().unwrap());
            let archive_dir = out.join(".kpack");
            cmd!(
                sh,
                "{kpack} offload {fixture} -o {host} --archive-dir {archive_dir} --compression {compression}"
            )
            .quiet()
            .ignore_stdout()
            .run()?;
            let host_bytes = fs::read(&host)?;
            put("offload", &format!("offloaded-{i}"), &host_bytes)?;
            if let Some(meta) = section(&host_bytes, ".rocm_kpack_ref") {
                put("hipk", &format!("{i}.hipk"), &meta)?;
                put("msgpack", &format!("{i}.hipk"), &meta)?;
            }
            for e in fs::read_dir(&archive_dir)? {
                let p = e?.path();
                archives.push((
                    format!(
                        "{i}-{compression}-{}",
                        p.file_name().unwrap().to_string_lossy()
                    ),
                    fs::read(&p)?,
                ));
            }
        }
    }
    archives.sort_by_key(|(_, b)| b.len());
    for (name, bytes) in archives.iter().take(24) {
        put("archive", name, bytes)?;
        put("capi", name, bytes)?;
        if bytes.len() >= 16 {
            let toc = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
            if toc <= bytes.len() {
                put("msgpack", &format!("{name}.toc"), &bytes[toc..])?;
            }
        }
    }
    fs::remove_dir_all(&scratch)?;

    for (i, t) in [
        "gfx942:sramecc+:xnack-",
        "gfx90a:xnack+",
        "gfx1100",
        "gfx11-generic",
        "gfx9-4-generic:sramecc-:xnack+",
        "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-",
        "gfx942:sramecc+:xnack-\ngfx942:xnack-",
        "gfx90a:xnack-\ngfx90a:xnack+",
        "hipv4-amdgcn-amd-amdhsa--gfx1201",
        "host-x86_64-unknown-linux--",
    ]
    .iter()
    .enumerate()
    {
        put("target_id", &format!("{i}"), t.as_bytes())?;
    }
    let count = |t: &str| fs::read_dir(seeds.join(t)).map(|d| d.count()).unwrap_or(0);
    let summary: Vec<String> = TARGETS
        .iter()
        .map(|(t, _)| format!("{t} {}", count(t)))
        .collect();
    println!("seeds: {}", summary.join(", "));
    Ok(seeds)
}

/// The bytes of an ELF section, if the file has it with contents.
fn section(bytes: &[u8], name: &str) -> Option<Vec<u8>> {
    let file = object::File::parse(bytes).ok()?;
    let data = file.section_by_name(name)?.data().ok()?;
    (!data.is_empty()).then(|| data.to_vec())
}
