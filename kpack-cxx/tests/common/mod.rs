//! Shared helpers of the runtime library's tests: where the built library,
//! the headers and the fixtures are; compiling (through `cc`, see
//! `kpack_testkit::cprog`) and running C/C++ programs; valgrind.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kpack_core::archive::ArchiveWriter;
use kpack_core::hipk::HipkMetadata;
use kpack_core::msgpack::{self, Value};
pub use kpack_testkit::cprog::Program;

/// The cargo profile directory this test was built into (holds
/// `librocm_kpack.a` and `librocm_kpack.so`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/<profile>/deps/<test>
    exe.parent()
        .and_then(Path::parent)
        .expect("profile directory")
        .to_path_buf()
}

/// `cargo test` builds this crate as an rlib for its tests; the static and
/// shared libraries the C and C++ programs link are built here, once per
/// test process, in the same profile.
fn build_libraries() {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "kpack-cxx", "--lib"])
            .current_dir(crate_dir());
        if profile_dir().file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "cargo build -p kpack-cxx failed");
    });
}

pub fn staticlib() -> PathBuf {
    build_libraries();
    let p = profile_dir().join("librocm_kpack.a");
    assert!(p.is_file(), "{} missing: build kpack-cxx", p.display());
    p
}

pub fn sharedlib() -> PathBuf {
    build_libraries();
    let p = profile_dir().join("librocm_kpack.so");
    assert!(p.is_file(), "{} missing: build kpack-cxx", p.display());
    p
}

/// build.rs's output directory of this build: the C++ glue
/// (`librocm_kpack_cxx.a`), the generated bridge header, `rust/cxx.h`, the
/// bridge symbols and the stand-ins the prelink step uses.
pub fn cxx_out_dir() -> PathBuf {
    PathBuf::from(env!("KPACK_CXX_OUT_DIR"))
}

/// The installed layout of the runtime library (`rocm-kpack-prelink`'s
/// output: the prelinked `librocm_kpack.a`, `librocm_kpack_cxx.a`, the
/// headers), made once per test process from this build.
pub fn installed() -> PathBuf {
    static DONE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let dir = build_dir("installed");
        let exe = profile_dir().join("rocm-kpack-prelink");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args([
                "build",
                "--quiet",
                "-p",
                "kpack-cxx",
                "--bin",
                "rocm-kpack-prelink",
            ])
            .current_dir(crate_dir());
        if profile_dir().file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        assert!(build.status().expect("cargo build").success());
        run_ok(
            Command::new(exe)
                .arg(staticlib())
                .arg(dir.join("lib"))
                .arg(dir.join("include")),
        );
        dir
    })
    .clone()
}

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn include_dir() -> PathBuf {
    crate_dir().join("include")
}

/// The reference archives (`tests/data/reference-kpack`).
pub fn reference_fixtures() -> PathBuf {
    let p = crate_dir().join("../tests/data/reference-kpack");
    assert!(
        p.join("test_zstd.kpack").is_file(),
        "{} missing",
        p.display()
    );
    p
}

