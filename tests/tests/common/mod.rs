//! What the end-to-end tests share: where the fixtures are, running the
//! `kpack` binary, and the parts of `kpack-testkit` the tests use (the
//! independent bundle oracle, the shard tree) in the tests' panicking form;
//! [`cmake`] for the CMake tests, [`wheel`] for the wheel tests.

pub mod cmake;
pub mod runtime;
pub use runtime::c_runtime_load;
pub mod wheel;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

pub use kpack_testkit::cprog::Program;
pub use kpack_testkit::manifest::{self, Entry, Manifest};
pub use kpack_testkit::shards::{
    database_files, BASE_PREFIX, FAT_BINARIES, FFT_MISSING_PREFIX, FFT_PREFIX, PACKAGING_CONFIG,
    ROCBLAS_PREFIX, SHARDS, SPLIT_DATABASES,
};
pub use kpack_testkit::tree::Snapshot;
use kpack_testkit::{oracle, shards, tree};

/// The workspace root.
pub fn workspace() -> PathBuf {
    kpack_testkit::workspace::root()
}

/// Where `cargo xtask fixtures` put the compiled fixtures. Tests need them:
/// run the suite with `cargo xtask test`.
pub fn fixtures_dir() -> PathBuf {
    let dir = std::env::var_os("KPACK_FIXTURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/fixtures"));
    assert!(
        dir.join(manifest::FILE_NAME).is_file(),
        "fixtures missing in {}: run `cargo xtask fixtures` (or `cargo xtask test`)",
        dir.display()
    );
    dir
}

/// One compiled fixture: its `fixtures.json` entry (what it holds) and
/// where it is.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub entry: Entry,
    pub path: PathBuf,
}

impl std::ops::Deref for Fixture {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        &self.entry
    }
}

/// Debian's librocrand, a real ROCm library nobody here wrote.
pub const LIBROCRAND: &str = "/usr/lib/x86_64-linux-gnu/librocrand.so.1.1";

/// `fixtures.json`.
pub fn manifest() -> Manifest {
    Manifest::read(&fixtures_dir()).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The fixtures of `fixtures.json` (not the shard tree's binaries).
pub fn fixtures() -> Vec<Fixture> {
    let dir = fixtures_dir();
    manifest()
        .fixtures
        .into_iter()
        .map(|entry| Fixture {
            path: dir.join(&entry.name),
            entry,
        })
        .collect()
}

pub fn fixture(name: &str) -> Fixture {
    fixtures()
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
}

/// A fixture for another host (`fixtures.json`'s `foreign`: AArch64,
/// ppc64le, Windows).
pub fn foreign_fixture(name: &str) -> Fixture {
    let entry = manifest()
        .foreign
        .into_iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no foreign fixture {name}"));
    Fixture {
        path: fixtures_dir().join(&entry.name),
        entry,
    }
}

/// A reference archive (`tests/data/reference-kpack`), written by the
/// reference implementation.
pub fn reference_archive(name: &str) -> PathBuf {
    kpack_testkit::workspace::reference_archives().join(name)
}

/// A path as the C API takes it.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.to_str().expect("a UTF-8 path")).expect("a path without NUL")
}

/// Held by a test while it builds, moves or runs the workspace's own build
/// outputs in `target/` (cargo, `cargo xtask`, maturin, CMake's cargo
/// build), which the tests of this one process would otherwise do at the
/// same time: maturin moves `target/debug/kpack` away while it packs a
/// wheel, and a cargo build of other packages (CMake's) relinks
/// `target/debug/kpack` and `librocm_kpack.a`. Not held while calling
/// [`kpack_bin`] for the first time (it takes the lock).
pub fn build_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    // A test that failed while holding it leaves nothing half-done.
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `kpack` binary, built once per test process (in the tests'
/// profile) and run from a copy of its own (`<profile>/e2e-kpack/kpack`),
/// which what other tests do to `target/debug/kpack` cannot touch (see
/// [`build_lock`]).
pub fn kpack_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let _build = build_lock();
        let profile =
            kpack_testkit::workspace::build(&["--package", "kpack-cli", "--bin", "kpack"])
                .unwrap_or_else(|e| panic!("building kpack: {e:#}"));
        let dir = profile.join("e2e-kpack");
        std::fs::create_dir_all(&dir).unwrap();
        // Renamed into place: another test process may be running the copy
        // it made.
        let tmp = dir.join(format!(".kpack-{}", std::process::id()));
        std::fs::copy(profile.join("kpack"), &tmp)
            .unwrap_or_else(|e| panic!("copying {}: {e}", profile.join("kpack").display()));
        let bin = dir.join("kpack");
        std::fs::rename(&tmp, &bin).unwrap();
        bin
    })
    .clone()
}

