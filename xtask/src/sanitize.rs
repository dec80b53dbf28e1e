//! `cargo xtask sanitize`: the C API's thread-safety stress test
//! (`tests/robustness/capi_stress.c`: 32 threads mixing open, queries,
//! get_kernel, enumerate and loads on shared and own handles and caches)
//! and its ownership stress test (`tests/robustness/capi_free_stress.c`: 16
//! threads loading code objects, mapped and pooled, and freeing each other's,
//! the last ones after `kpack_cache_destroy`) under valgrind, and the Rust
//! stress test (`tests/tests/robustness_threads.rs`) under ThreadSanitizer
//! and AddressSanitizer.
//!
//! - native run, then valgrind memcheck (cold start), helgrind and DRD
//!   (steady state: the library's locks are Rust futexes, which they cannot
//!   see, so the shared handles are used once before the threads start);
//! - with a nightly toolchain and its `rust-src` component:
//!   `-Zsanitizer=thread` and `-Zsanitizer=address` with `-Zbuild-std` (an
//!   uninstrumented standard library gives TSan false positives); skipped,
//!   with a note, otherwise.
//!
//! Everything goes to `target/sanitize/`; exits non-zero if any run finds
//! something.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use object::{Object, ObjectSection};
use xshell::{cmd, Shell};

use kpack_testkit::cprog::Program;
use kpack_testkit::fixtures::{self, FIXTURES_DIR};

use crate::cargo;

pub struct Options {
    /// Rounds per thread under valgrind.
    pub iters: u32,
    /// Skip the nightly sanitizer builds.
    pub valgrind_only: bool,
}

const THREADS: &str = "32";

/// What one stress run is handed: the compiled C program, the offloaded
/// binary, its metadata and the archives.
struct Stress {
    program: PathBuf,
    multi: PathBuf,
    meta: PathBuf,
    archives: Vec<PathBuf>,
    /// `capi_free_stress`, and libvadd offloaded with zstd (libmulti's
    /// archives are uncompressed) with its metadata.
    free_program: PathBuf,
    vadd: PathBuf,
    vadd_meta: PathBuf,
}

/// Threads of the ownership stress test.
const FREE_THREADS: &str = "16";

impl Stress {
    /// The program's arguments for `iters` rounds in `mode` (`cold` or
    /// `steady`).
    fn args(&self, mode: &str, iters: u32) -> Vec<String> {
        let mut v = vec![
            mode.to_string(),
            THREADS.to_string(),
            iters.to_string(),
            self.multi.display().to_string(),
            self.meta.display().to_string(),
            "4".into(),
            "gfx1100,gfx942,gfx1101".into(),
        ];
        v.extend(self.archives.iter().map(|a| a.display().to_string()));
        v
    }

    /// `capi_free_stress`'s arguments: libmulti (mapped code objects) and
    /// libvadd (pooled buffers).
    fn free_args(&self, mode: &str, iters: u32) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        vec![
            mode.into(),
            FREE_THREADS.into(),
            iters.to_string(),
            p(&self.multi),
            p(&self.meta),
            "4".into(),
            "gfx1100,gfx942".into(),
            p(&self.vadd),
            p(&self.vadd_meta),
            "1".into(),
            "gfx1100,gfx942,gfx1101".into(),
        ]
    }
}

/// Each run: what it was, and its summary or why it failed.
type Results = Vec<(String, Result<String>)>;

pub fn run(sh: &Shell, root: &Path, opts: Options) -> Result<()> {
    fixtures::build_all(sh, root, false)?;
    let out = root.join("target/sanitize");
    let work = out.join("work");
    if work.exists() {
        fs::remove_dir_all(&work)?;
    }
    fs::create_dir_all(&work)?;
    let stress = prepare(sh, root, &out, &work)?;

    let mut results: Results = Vec::new();
    // Natively first: the stress itself must pass.
    results.push((
        "native, 32 threads x 400 rounds".into(),
        run_checked(Command::new(&stress.program).args(stress.args("cold", 400))),
    ));
    results.push((
        format!("capi_free_stress native, {FREE_THREADS} threads x 2000 loads"),
        run_checked(Command::new(&stress.free_program).args(stress.free_args("cold", 2000))),
    ));
    valgrind_runs(root, &stress, opts.iters, &mut results);

    // The Rust stress test under TSan and ASan (nightly, build-std).
    if opts.valgrind_only {
        println!("note: --valgrind-only: ThreadSanitizer/AddressSanitizer skipped");
    } else {
        match nightly_with_rust_src(sh) {
            Err(why) => println!("note: ThreadSanitizer/AddressSanitizer skipped: {why}"),
            Ok(()) => sanitizer_runs(root, &out, &mut results),
        }
    }
    report(&results)
}

