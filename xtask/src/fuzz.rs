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
use kpack_testkit::fixtures::{self, FIXTURES_DIR};
use object::{Object, ObjectSection};
use xshell::{cmd, Shell};

/// Every target of `fuzz/Cargo.toml`, with what it exercises.
pub const TARGETS: &[(&str, &str)] = &[
    ("bundle", "offload bundles and CCOB (parse_fatbin)"),
    (
        "bundle_stream",
        "bundles listed and streamed (list_fatbin, check_fatbin, FatbinStream) against parse_fatbin",
    ),
    ("archive", ".kpack reader: header, TOC, kernel reads"),
    ("hipk", "HIPK metadata, slice and pointer window"),
    (
        "wrappers",
        "wrapper-table layout: plain, padded (ASan) and mixed",
    ),
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
    let targets = select_targets(&opts)?;
    let (nightly, sanitizer) = pick_sanitizer(sh, &opts)?;
    let toolchain: &[&str] = if nightly { &["+nightly"] } else { &[] };
    ensure_cargo_fuzz(sh)?;
    // The seeds come from the fixtures, built by clang-19 and friends.
    crate::test::install_debian_packages(sh)?;

    fixtures::build_all(sh, root, false)?;
    let seeds = make_seeds(sh, root)?;

    let out = root.join("target/fuzz");
    let fuzz_dir = root.join("fuzz");
    build_targets(toolchain, &sanitizer, &fuzz_dir)?;
    let fuzz = Fuzz {
        opts: &opts,
        sanitizer: &sanitizer,
        toolchain,
        out: &out,
        fuzz_dir: &fuzz_dir,
        seeds: &seeds,
    };
    let results = fuzz.run_targets(&targets)?;
    report(results, &targets)
}

/// The targets asked for (all when none is), each checked against
/// [`TARGETS`].
fn select_targets(opts: &Options) -> Result<Vec<&str>> {
    if opts.targets.is_empty() {
        return Ok(TARGETS.iter().map(|(t, _)| *t).collect());
    }
    for t in &opts.targets {
        if !TARGETS.iter().any(|(n, _)| n == t) {
            let known: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
            bail!("unknown fuzz target {t} (known: {})", known.join(", "));
        }
    }
    Ok(opts.targets.iter().map(String::as_str).collect())
}

/// Whether a nightly toolchain is there, and the sanitizer to build with:
/// the one asked for (only `none` without nightly), else AddressSanitizer
/// on nightly and none on stable.
fn pick_sanitizer(sh: &Shell, opts: &Options) -> Result<(bool, String)> {
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
    Ok((nightly, sanitizer))
}

/// Install cargo-fuzz when it is missing.
fn ensure_cargo_fuzz(sh: &Shell) -> Result<()> {
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
    Ok(())
}

/// Build every target once, before running any (runs may overlap).
fn build_targets(toolchain: &[&str], sanitizer: &str, fuzz_dir: &Path) -> Result<()> {
    println!("== building fuzz targets (sanitizer {sanitizer})");
    let mut build = Command::new("cargo");
    build
        .args(toolchain)
        .args(["fuzz", "build", "--release", "--debug-assertions", "-s"])
        .arg(sanitizer)
        .current_dir(fuzz_dir)
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
    Ok(())
}

/// What every fuzz run shares: the options, the sanitizer, the toolchain
/// arguments, where corpora and logs go, the fuzz crate and the seeds.
struct Fuzz<'a> {
    opts: &'a Options,
    sanitizer: &'a str,
    toolchain: &'a [&'a str],
    out: &'a Path,
    fuzz_dir: &'a Path,
    seeds: &'a Path,
}