/// A scratch directory for this test binary's build products.
pub fn build_dir(name: &str) -> PathBuf {
    let d = profile_dir().join("kpack-cxx-tests").join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Run `cmd`, panicking with its output unless it exits 0.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A program in the standard `std` (C++ for `c++NN`) with the public
/// headers and the strict warning flags (`-Wall -Wextra -Werror
/// -pedantic`, `-O1 -g`).
pub fn program(std: &str) -> Program {
    let mut p = if std.starts_with("c++") {
        Program::cxx(std)
    } else {
        Program::c(std)
    };
    p.strict().cc().flag("-pedantic").include(include_dir());
    if std.starts_with("c++") {
        p.cc().flag("-pthread");
    }
    p
}

/// Compile `source` and link it against `lib` (static or shared, with the
/// static library's native libraries) into `out`, with [`program`]'s flags.
pub fn build_program(std: &str, source: &Path, lib: &Path, out: &Path) {
    let mut p = program(std);
    p.input(source).static_runtime(lib);
    built(p.link(out));
}

/// A C++17 program against the installed C++ API ([`installed`]): its
/// headers, the glue first, then the prelinked library.
pub fn cxx_program() -> Program {
    let inst = installed();
    let mut p = Program::cxx("c++17");
    p.strict()
        .cc()
        .flag("-pedantic")
        .flag("-pthread")
        .include(inst.join("include"));
    p
}

/// Link [`cxx_program`]'s inputs with the installed libraries into `out`.
pub fn link_cxx(p: &mut Program, out: &Path) {
    let lib = installed().join("lib");
    p.input(lib.join("librocm_kpack_cxx.a"))
        .static_runtime(&lib.join("librocm_kpack.a"));
    built(p.link(out));
}

/// Panic with the compiler's output if a build failed.
pub fn built<E: std::fmt::Display>(result: Result<(), E>) {
    result.unwrap_or_else(|e| panic!("{e:#}"));
}

/// Valgrind must be installed (`cargo xtask test` installs it).
pub fn valgrind() -> Command {
    let found = Command::new("valgrind").arg("--version").output();
    assert!(
        found.map(|o| o.status.success()).unwrap_or(false),
        "valgrind is not installed: apt-get install valgrind"
    );
    Command::new("valgrind")
}

/// Run `program args` under valgrind tool `tool` (with its strict options)
/// and assert a clean report.
pub fn run_under_valgrind(tool: &str, program: &Path, args: &[&str], envs: &[(&str, &str)]) {
    let mut cmd = valgrind();
    cmd.arg(format!("--tool={tool}"))
        .arg("--error-exitcode=99")
        .arg("--quiet");
    if tool == "memcheck" {
        cmd.args([
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
            "--track-origins=yes",
        ]);
    }
    cmd.arg(program).args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = run_ok(&mut cmd);
    assert!(
        stdout(&out).contains("PASS"),
        "{tool}: {}\n{}",
        stdout(&out),
        stderr(&out)
    );
}

/// The code object the loader tests store for (key, target).
pub fn code(key: &str, target: &str) -> Vec<u8> {
    let mut v = format!("co {} {target} ", key.rsplit('#').next().unwrap_or("")).into_bytes();
    // Long enough that zstd has something to compress.
    v.extend(key.bytes().cycle().take(3000));
    v
}

/// Write an archive serving `arches` with `code(key, target)` for each
/// of `kernels`.
pub fn write_archive(path: &Path, arches: &[&str], kernels: &[(&str, &str)]) {
    let mut w = ArchiveWriter::new(
        "lib",
        arches[0],
        arches.iter().map(|a| a.to_string()).collect(),
    );
    for (k, t) in kernels {
        w.add(*k, *t, code(k, t), None).unwrap();
    }
    w.write(path).unwrap();
}

/// Write HIPK metadata to a file.
pub fn write_metadata(path: &Path, kernel_name: &str, search_paths: &[&str]) {
    let m = HipkMetadata {
        kernel_name: kernel_name.into(),
        search_paths: search_paths.iter().map(|s| s.to_string()).collect(),
    };
    std::fs::write(path, m.encode()).unwrap();
}

/// Damage the content checksum of zstd frame `index` of an archive
/// written by kpack (frames carry checksums), so that it fails to read.
pub fn damage_frame(bytes: &mut [u8], index: usize) {
    let mut pos = 68;
    for _ in 0..index {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        pos += 4 + len;
    }
    let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
    bytes[pos + 4 + len - 1] ^= 0xff;
}

/// Rewrite an archive's TOC with `edit`.
pub fn edit_toc(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let toc_offset = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let mut toc = msgpack::decode(&bytes[toc_offset..]).unwrap();
    edit(&mut toc);
    let mut out = bytes[..toc_offset].to_vec();
    out.extend(msgpack::encode(&toc));
    out
}

/// The value at `path` (map keys) inside `v`.
pub fn at<'a>(v: &'a mut Value, path: &[&str]) -> &'a mut Value {
    let mut cur = v;
    for key in path {
        let Value::Map(entries) = cur else {
            panic!("not a map at {key}")
        };
        cur = entries
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no {key}"));
    }
    cur
}