/// Build kpack and the C library, make the archives and offloaded binary
/// to stress in `work`, and compile the C program into `out`.
fn prepare(sh: &Shell, root: &Path, out: &Path, work: &Path) -> Result<Stress> {
    let cargo = cargo();
    // Archives and an offloaded binary to stress.
    cmd!(
        sh,
        "{cargo} build --quiet -p kpack-cli --bin kpack -p kpack-cxx"
    )
    .run()?;
    let kpack = root.join("target/debug/kpack");
    let fixtures_dir = root.join(FIXTURES_DIR);
    let multi = work.join("lib/libmulti.so");
    let (multi_in, vadd_in) = (
        fixtures_dir.join("libmulti.so"),
        fixtures_dir.join("libvadd.so"),
    );
    let (ar, vadd_out) = (work.join(".kpack"), work.join("lib/libvadd.so"));
    cmd!(
        sh,
        "{kpack} offload {multi_in} -o {multi} --archive-dir {ar} --compression none"
    )
    .quiet()
    .ignore_stdout()
    .run()?;
    cmd!(
        sh,
        "{kpack} offload {vadd_in} -o {vadd_out} --archive-dir {ar}"
    )
    .quiet()
    .ignore_stdout()
    .run()?;
    let meta = work.join("libmulti.hipk");
    fs::write(&meta, metadata_section(&multi)?)?;
    let vadd_meta = work.join("libvadd.hipk");
    fs::write(&vadd_meta, metadata_section(&vadd_out)?)?;
    let mut archives: Vec<PathBuf> = fs::read_dir(&ar)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    archives.sort();
    let program = compile_program(root, out, "capi_stress")?;
    let free_program = compile_program(root, out, "capi_free_stress")?;
    Ok(Stress {
        program,
        multi,
        meta,
        archives,
        free_program,
        vadd: vadd_out,
        vadd_meta,
    })
}

/// The bytes of the `.rocm_kpack_ref` section of the offloaded binary at
/// `path`.
fn metadata_section(path: &Path) -> Result<Vec<u8>> {
    let bytes = fs::read(path)?;
    let file = object::File::parse(&*bytes)?;
    let section = file
        .section_by_name(".rocm_kpack_ref")
        .context("offloaded binary without .rocm_kpack_ref")?;
    Ok(section.data()?.to_vec())
}

/// The C program `tests/robustness/<name>.c` (into `out/<name>`),
/// against the static library.
fn compile_program(root: &Path, out: &Path, name: &str) -> Result<PathBuf> {
    let program = out.join(name);
    let src = root.join(format!("tests/robustness/{name}.c"));
    let include = root.join("kpack-cxx/include");
    // As installed: prelinked, linked without the C++ runtime.
    let lib = kpack_testkit::cprog::prelinked(
        &root.join("target/debug"),
        &out.join("lib"),
        &out.join("include"),
    )?;
    let mut c = Program::c("c11");
    c.strict().cc().flag("-pthread").include(include);
    c.input(src).static_runtime(&lib).link(&program)?;
    Ok(program)
}

/// The stress under valgrind memcheck (cold), helgrind and DRD (steady),
/// `iters` rounds per thread, then the ownership stress the same way; one
/// failed result when valgrind is missing.
fn valgrind_runs(root: &Path, stress: &Stress, iters: u32, results: &mut Results) {
    let valgrind = |tool: &str, extra: &[&str], mode: &str| -> Result<String> {
        let mut c = Command::new("valgrind");
        c.arg(format!("--tool={tool}"))
            .arg("--error-exitcode=99")
            .args(extra)
            .arg(&stress.program)
            .args(stress.args(mode, iters));
        run_checked(&mut c)
    };
    // The thread checkers cannot see the futex word of Rust's Mutex: its
    // own accesses are suppressed (the file says why). Without it, DRD
    // reports the spin of a contended lock of the loader's cache (which
    // 32 threads loading through one cache do contend).
    let supp = format!(
        "--suppressions={}",
        root.join("kpack-cxx/tests/valgrind/rust-futex.supp")
            .display()
    );
    let free_stress = |tool: &str, extra: &[&str], mode: &str| -> Result<String> {
        let mut c = Command::new("valgrind");
        c.arg(format!("--tool={tool}"))
            .arg("--error-exitcode=99")
            .args(extra)
            .arg(&stress.free_program)
            .args(stress.free_args(mode, iters * 4));
        run_checked(&mut c)
    };
    let have_valgrind = Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_valgrind {
        results.push((
            "valgrind".into(),
            Err(anyhow::anyhow!(
                "valgrind is not installed (apt-get install valgrind)"
            )),
        ));
        return;
    }
    results.push((
        format!("valgrind memcheck, cold, 32 threads x {iters} rounds"),
        valgrind(
            "memcheck",
            &[
                "--leak-check=full",
                "--errors-for-leak-kinds=definite,indirect",
                "--track-origins=yes",
            ],
            "cold",
        ),
    ));
    results.push((
        format!("valgrind helgrind, steady, 32 threads x {iters} rounds"),
        valgrind("helgrind", &[&supp], "steady"),
    ));
    results.push((
        format!("valgrind drd, steady, 32 threads x {iters} rounds"),
        valgrind("drd", &[&supp], "steady"),
    ));
    let loads = iters * 4;
    results.push((
        format!("capi_free_stress valgrind memcheck, cold, {FREE_THREADS} threads x {loads} loads"),
        free_stress(
            "memcheck",
            &[
                "--leak-check=full",
                "--errors-for-leak-kinds=definite,indirect",
                "--track-origins=yes",
            ],
            "cold",
        ),
    ));
    results.push((
        format!(
            "capi_free_stress valgrind helgrind, steady, {FREE_THREADS} threads x {loads} loads"
        ),
        free_stress("helgrind", &[&supp], "steady"),
    ));
    results.push((
        format!("capi_free_stress valgrind drd, steady, {FREE_THREADS} threads x {loads} loads"),
        free_stress("drd", &[&supp], "steady"),
    ));
}