impl Fuzz<'_> {
    /// Run the targets, `opts.parallel` at a time ([`Fuzz::run_one`] each);
    /// their results in the order they finished.
    fn run_targets<'t>(&self, targets: &[&'t str]) -> Result<Vec<(&'t str, u64, bool)>> {
        let Fuzz { opts, .. } = self;
        let queue = std::sync::Mutex::new(targets.iter().copied());
        let results = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..opts.parallel.max(1) {
                scope.spawn(|| loop {
                    let Some(target) = queue.lock().unwrap().next() else {
                        break;
                    };
                    let r = self.run_one(target);
                    results.lock().unwrap().push(r);
                });
            }
        });
        results.into_inner().unwrap().into_iter().collect()
    }

    /// Run one target; returns (target, executions, passed).
    fn run_one<'t>(&self, target: &'t str) -> Result<(&'t str, u64, bool)> {
        let Fuzz {
            opts,
            sanitizer,
            toolchain,
            out,
            fuzz_dir,
            seeds,
        } = *self;
        let corpus = out.join("corpus").join(target);
        let log = out.join("logs").join(format!("{target}.log"));
        fs::create_dir_all(&corpus)?;
        fs::create_dir_all(log.parent().expect("logs dir"))?;
        let args = libfuzzer_args(opts);
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
        println!(
            "   {target}: {runs} executions in {:.0} s, corpus {corpus_size} inputs, {}",
            clock.elapsed().as_secs_f64(),
            outcome(status.success(), &text, &log)
        );
        Ok((target, runs, status.success()))
    }
}