/// Run `kpack` with arguments.
pub fn kpack(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new(kpack_bin());
    for a in args {
        c.arg(a.as_ref());
    }
    c.output().expect("run kpack")
}

/// Run `kpack`, assert success, return stdout.
pub fn kpack_ok(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let out = kpack(args);
    assert!(
        out.status.success(),
        "kpack failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// Run `kpack`, assert a clean failure (exit code 1, a `kpack: error:`
/// message, no panic), return stderr.
pub fn kpack_fails(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let out = kpack(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit 1, got {}; stderr: {stderr}",
        out.status
    );
    assert!(stderr.starts_with("kpack: error: "), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    stderr
}

/// The CMake consumer's checker (`integration/cmake-consumer/check.c`)
/// linked with the installed static runtime (prelinked: the C API alone,
/// which a C program links with a C compiler only), built once per test
/// process: `check LIBRARY EXPECTED_DIR TARGET...` stands in for the HIP
/// runtime, dlopens the library, and loads every wrapper's code object
/// for each target through `kpack_load_code_object`, comparing it with
/// `EXPECTED_DIR/<target>[#<co>].co`.
pub fn runtime_checker() -> PathBuf {
    static CHECKER: OnceLock<PathBuf> = OnceLock::new();
    CHECKER
        .get_or_init(|| {
            let root = workspace();
            let installed = installed_runtime();
            let checker = e2e_build_dir().join("check");
            let mut p = Program::c("c11");
            p.cc()
                .warnings(true)
                .warnings_into_errors(true)
                .flag("-rdynamic")
                .define("ROCM_KPACK_STATIC", None)
                .include(root.join("kpack-cxx/include"));
            p.input(root.join("integration/cmake-consumer/check.c"))
                .static_runtime(&installed.join("lib/librocm_kpack.a"));
            built(p.link(&checker));
            checker
        })
        .clone()
}

/// Where this test process builds its C and C++ programs (one directory
/// per process: another may be building its own).
pub fn e2e_build_dir() -> PathBuf {
    let dir = workspace().join(format!("target/e2e-checker/{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The runtime library as `cargo xtask dist` installs it (prelinked
/// `lib/librocm_kpack.a`, `lib/librocm_kpack_cxx.a`, `include/`), made
/// once per test process from this build.
pub fn installed_runtime() -> PathBuf {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let installed = e2e_build_dir().join("installed");
            let _build = build_lock();
            kpack_testkit::workspace::install_runtime(&installed)
                .unwrap_or_else(|e| panic!("{e:#}"));
            installed
        })
        .clone()
}

/// Run a program, assert success, return stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = kpack_testkit::workspace::output(cmd).unwrap_or_else(|e| panic!("{e:#}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Panic with the compiler's output if building a C program failed.
pub fn built<E: std::fmt::Display>(result: Result<(), E>) {
    result.unwrap_or_else(|e| panic!("{e:#}"));
}

// The independent oracle (kpack_testkit::oracle), panicking on failure.

/// The raw bytes of a section, cut out with `objcopy`.
pub fn objcopy_section(binary: &Path, section: &str, scratch: &Path) -> Vec<u8> {
    oracle::objcopy_section(binary, section, scratch).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Split `.hip_fatbin` bytes into bundles, the tests' own way (not
/// kpack's).
pub fn split_bundles(data: &[u8]) -> Vec<Vec<u8>> {
    oracle::split_bundles(data)
        .unwrap_or_else(|e| panic!("test splitter: {e:#}"))
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect()
}

/// What `clang-offload-bundler` extracts from one bundle file: (target ID,
/// bytes) for every device entry.
pub fn bundler_unbundle(bundle: &Path, scratch: &Path) -> Vec<(String, Vec<u8>)> {
    oracle::bundler_unbundle(bundle, scratch).unwrap_or_else(|e| panic!("{e:#}"))
}

/// clang-offload-bundler's code objects of a fat binary, by (bundle index,
/// target ID).
pub fn code_objects(binary: &Path) -> BTreeMap<(usize, String), Vec<u8>> {
    oracle::code_objects(binary).unwrap_or_else(|e| panic!("{}: {e:#}", binary.display()))
}

// The shard tree (kpack_testkit::shards) from the compiled fixtures.

/// Lay the whole shard tree out under `root` (`root/<shard>/<artifact>`).
pub fn make_shards(root: &Path) {
    shards::make_shards(&fixtures_dir(), root).unwrap_or_else(|e| panic!("{e:#}"));
}

/// One shard of the tree.
pub fn make_shard(root: &Path, shard: &str, family: &str, targets: &[&str]) {
    shards::make_shard(&fixtures_dir(), root, shard, family, targets)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Install artifacts the way a package does (every prefix of each copied
/// into `root`); a file that two prefixes both provide fails the test.
pub fn install(artifacts: &[PathBuf], root: &Path) {
    shards::install(artifacts, root).unwrap_or_else(|e| panic!("{e:#}"));
}

/// Every entry below `dir`, for comparing trees.
pub fn snapshot(dir: &Path) -> Snapshot {
    tree::snapshot(dir).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Every path below `dir` (relative), for "nothing was written" checks.
pub fn listing(dir: &Path) -> BTreeSet<String> {
    snapshot(dir).into_keys().collect()
}

/// Names of the entries of a directory, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Files below `dir` (recursively) whose name satisfies `pred`.
pub fn find(dir: &Path, pred: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    snapshot(dir)
        .keys()
        .filter(|k| pred(Path::new(k).file_name().unwrap().to_str().unwrap()))
        .map(|k| dir.join(k))
        .collect()
}

/// Recreate the tree `src` at `dst`, creating entries in reverse order (on
/// tmpfs, which lists newest first, the copy lists in the opposite order).
pub fn reversed_copy(src: &Path, dst: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dst).unwrap();
    let snap = snapshot(src);
    for (rel, entry) in snap.iter().rev() {
        let one = Snapshot::from([(rel.clone(), entry.clone())]);
        tree::restore(&one, dst).unwrap_or_else(|e| panic!("{e:#}"));
    }
    // Directory modes last (a read-only directory would block the writes).
    for (rel, (kind, _, mode)) in snap {
        if kind == 'd' {
            std::fs::set_permissions(dst.join(rel), std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

/// The arguments of `kpack split` over one shard of the shard tree (every
/// artifact of `shard` into `out`, its databases split), as the tutorial
/// splits it.
pub fn split_shard_args(shard: &Path, out: &Path, jobs: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "split".into(),
        "--batch-artifact-parent-dir".into(),
        shard.into(),
        "--output-dir".into(),
        out.into(),
        "--split-databases".into(),
    ];
    args.extend(SPLIT_DATABASES.iter().map(OsString::from));
    args.extend(["--jobs".into(), jobs.into()]);
    args
}

/// Run `kpack split` over one shard (see [`split_shard_args`]), assert
/// success.
pub fn split_shard(shard: &Path, out: &Path, jobs: &str) {
    let args = split_shard_args(shard, out, jobs);
    let args: Vec<&dyn AsRef<OsStr>> = args.iter().map(|a| a as &dyn AsRef<OsStr>).collect();
    kpack_ok(&args);
}

/// A scratch directory on tmpfs when there is one (fast, and it lists
/// entries newest first, which the determinism tests rely on).
pub fn scratch() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// Files in a directory, sorted by name.
pub fn dir_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// eu-elflint's complaints, without the file name.
pub fn elflint(path: &Path) -> BTreeSet<String> {
    let out = Command::new("eu-elflint")
        .arg("--gnu-ld")
        .arg(path)
        .output()
        .expect("eu-elflint (elfutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
        .map(|l| l.split_once(": ").map_or(l, |x| x.1).to_string())
        .filter(|l| l != "No errors")
        .collect()
}

/// eu-elflint reports nothing new compared with the original, readelf
/// reads every header quietly, and `kpack verify-elf` accepts the result.
pub fn assert_tools_accept(original: &Path, rewritten: &Path) {
    assert_tools_accept_but(original, rewritten, &[]);
}

/// [`assert_tools_accept`], except for eu-elflint complaints that contain
/// one of `known` (a defect of the rewrite known and named by the caller).
pub fn assert_tools_accept_but(original: &Path, rewritten: &Path, known: &[&str]) {
    let before = elflint(original);
    let after = elflint(rewritten);
    let new: Vec<_> = after
        .difference(&before)
        .filter(|c| !known.iter().any(|k| c.contains(k)))
        .collect();
    assert!(
        new.is_empty(),
        "{}: eu-elflint reports new problems: {new:?}",
        rewritten.display()
    );
    let out = Command::new("readelf")
        .arg("-a")
        .arg("-W")
        .arg(rewritten)
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.trim().is_empty(),
        "{}: readelf complains: {err}",
        rewritten.display()
    );
    kpack_ok(&[&"verify-elf", &rewritten]);
}

/// Runs the host code of a fixture on its host (here, or under qemu-user
/// for a foreign Linux host): a library through the host's loader
/// (`dlcheck` here), which calls its host check; an executable itself.
/// With the environment given; stdout, trimmed.
pub fn run_host(f: &Fixture, binary: &Path, env: &[(&str, &Path)]) -> String {
    let mut cmd = match &f.host_check {
        Some(check) => {
            let loader = if f.host.is_native() {
                manifest().dlcheck
            } else {
                f.host.loader()
            };
            let mut c = f.host.command(&fixtures_dir().join(loader));
            c.arg(binary).arg(&*check.symbol);
            c
        }
        None => f.host.command(binary),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{} failed: {}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A stand-in for the HIP runtime's registration entry points, preloaded
/// ahead of libamdhip64: logs each wrapper it is given and the bytes its
/// `binary` pointer points at.
pub fn shim() -> PathBuf {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let dir = workspace().join("target/test-shim");
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("hipshim.c");
        std::fs::write(
            &src,
            r#"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
typedef struct { uint32_t magic, version; const unsigned char* binary; uint64_t reserved1; } wrapper_t;
static void* handle[1];
void** __hipRegisterFatBinary(const void* data) {
  const wrapper_t* w = (const wrapper_t*)data;
  FILE* f = fopen(getenv("KPACK_SHIM_LOG"), "a");
  if (!f) abort();
  fprintf(f, "%08x %u %llu ", w->magic, w->version, (unsigned long long)w->reserved1);
  size_t n = 4096 - ((uintptr_t)w->binary & 4095);
  if (n > 1024) n = 1024;
  for (size_t i = 0; i < n; i++) fprintf(f, "%02x", w->binary[i]);
  fprintf(f, "\n");
  fclose(f);
  return handle;
}
void __hipUnregisterFatBinary(void** h) { (void)h; }
void __hipRegisterFunction(void) {}
void __hipRegisterVar(void) {}
void __hipRegisterManagedVar(void) {}
void __hipRegisterSurface(void) {}
void __hipRegisterTexture(void) {}
"#,
        )
        .unwrap();
        let so = dir.join("libhipshim.so");
        let mut p = Program::c("c11");
        p.cc().flag("-shared");
        built(p.input(&src).link(&so));
        so
    })
    .clone()
}

pub fn registered(f: &Fixture, binary: &Path) -> Vec<Registered> {
    let (_dir, log) = run_under_shim(f, binary);
    read_registrations(&log)
}

/// Run the host code of `binary` (fixture `f`'s) under the stand-in HIP
/// runtime and check its result; the runtime's log (in a directory that
/// lives as long as the returned guard).
fn run_under_shim(f: &Fixture, binary: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let shim = shim();
    let out = run_host(
        f,
        binary,
        &[("LD_PRELOAD", &shim), ("KPACK_SHIM_LOG", &log)],
    );
    if let Some(check) = &f.host_check {
        assert_eq!(out, check.value.to_string(), "{}: host code result", f.name);
    }
    (dir, log)
}

/// xorshift64*: a small deterministic generator (for mutation tests).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// One wrapper as the stand-in HIP runtime logged it, whatever its magic:
/// the first bytes its pointer reaches (at most 1 KiB, up to the end of
/// their page).
pub struct RawRegistration {
    pub magic: u32,
    pub version: u32,
    pub reserved1: u64,
    pub bytes: Vec<u8>,
}

/// Run the host code of `binary` (fixture `f`'s) under the stand-in HIP
/// runtime, check its result, and return what it was handed.
pub fn registered_raw(f: &Fixture, binary: &Path) -> Vec<RawRegistration> {
    let (_dir, log) = run_under_shim(f, binary);
    raw_registrations(&log)
}

/// The lines of the stand-in runtime's log.
pub fn raw_registrations(log: &Path) -> Vec<RawRegistration> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            let hex = p[3];
            RawRegistration {
                magic: u32::from_str_radix(p[0], 16).unwrap(),
                version: p[1].parse().unwrap(),
                reserved1: p[2].parse().unwrap(),
                bytes: (0..hex.len() / 2)
                    .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                    .collect(),
            }
        })
        .collect()
}

/// One wrapper as the stand-in HIP runtime saw it (a line of its log:
/// magic, version, reserved1, the bytes at the wrapper's pointer).
pub struct Registered {
    pub magic: u32,
    pub version: u32,
    pub co_index: u64,
    pub metadata: kpack_format::hipk::HipkMetadata,
}

/// The wrappers logged by the stand-in HIP runtime (`integration/hip`'s
/// `hipstub.c`, the tests' LD_PRELOAD shim) to `log`; each pointer must
/// reach HIPK metadata.
pub fn read_registrations(log: &Path) -> Vec<Registered> {
    raw_registrations(log)
        .into_iter()
        .map(|r| Registered {
            magic: r.magic,
            version: r.version,
            co_index: r.reserved1,
            metadata: kpack_format::hipk::HipkMetadata::decode(&r.bytes)
                .expect("wrapper points at HIPK metadata"),
        })
        .collect()
}

/// If `original` carries DWARF (`.debug_info`), run dwz (Debian's dh_dwz)
/// on it and on its offloaded form `rewritten`: dwz must accept both alike
/// (it refuses, for one, allocatable sections after non-allocatable ones).
/// Returns dwz's output for the rewritten binary, to be checked further.
pub fn dwz_accepts(original: &Path, rewritten: &Path, scratch: &Path) -> Option<PathBuf> {
    let data = std::fs::read(original).unwrap();
    let elf = kpack_host::elf::ElfView::parse(&data).unwrap();
    elf.section(".debug_info").unwrap()?;
    let dwz = |input: &Path, out: &Path| {
        let o = Command::new("dwz")
            .arg("-o")
            .arg(out)
            .arg(input)
            .output()
            .expect("dwz (package dwz)");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (ok, err) = dwz(original, &scratch.join("original.dwz"));
    assert!(ok, "dwz refuses the input {}: {err}", original.display());
    let out = scratch.join("rewritten.dwz");
    let (ok, err) = dwz(rewritten, &out);
    assert!(
        ok && err.trim().is_empty(),
        "dwz on {}: {err}",
        rewritten.display()
    );
    Some(out)
}

/// `pack-tree` (group `g`) of `files` (fixture name, path in the tree),
/// copied into `input`, into `out`; extra arguments after.
pub fn pack_tree_of(files: &[(&str, &str)], input: &Path, out: &Path, extra: &[&str]) {
    for (fixture_name, rel) in files {
        let dst = input.join(rel);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(fixture(fixture_name).path, &dst).unwrap();
    }
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
        &"pack-tree",
        &"--input",
        &input,
        &"--output",
        &out,
        &"--group-name",
        &"g",
    ];
    for e in extra {
        args.push(e);
    }
    kpack_ok(&args);
}

/// Write the archive `src` again to `dst`, every entry's metadata passed
/// through `edit` first (same group, family, targets, scheme, order).
pub fn rewrite_archive(
    src: &Path,
    dst: &Path,
    mut edit: impl FnMut(&mut kpack_format::archive::Metadata),
) {
    let a = kpack_loader::open_archive(src).unwrap();
    let mut w = kpack_host::ArchiveWriter::new(
        a.group_name().to_string(),
        a.gfx_arch_family().to_string(),
        a.gfx_arches().to_vec(),
    )
    .scheme(a.scheme());
    for e in a.entries() {
        let mut md = e.metadata.clone().unwrap_or_default();
        edit(&mut md);
        let bytes = a.read(e).unwrap().into_owned();
        w.add(e.key.as_str(), e.target.as_str(), bytes, Some(md))
            .unwrap();
    }
    drop(a);
    w.write(dst).unwrap();
}

/// [`rewrite_archive`] without the provenance digests: as upstream's
/// tools and older kpack write archives.
pub fn strip_digests(src: &Path, dst: &Path) {
    use kpack_format::provenance::{TOC_BINARY_DIGEST, TOC_CODE_OBJECT_DIGEST};
    rewrite_archive(src, dst, |md| {
        md.retain(|(k, _)| k != TOC_CODE_OBJECT_DIGEST && k != TOC_BINARY_DIGEST)
    });
}

/// The device digest kpack records for the fat binary `path`: over every
/// device code object the bundler finds.
pub fn device_digest_of(path: &Path) -> String {
    use kpack_format::provenance::{code_object_digest, device_digest};
    let sums: Vec<String> = code_objects(path)
        .values()
        .map(|b| code_object_digest(b))
        .collect();
    device_digest(sums.iter().map(String::as_str))
}

/// An install tree made in `input` of fixtures (fixture name, path in the
/// tree), packed by pack-tree (group `g`) into `out`.
pub fn pack_fixtures(files: &[(&str, &str)], input: &Path, out: &Path) {
    for (fixture_name, rel) in files {
        let dst = input.join(rel);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(fixture(fixture_name).path, &dst).unwrap();
    }
    kpack_ok(&[
        &"pack-tree",
        &"--input",
        &input,
        &"--output",
        &out,
        &"--group-name",
        &"g",
    ]);
}

/// [`pack_fixtures`] of these fixtures under `lib/` of `dir/in`.
pub fn pack_fixtures_in_lib(dir: &Path, fixtures: &[&str], out: &Path) {
    let files: Vec<(&str, String)> = fixtures.iter().map(|f| (*f, format!("lib/{f}"))).collect();
    let files: Vec<(&str, &str)> = files.iter().map(|(f, r)| (*f, r.as_str())).collect();
    pack_fixtures(&files, &dir.join("in"), out);
}

/// `kpack offload INPUT -o OUT --archive-dir ARCHIVES --json`, which must
/// succeed: its summary.
pub fn offload_json(input: &Path, out: &Path, archives: &Path) -> serde_json::Value {
    let json = kpack_ok(&[
        &"offload",
        &input,
        &"-o",
        &out,
        &"--archive-dir",
        &archives,
        &"--json",
    ]);
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}
