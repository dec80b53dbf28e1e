//! Helpers for kpack's end-to-end tests: where the fixtures are, running the
//! `kpack` binary and LLVM's tools, and an independent splitter of
//! `.hip_fatbin` sections (deliberately not kpack's, so that the ground-truth
//! test does not check kpack against itself).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

/// Where `cargo xtask fixtures` put the compiled fixtures. Tests need them:
/// run the suite with `cargo xtask test`.
pub fn fixtures_dir() -> PathBuf {
    let dir = std::env::var_os("KPACK_FIXTURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/fixtures"));
    assert!(
        dir.join("fixtures.json").is_file(),
        "fixtures missing in {}: run `cargo xtask fixtures` (or `cargo xtask test`)",
        dir.display()
    );
    dir
}

/// One compiled fixture, as listed in `fixtures.json`.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub name: String,
    pub path: PathBuf,
    pub targets: Vec<String>,
    pub bundles: usize,
    pub wrappers: usize,
    pub compressed: bool,
    pub device_code: bool,
}

/// Debian's librocrand, a real ROCm library nobody here wrote.
pub const LIBROCRAND: &str = "/usr/lib/x86_64-linux-gnu/librocrand.so.1.1";

/// The fixtures of `fixtures.json`.
pub fn fixtures() -> Vec<Fixture> {
    let dir = fixtures_dir();
    let text = std::fs::read_to_string(dir.join("fixtures.json")).expect("fixtures.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("fixtures.json is JSON");
    let list = v
        .get("fixtures")
        .and_then(|x| x.as_array())
        .or_else(|| v.as_array())
        .expect("fixture list");
    list.iter()
        .map(|f| {
            let name = f["name"].as_str().expect("name").to_string();
            let targets: Vec<String> = f["targets"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|t| t.as_str().expect("target").to_string())
                        .collect()
                })
                .unwrap_or_default();
            Fixture {
                path: dir.join(f.get("file").and_then(|x| x.as_str()).unwrap_or(&name)),
                device_code: !targets.is_empty(),
                targets,
                bundles: f["bundles"].as_u64().unwrap_or(0) as usize,
                wrappers: f["wrappers"].as_u64().unwrap_or(0) as usize,
                compressed: f["compressed"].as_bool().unwrap_or(false),
                name,
            }
        })
        .collect()
}

pub fn fixture(name: &str) -> Fixture {
    fixtures()
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
}

/// The `kpack` binary, built once per test process.
pub fn kpack_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "--quiet", "-p", "kpack-cli", "--bin", "kpack"])
            .current_dir(workspace())
            .status()
            .expect("run cargo build");
        assert!(st.success(), "building kpack failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace().join("target"));
        target.join("debug/kpack")
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

/// LLVM 19's tools directory.
pub fn llvm_bin() -> PathBuf {
    std::env::var_os("KPACK_LLVM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/llvm-19/bin"))
}

/// Run a program, assert success, return stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The raw bytes of a section, cut out with `objcopy`.
pub fn objcopy_section(binary: &Path, section: &str, scratch: &Path) -> Vec<u8> {
    let out = scratch.join(format!("section{}.bin", section.replace('.', "_")));
    run_ok(
        Command::new("objcopy")
            .args(["-O", "binary", "--only-section", section])
            .arg(binary)
            .arg(&out),
    );
    std::fs::read(&out).expect("objcopy output")
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Split `.hip_fatbin` bytes into bundles, the test's own way: skip zero
/// padding; a plain bundle ends at the furthest of its entry table and its
/// entries' data; a CCOB v2/v3 bundle carries its total size.
pub fn split_bundles(data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        if data[pos] == 0 {
            pos += 1;
            continue;
        }
        let b = &data[pos..];
        let len = if b.starts_with(b"__CLANG_OFFLOAD_BUNDLE__") {
            let n = u64_at(b, 24) as usize;
            let mut at = 32;
            let mut end = 0u64;
            for _ in 0..n {
                let (off, size, tl) = (u64_at(b, at), u64_at(b, at + 8), u64_at(b, at + 16));
                end = end.max(off + size);
                at += 24 + tl as usize;
            }
            end.max(at as u64) as usize
        } else if b.starts_with(b"CCOB") {
            match u16::from_le_bytes([b[4], b[5]]) {
                2 => u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize,
                3 => u64_at(b, 8) as usize,
                v => panic!("test splitter: CCOB version {v} has no size"),
            }
        } else {
            panic!("test splitter: unknown bytes at {pos:#x}");
        };
        out.push(b[..len].to_vec());
        pos += len;
    }
    out
}

/// What `clang-offload-bundler` extracts from one bundle file: (target ID,
/// bytes) for every device entry.
pub fn bundler_unbundle(bundle: &Path, scratch: &Path) -> Vec<(String, Vec<u8>)> {
    let tool = llvm_bin().join("clang-offload-bundler");
    let list = run_ok(
        Command::new(&tool)
            .args(["--list", "--type=o"])
            .arg(format!("--input={}", bundle.display())),
    );
    let mut out = Vec::new();
    for triple in list
        .lines()
        .map(str::trim)
        .filter(|t| !t.is_empty() && !t.starts_with("host-"))
    {
        let target = triple
            .rsplit_once("--")
            .map(|x| x.1)
            .unwrap_or("")
            .to_string();
        let dest = scratch.join(format!("bundler-{}.co", target.replace(':', "_")));
        run_ok(
            Command::new(&tool)
                .args(["--unbundle", "--type=o"])
                .arg(format!("--input={}", bundle.display()))
                .arg(format!("--targets={triple}"))
                .arg(format!("--output={}", dest.display())),
        );
        out.push((target, std::fs::read(&dest).expect("bundler output")));
    }
    out
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