/// Print the executions and result of every target, in `targets` order;
/// an error naming the targets that failed.
fn report(mut results: Vec<(&str, u64, bool)>, targets: &[&str]) -> Result<()> {
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

/// libFuzzer's flags for one run: the input cap, the time budget, limits,
/// `-runs` when asked, then the extra flags.
fn libfuzzer_args(opts: &Options) -> Vec<String> {
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
    args
}

/// How a run ended, for its summary line: nothing found, or what failed
/// (the crash libFuzzer wrote, from its log `text`) and where the log is.
fn outcome(success: bool, text: &str, log: &Path) -> String {
    if success {
        return "nothing found".to_string();
    }
    let crash = text
        .lines()
        .find(|l| l.contains("Test unit written to"))
        .map(str::to_owned);
    format!(
        "FAILED ({}; log {})",
        crash.as_deref().unwrap_or("see the log"),
        log.display()
    )
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

/// Writes seed inputs below the seeds directory, one directory per target.
struct Seeds {
    root: PathBuf,
}

impl Seeds {
    /// Write `bytes` as seed `name` of target `t`, unless it is longer than
    /// [`MAX_LEN`].
    fn put(&self, t: &str, name: &str, bytes: &[u8]) -> Result<()> {
        if bytes.len() <= MAX_LEN {
            let d = self.root.join(t);
            fs::create_dir_all(&d)?;
            fs::write(d.join(name), bytes)?;
        }
        Ok(())
    }

    /// Print how many seeds each target has.
    fn print_counts(&self) {
        let count = |t: &str| {
            fs::read_dir(self.root.join(t))
                .map(|d| d.count())
                .unwrap_or(0)
        };
        let summary: Vec<String> = TARGETS
            .iter()
            .map(|(t, _)| format!("{t} {}", count(t)))
            .collect();
        println!("seeds: {}", summary.join(", "));
    }
}

/// Build `target/fuzz/seeds/<target>/` from the fixtures: small real inputs
/// of each format. Returns the seeds directory.
fn make_seeds(sh: &Shell, root: &Path) -> Result<PathBuf> {
    let seeds = Seeds {
        root: root.join("target/fuzz/seeds"),
    };
    if seeds.root.exists() {
        fs::remove_dir_all(&seeds.root)?;
    }
    let elf_fixtures = elf_seeds(&seeds, &root.join(FIXTURES_DIR))?;
    let scratch = root.join("target/fuzz/scratch");
    let archives = archives_for_seeds(sh, root, &seeds, &elf_fixtures, &scratch)?;
    archive_seeds(&seeds, archives)?;
    fs::remove_dir_all(&scratch)?;
    target_id_seeds(&seeds)?;
    wrapper_table_seeds(&seeds)?;
    large_ccob_seed(sh, &seeds, &root.join("target/fuzz"))?;
    seeds.print_counts();
    Ok(seeds.root)
}

/// A compressed bundle that decompresses to more than
/// `kpack_bundle::LIST_CHECK_LIMIT` (1 MiB) but compresses to a few KiB:
/// listing reads only its entry table, streaming reads it in pieces. Its
/// payload is made by the `zstd` command (level 19); its hash is left 0
/// (kpack only reports a wrong hash).
fn large_ccob_seed(sh: &Shell, seeds: &Seeds, scratch: &Path) -> Result<()> {
    let triples = [
        "host-x86_64-unknown-linux--",
        "hipv4-amdgcn-amd-amdhsa--gfx1100",
        "hipv4-amdgcn-amd-amdhsa--gfx90a",
    ];
    let sizes = [0usize, 700 << 10, 600 << 10];
    let table: usize = 32 + triples.iter().map(|t| 24 + t.len()).sum::<usize>();
    let mut inner = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
    inner.extend((triples.len() as u64).to_le_bytes());
    let mut offset = table as u64;
    for (t, n) in triples.iter().zip(sizes) {
        inner.extend(offset.to_le_bytes());
        inner.extend((n as u64).to_le_bytes());
        inner.extend((t.len() as u64).to_le_bytes());
        inner.extend(t.as_bytes());
        offset += n as u64;
    }
    for (i, n) in sizes.iter().enumerate() {
        inner.extend((0..*n).map(|k| (k / 4096 + i) as u8));
    }
    fs::create_dir_all(scratch)?;
    let plain = scratch.join("large-ccob.bin");
    fs::write(&plain, &inner)?;
    let payload = cmd!(sh, "zstd -q -19 -c {plain}").quiet().output()?.stdout;
    fs::remove_file(&plain)?;
    let mut ccob = b"CCOB".to_vec();
    ccob.extend(3u16.to_le_bytes());
    ccob.extend(1u16.to_le_bytes());
    ccob.extend((32 + payload.len() as u64).to_le_bytes());
    ccob.extend((inner.len() as u64).to_le_bytes());
    ccob.extend(0u64.to_le_bytes());
    ccob.extend(payload);
    seeds.put("bundle_stream", "large-ccob-v3.bin", &ccob)?;
    seeds.put("bundle", "large-ccob-v3.bin", &ccob)
}

/// ELF fixtures: whole binaries for the transform, .hip_fatbin sections
/// for the bundle parser. Returns the fixtures that have device code.
fn elf_seeds(seeds: &Seeds, fixtures_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut elf_fixtures = Vec::new();
    for e in fs::read_dir(fixtures_dir)? {
        let p = e?.path();
        let Ok(bytes) = fs::read(&p) else { continue };
        if !bytes.starts_with(b"\x7fELF") || p.file_name().is_some_and(|n| n == "dlcheck") {
            continue;
        }
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        seeds.put("offload", &name, &bytes)?;
        if let Some(table) = section(&bytes, ".hipFatBinSegment") {
            seeds.put("wrappers", &name, &table)?;
        }
        if let Some(section) = section(&bytes, ".hip_fatbin") {
            seeds.put("bundle", &format!("{name}.hip_fatbin"), &section)?;
            seeds.put("bundle_stream", &format!("{name}.hip_fatbin"), &section)?;
            elf_fixtures.push(p.clone());
        }
    }
    Ok(elf_fixtures)
}

/// Archives: the reference ones, and kpack's own from offloading
/// `elf_fixtures` (both schemes, in `scratch`, which the caller removes);
/// the offloaded binaries and their HIPK metadata become seeds on the way.
fn archives_for_seeds(
    sh: &Shell,
    root: &Path,
    seeds: &Seeds,
    elf_fixtures: &[PathBuf],
    scratch: &Path,
) -> Result<Vec<(String, Vec<u8>)>> {
    let reference = root.join("tests/data/reference-kpack");
    let kpack = crate::debug_kpack(sh)?;
    if scratch.exists() {
        fs::remove_dir_all(scratch)?;
    }
    let mut archives: Vec<(String, Vec<u8>)> = Vec::new();
    for name in ["test_noop.kpack", "test_zstd.kpack"] {
        archives.push((name.into(), fs::read(reference.join(name))?));
    }
    for (i, fixture) in elf_fixtures.iter().enumerate() {
        for compression in ["zstd", "none"] {
            let out = scratch.join(format!("{i}-{compression}"));
            offload_seeds(sh, &kpack, seeds, fixture, &out, i, compression)?;
            for e in fs::read_dir(out.join(".kpack"))? {
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
    Ok(archives)
}

/// Offload fixture number `i` into `out` (`lib/` and `.kpack/`) with
/// `compression`; its host binary and HIPK metadata become seeds.
fn offload_seeds(
    sh: &Shell,
    kpack: &Path,
    seeds: &Seeds,
    fixture: &Path,
    out: &Path,
    i: usize,
    compression: &str,
) -> Result<()> {
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
    seeds.put("offload", &format!("offloaded-{i}"), &host_bytes)?;
    if let Some(meta) = section(&host_bytes, ".rocm_kpack_ref") {
        seeds.put("hipk", &format!("{i}.hipk"), &meta)?;
        seeds.put("msgpack", &format!("{i}.hipk"), &meta)?;
    }
    Ok(())
}

/// The 24 smallest archives, for the archive reader and the C API; their
/// TOCs for the MessagePack decoder.
fn archive_seeds(seeds: &Seeds, mut archives: Vec<(String, Vec<u8>)>) -> Result<()> {
    archives.sort_by_key(|(_, b)| b.len());
    for (name, bytes) in archives.iter().take(24) {
        seeds.put("archive", name, bytes)?;
        seeds.put("capi", name, bytes)?;
        if bytes.len() >= 16 {
            let toc = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
            if toc <= bytes.len() {
                seeds.put("msgpack", &format!("{name}.toc"), &bytes[toc..])?;
            }
        }
    }
    Ok(())
}

/// Wrapper tables as AddressSanitizer builds lay them out (formats.md
/// §4.1): 64-byte slots, and a plain record then padded ones.
fn wrapper_table_seeds(seeds: &Seeds) -> Result<()> {
    let record = |i: u8| {
        let mut r = [0u8; 24];
        r[..8].copy_from_slice(&[b'F', b'P', b'I', b'H', 1, 0, 0, 0]);
        r[16] = i;
        r
    };
    let mut asan = vec![0u8; 192];
    for i in 0..3 {
        asan[i * 64..i * 64 + 24].copy_from_slice(&record(i as u8));
    }
    seeds.put("wrappers", "asan-3", &asan)?;
    let mut mixed = vec![0u8; 160];
    for (i, at) in [0, 32, 96].into_iter().enumerate() {
        mixed[at..at + 24].copy_from_slice(&record(i as u8));
    }
    seeds.put("wrappers", "mixed", &mixed)
}

/// Target IDs and bundle entry IDs, valid and not, for target-ID parsing.
fn target_id_seeds(seeds: &Seeds) -> Result<()> {
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
        seeds.put("target_id", &format!("{i}"), t.as_bytes())?;
    }
    Ok(())
}

/// The bytes of an ELF section, if the file has it with contents.
fn section(bytes: &[u8], name: &str) -> Option<Vec<u8>> {
    let file = object::File::parse(bytes).ok()?;
    let data = file.section_by_name(name)?.data().ok()?;
    (!data.is_empty()).then(|| data.to_vec())
}