/// The Rust stress test under ThreadSanitizer, then AddressSanitizer.
fn sanitizer_runs(root: &Path, out: &Path, results: &mut Results) {
    for (san, name) in [
        ("thread", "ThreadSanitizer"),
        ("address", "AddressSanitizer"),
    ] {
        let r = sanitizer_test(root, out, san);
        results.push((
            format!("{name} (-Zsanitizer={san} -Zbuild-std), robustness_threads"),
            r,
        ));
    }
}

/// Print every result; an error when any run failed.
fn report(results: &Results) -> Result<()> {
    println!("\n== sanitize results");
    let mut failed = 0;
    for (what, r) in results {
        match r {
            Ok(summary) => println!("ok      {what}: {summary}"),
            Err(e) => {
                failed += 1;
                println!("FAILED  {what}: {e:#}");
            }
        }
    }
    if failed > 0 {
        bail!("{failed} sanitize run(s) failed");
    }
    Ok(())
}

/// Run a command; Ok with the lines that summarize it, Err with its output
/// when it fails.
fn run_checked(c: &mut Command) -> Result<String> {
    let o = c.output().with_context(|| format!("running {c:?}"))?;
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let summary: Vec<&str> = stdout
        .lines()
        .chain(stderr.lines())
        .filter(|l| {
            l.starts_with("threads=")
                || l.contains("ERROR SUMMARY")
                || l.contains("definitely lost")
                || l.contains("test result")
        })
        .collect();
    if !o.status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(60).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "exit {}\n{}\n{}",
            o.status,
            stdout.trim_end(),
            tail.join("\n")
        );
    }
    Ok(summary.join("; "))
}

fn nightly_with_rust_src(sh: &Shell) -> Result<(), String> {
    let list = cmd!(sh, "rustup +nightly component list --installed")
        .quiet()
        .ignore_stderr()
        .read()
        .map_err(|_| "no nightly toolchain (rustup toolchain install nightly)".to_string())?;
    if !list.lines().any(|l| l.starts_with("rust-src")) {
        return Err(
            "the nightly toolchain lacks rust-src (rustup component add rust-src --toolchain nightly)"
                .into(),
        );
    }
    Ok(())
}

/// `cargo +nightly test -Zbuild-std` of robustness_threads with a sanitizer.
fn sanitizer_test(root: &Path, out: &Path, sanitizer: &str) -> Result<String> {
    let host = "x86_64-unknown-linux-gnu";
    let mut c = Command::new("cargo");
    c.current_dir(root)
        .args(["+nightly", "test", "-Zbuild-std", "--target", host])
        .args([
            "-p",
            "kpack-e2e",
            "--test",
            "e2e",
            "--",
            "robustness_threads::",
        ])
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env("CARGO_TARGET_DIR", out.join(format!("rust-{sanitizer}")))
        .env(
            "RUSTFLAGS",
            format!("-Zsanitizer={sanitizer} -Cdebuginfo=1"),
        )
        .env("RUSTDOCFLAGS", format!("-Zsanitizer={sanitizer}"))
        .env("KPACK_STRESS_ITERS", "20")
        .env("KPACK_FIXTURES_DIR", root.join(FIXTURES_DIR))
        // Leaks of the test harness's global thread pool are not ours.
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        .env("TSAN_OPTIONS", "halt_on_error=1");
    println!("== {sanitizer} sanitizer: cargo +nightly test -Zbuild-std (this builds the standard library)");
    run_checked(&mut c)
}