/// Files that are not usable archives, for the C and C++ test programs.
pub fn write_bad_archives(dir: &Path) {
    let reference = std::fs::read(reference_fixtures().join("test_zstd.kpack")).unwrap();
    let mut b = reference.clone();
    b[..4].copy_from_slice(b"KPAX");
    std::fs::write(dir.join("bad_magic.kpack"), b).unwrap();
    std::fs::write(dir.join("short.kpack"), &reference[..10]).unwrap();
    let mut b = reference.clone();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(dir.join("bad_version.kpack"), b).unwrap();
    let mut b = reference.clone();
    let past = reference.len() as u64 + 100;
    b[8..16].copy_from_slice(&past.to_le_bytes());
    std::fs::write(dir.join("toc_past_end.kpack"), b).unwrap();
    let toc_offset = u64::from_le_bytes(reference[8..16].try_into().unwrap()) as usize;
    let mut b = reference[..toc_offset].to_vec();
    b.push(0xc1);
    std::fs::write(dir.join("bad_toc.kpack"), b).unwrap();
    let mut b = reference[..toc_offset].to_vec();
    b.push(0x90);
    std::fs::write(dir.join("toc_not_a_map.kpack"), b).unwrap();
    let b = edit_toc(&reference, |t| {
        *at(t, &["compression_scheme"]) = Value::from("lz4")
    });
    std::fs::write(dir.join("unknown_scheme.kpack"), b).unwrap();
    let b = edit_toc(&reference, |t| *at(t, &["gfx_arches"]) = Value::from(5));
    std::fs::write(dir.join("wrong_type.kpack"), b).unwrap();
    std::fs::create_dir_all(dir.join("a_directory.kpack")).unwrap();

    // The reference's three kernels, written by kpack (with checksums),
    // the first frame damaged.
    let reference =
        kpack_core::archive::Archive::open(reference_fixtures().join("test_zstd.kpack")).unwrap();
    let mut w = ArchiveWriter::new("test", "gfx110X", reference.gfx_arches().to_vec());
    for (key, target, _) in reference.entries_by_ordinal() {
        w.add(key, target, reference.kernel(key, target).unwrap(), None)
            .unwrap();
    }
    let mut b = w.to_vec().unwrap();
    damage_frame(&mut b, 0);
    std::fs::write(dir.join("corrupt_zstd.kpack"), b).unwrap();
}

/// A valid archive at `p` whose one kernel, `k#0` @ gfx1100, really is
/// 4 GiB (a frame of RLE blocks, 128 KiB on disk): only the allocation
/// fails. (A TOC that merely claims 4 GiB is a corrupt archive:
/// DECOMPRESSION_FAILED.)
pub fn write_huge_archive(p: &Path) {
    let mut w = ArchiveWriter::new("o", "gfx1100", vec!["gfx1100".into()]);
    w.add("k#0", "gfx1100", vec![1u8; 100], None).unwrap();
    let small = w.to_vec().unwrap();
    let toc_offset = u64::from_le_bytes(small[8..16].try_into().unwrap()) as usize;
    let frame = rle_frame(1 << 32);
    let mut b = small[..64].to_vec();
    b.extend(1u32.to_le_bytes());
    b.extend((frame.len() as u32).to_le_bytes());
    b.extend(&frame);
    let new_toc_offset = b.len() as u64;
    b[8..16].copy_from_slice(&new_toc_offset.to_le_bytes());
    b.extend(&small[toc_offset..]);
    let b = edit_toc(&b, |t| {
        *at(t, &["toc", "k#0", "gfx1100", "original_size"]) = Value::from(1u64 << 32);
        *at(t, &["zstd_size"]) = Value::from(8 + frame.len() as u64);
    });
    std::fs::write(p, b).unwrap();
}

/// A zstd frame of `size` zero bytes made of RLE blocks, with its content
/// size in the header.
pub fn rle_frame(size: u64) -> Vec<u8> {
    // Magic, descriptor (8-byte content size, window descriptor follows),
    // window 128 KiB, content size.
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0xc0, 0x38];
    f.extend(size.to_le_bytes());
    const BLOCK: u64 = 128 << 10;
    let blocks = size.div_ceil(BLOCK);
    for i in 0..blocks {
        let n = BLOCK.min(size - i * BLOCK) as u32;
        // last-block flag, block type 1 (RLE), size; then the byte.
        let h = u32::from(i + 1 == blocks) | (1 << 1) | (n << 3);
        f.extend(&h.to_le_bytes()[..3]);
        f.push(0);
    }
    f
}
