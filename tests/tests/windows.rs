//! Windows DLLs and EXEs (PE32+ for x86-64, built by clang-19 and lld
//! against a stand-in `amdhip64.dll`: see xtask's Windows fixtures),
//! offloaded here and run under Wine: the rewritten image loads, its host
//! code works, the stand-in runtime sees HIPK wrappers whose pointers
//! (rebased by their DIR64 base relocation, also when Windows moves the
//! DLL) reach the metadata, and metadata plus archives give exactly the code
//! objects clang-offload-bundler extracts from the input. LLVM's readers
//! accept every output without a warning; bad input is refused by name and
//! leaves nothing behind; the artifact pipelines take PE files too.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::*;
use kpack_format::bytes::{put_u16, put_u64, u32_at};
use kpack_format::hipk::{HipkMetadata, HIPK_MAGIC};
use kpack_host::pe::PeView;
use kpack_testkit::manifest::{wine_path, Host, Kind};
use serde_json::Value;

pub(crate) fn windows(name: &str) -> Fixture {
    let f = foreign_fixture(name);
    assert_eq!(f.host, Host::X86_64Windows, "{name}");
    f
}

/// The Wine prefix: the fixtures' (`<fixtures>/windows/wineprefix`, made
/// when `cargo xtask fixtures` ran the fixtures), brought up to date once
/// per test binary. Not a temporary directory: a prefix is about 700 MB
/// and a test binary cannot remove a static one when it exits.
pub(crate) fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let dir = fixtures_dir()
            .join(Host::X86_64Windows.dir())
            .join("wineprefix");
        let status = Command::new(kpack_testkit::manifest::WINE)
            .args(["wineboot", "--init"])
            .env("WINEPREFIX", &dir)
            .env("WINEDEBUG", "-all")
            .output()
            .expect("wine64 (Debian package wine64) runs");
        assert!(status.status.success(), "wineboot failed");
        dir
    })
}

/// What the host code printed: its value, then one line per wrapper the
/// stand-in runtime saw.
pub(crate) struct Run {
    pub value: i32,
    /// Magic, version, reserved1 and the metadata of each wrapper.
    pub registered: Vec<(u32, u32, u64, HipkMetadata)>,
}

/// Run `binary` (a DLL through `winload.exe`, an EXE directly) under Wine.
pub(crate) fn run_host(f: &Fixture, binary: &Path) -> Run {
    let host = f.host;
    let mut c = match f.kind {
        Kind::Shared => {
            let check = f.host_check.as_ref().expect("DLLs have a host check");
            let mut c = host.command(&fixtures_dir().join(host.loader()));
            c.arg(wine_path(binary)).arg(&*check.symbol);
            c
        }
        _ => {
            // The EXE finds amdhip64.dll in its own directory.
            let dll = fixtures_dir().join(host.dir()).join("amdhip64.dll");
            fs::copy(dll, binary.with_file_name("amdhip64.dll")).unwrap();
            host.command(binary)
        }
    };
    let out = run_ok(c.env("WINEPREFIX", prefix()));
    let mut lines = out.lines();
    let value = lines.next().unwrap_or_default().trim().parse().unwrap();
    let registered = lines
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            let bytes: Vec<u8> = (0..p[3].len() / 2)
                .map(|i| u8::from_str_radix(&p[3][2 * i..2 * i + 2], 16).unwrap())
                .collect();
            let magic = u32::from_str_radix(p[0], 16).unwrap();
            let meta = HipkMetadata::decode(&bytes).unwrap_or_else(|e| {
                panic!("{}: the wrapper's pointer reaches no metadata: {e}", f.name)
            });
            (magic, p[1].parse().unwrap(), p[2].parse().unwrap(), meta)
        })
        .collect();
    Run { value, registered }
}

/// `llvm-readobj --file-headers --sections` and `llvm-objdump -h` read the
/// image without a word on stderr.
fn assert_llvm_accepts(path: &Path) {
    let llvm = kpack_testkit::oracle::llvm_bin();
    for (tool, args) in [
        ("llvm-readobj", &["--file-headers", "--sections"][..]),
        ("llvm-objdump", &["-h"][..]),
    ] {
        let o = Command::new(llvm.join(tool))
            .args(args)
            .arg(path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && err.trim().is_empty(),
            "{tool} on {}: {err}",
            path.display()
        );
    }
}

/// Everything one Windows fixture must survive.
fn check(name: &str) {
    let f = windows(name);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bin").join(f.file_name());
    let archives = dir.path().join(".kpack");
    let clock = std::time::Instant::now();
    let summary: Value = serde_json::from_str(&kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &out,
        &"--archive-dir",
        &archives,
        &"--json",
    ]))
    .unwrap();
    let seconds = clock.elapsed().as_secs_f64();
    assert_eq!(summary["outcome"], "offloaded", "{name}");
    let (before, after) = (
        summary["input_size"].as_u64().unwrap(),
        summary["output_size"].as_u64().unwrap(),
    );
    eprintln!("{name}: {before} -> {after} bytes, offload {seconds:.3} s (with process start)");
    assert_eq!(
        summary["search_paths"][0],
        "../.kpack/".to_owned() + stem(&f) + "_@GFXARCH@.kpack"
    );
    assert_shrank_by_whole_pages(&f.path, &out);
    assert_llvm_accepts(&out);
    kpack_ok(&[&"verify-binary", &out]);
    kpack_ok(&[&"verify-elf", &out]);

    let truth = code_objects(&f.path);
    let run = run_host(&f, &out);
    let expected = f.host_check.as_ref().map_or(1_571_328, |c| c.value);
    assert_eq!(run.value, expected, "{name}: host code");
    assert_eq!(run.registered.len(), f.wrappers, "{name}: wrappers");
    let kernel_name = f.file_name();
    for (i, (magic, version, co, meta)) in run.registered.iter().enumerate() {
        assert_eq!(
            (*magic, *version, *co),
            (HIPK_MAGIC, 1, i as u64),
            "{name}: wrapper {i}"
        );
        assert_eq!(meta.kernel_name, kernel_name);
        for t in &f.targets {
            let rel = meta.search_paths[0].replace("@GFXARCH@", t);
            let a = kpack_loader::open_archive(out.parent().unwrap().join(rel)).unwrap();
            let got = a.kernel(&format!("{kernel_name}#{i}"), t).unwrap();
            assert!(
                got == truth[&(i, t.clone())],
                "{name}: wrapper {i} {t} differs from the bundler's"
            );
        }
    }
    let n: usize = fs::read_dir(&archives)
        .unwrap()
        .map(|e| {
            kpack_loader::open_archive(e.unwrap().path())
                .unwrap()
                .kernel_count()
        })
        .sum();
    assert_eq!(n, truth.len(), "{name}: archived code objects");
    assert_rerun_is_a_no_op(&out, dir.path());
}

fn stem(f: &Fixture) -> &str {
    f.file_name().split('.').next().unwrap()
}

/// The file lost `.hip_fat`'s whole pages and gained one FileAlignment
/// unit of metadata; no bundle byte is left.
fn assert_shrank_by_whole_pages(input: &Path, output: &Path) {
    let (b, o) = (fs::read(input).unwrap(), fs::read(output).unwrap());
    let pe = PeView::parse(&b).unwrap();
    let fat = pe.section(".hip_fat").unwrap().unwrap();
    let removed = fat.raw_size / 4096 * 4096;
    let fa = pe.file_alignment() as usize;
    assert_eq!(
        o.len(),
        b.len() - removed as usize + fa,
        "{}",
        output.display()
    );
    assert!(!o.windows(24).any(|w| w == b"__CLANG_OFFLOAD_BUNDLE__"));
    let new = PeView::parse(&o).unwrap();
    let nf = new.section(".hip_fat").unwrap().unwrap();
    assert_eq!((nf.rva, nf.virtual_size), (fat.rva, fat.virtual_size));
    assert!(nf.data.iter().all(|&c| c == 0));
}

/// Offloading the output again changes nothing and says so.
fn assert_rerun_is_a_no_op(out: &Path, scratch: &Path) {
    let before = fs::read(out).unwrap();
    let s: Value = serde_json::from_str(&kpack_ok(&[
        &"offload",
        &out,
        &"-o",
        &out,
        &"--archive-dir",
        &scratch.join("again"),
        &"--json",
    ]))
    .unwrap();
    assert_eq!(s["outcome"], "already_offloaded");
    assert_eq!(fs::read(out).unwrap(), before);
    assert!(!scratch.join("again").exists());
}

macro_rules! windows_tests {
    ($($test:ident => $fixture:expr),* $(,)?) => {$(
        #[test]
        fn $test() { check($fixture); }
    )*};
}

windows_tests! {
    vadd_dll => "windows/vadd.dll",
    multi_dll_rebased => "windows/multi.dll",
    compressed_dll => "windows/vadd_compressed.dll",
    overlay_dll => "windows/overlay.dll",
    big_dll => "windows/big.dll",
    small_dll => "windows/small.dll",
    vadd_exe => "windows/vadd.exe",
}

#[test]
fn every_windows_fixture_is_tested() {
    let all: Vec<String> = manifest()
        .foreign
        .into_iter()
        .filter(|e| e.host == Host::X86_64Windows)
        .map(|e| e.name)
        .collect();
    let tested = [
        "windows/vadd.dll",
        "windows/multi.dll",
        "windows/vadd_compressed.dll",
        "windows/overlay.dll",
        "windows/big.dll",
        "windows/small.dll",
        "windows/vadd.exe",
    ];
    assert_eq!(all, tested);
}

/// The multi-bundle DLL's image base is the loader EXE's: Wine must move
/// it, so the wrappers' pointers were rebased (and still reached the
/// metadata above).
#[test]
fn multi_dll_collides_with_the_loader() {
    let dll = fs::read(windows("windows/multi.dll").path).unwrap();
    let exe = fs::read(fixtures_dir().join(Host::X86_64Windows.loader())).unwrap();
    let base = |b: &[u8]| PeView::parse(b).unwrap().image_base();
    assert_eq!(base(&dll), base(&exe));
}

/// The overlay fixture really has a COFF symbol table and data after its
/// last section, and both survive: same bytes, new place.
#[test]
fn overlay_and_symbols_move_intact() {
    let f = windows("windows/overlay.dll");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("overlay.dll");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &out,
        &"--archive-dir",
        &dir.path().join("k"),
    ]);
    let (b, o) = (fs::read(&f.path).unwrap(), fs::read(&out).unwrap());
    let (old, new) = (PeView::parse(&b).unwrap(), PeView::parse(&o).unwrap());
    let raw_end = |v: &PeView| {
        v.sections()
            .unwrap()
            .iter()
            .map(|s| s.raw_offset + s.raw_size)
            .max()
            .unwrap() as usize
    };
    let sym = |v: &PeView| {
        v.file_header()
            .pointer_to_symbol_table
            .get(object::LittleEndian) as usize
    };
    assert!(sym(&old) >= raw_end(&old) && sym(&old) > 0);
    assert!(
        b.len() > sym(&old) + 18 * 10,
        "has symbols and appended data"
    );
    assert_eq!(&o[raw_end(&new)..], &b[raw_end(&old)..]);
    assert_eq!(sym(&new) - raw_end(&new), sym(&old) - raw_end(&old));
    let nm = Command::new(kpack_testkit::oracle::llvm_bin().join("llvm-nm"))
        .arg(&out)
        .output()
        .unwrap();
    assert!(nm.status.success() && String::from_utf8_lossy(&nm.stdout).contains("vadd_host_check"));
}

/// `kpack ls` and `extract` on a fat and an offloaded DLL.
#[test]
fn ls_and_extract() {
    let f = windows("windows/multi.dll");
    let dir = tempfile::tempdir().unwrap();
    let ls: Value = serde_json::from_str(&kpack_ok(&[&"ls", &f.path, &"--json"])).unwrap();
    assert_eq!(
        (ls["kind"].as_str(), ls["container"].as_str()),
        (Some("fat_binary"), Some("dll"))
    );
    assert_eq!(ls["section_name"], ".hip_fat");
    assert_eq!(ls["bundles"].as_array().unwrap().len(), 4);
    let x = dir.path().join("x");
    kpack_ok(&[&"extract", &f.path, &"-o", &x]);
    let truth = code_objects(&f.path);
    for ((bundle, target), bytes) in &truth {
        assert!(fs::read(x.join(format!("{target}#{bundle}.hsaco"))).unwrap() == *bytes);
    }
    let out = dir.path().join("bin/multi.dll");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &out,
        &"--archive-dir",
        &dir.path().join(".kpack"),
    ]);
    let ls: Value = serde_json::from_str(&kpack_ok(&[&"ls", &out, &"--json"])).unwrap();
    assert_eq!(
        (ls["kind"].as_str(), ls["pe_kind"].as_str()),
        (Some("offloaded"), Some("dll"))
    );
    let y = dir.path().join("y");
    kpack_ok(&[&"extract", &out, &"-o", &y]);
    assert_eq!(names(&y).len(), truth.len());
}

/// A copy of the vadd DLL with `edit` applied, offloaded: the error names
/// the file and `want`, and nothing is written.
fn refused(label: &str, edit: &dyn Fn(&mut Vec<u8>), want: &str) {
    let f = windows("windows/vadd.dll");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join(format!("{label}.dll"));
    let mut b = fs::read(&f.path).unwrap();
    edit(&mut b);
    fs::write(&bad, &b).unwrap();
    let out = dir.path().join("out/x.dll");
    let archives = dir.path().join("k");
    let err = kpack_fails(&[&"offload", &bad, &"-o", &out, &"--archive-dir", &archives]);
    assert!(err.contains(&bad.display().to_string()), "{label}: {err}");
    assert!(err.contains(want), "{label}: {err}");
    assert!(
        !out.exists() && !archives.exists() && !dir.path().join("out").exists(),
        "{label}"
    );
}

/// Field offsets in the fixture's headers, and its sections by name.
fn layout(b: &[u8]) -> (u64, BTreeMap<String, (u64, u64, u64)>) {
    let pe = PeView::parse(b).unwrap();
    let secs = pe
        .sections()
        .unwrap()
        .into_iter()
        .map(|s| (s.name.clone(), (s.rva, s.raw_offset, s.virtual_size)))
        .collect();
    (pe.file_header_offset(), secs)
}

#[test]
fn bad_input_is_refused_by_name() {
    refused("truncated", &|b| b.truncate(0x150), "malformed PE");
    refused(
        "sections",
        &|b| {
            let (fh, _) = layout(b);
            put_u16(b, fh as usize + 2, 0x7ff0);
        },
        "section table",
    );
    refused(
        "pe32",
        &|b| {
            let (fh, _) = layout(b);
            put_u16(b, fh as usize + 20, 0x10b);
        },
        "PE32 (32-bit)",
    );
    refused(
        "pointer",
        &|b| {
            let (_, s) = layout(b);
            let (text, wrappers) = (s[".text"].0, s[".hipFatB"].1);
            let base = PeView::parse(b).unwrap().image_base();
            put_u64(b, wrappers as usize + 8, base + text);
        },
        "does not point at the start of a bundle in .hip_fat",
    );
    refused(
        "reloc",
        &|b| {
            // The relocated constructor pointer in .CRT now names a byte
            // of .hip_fat.
            let (_, s) = layout(b);
            let (fat, crt) = (s[".hip_fat"].0, s[".CRT"].1);
            let base = PeView::parse(b).unwrap().image_base();
            let at = (crt..crt + 24)
                .step_by(8)
                .find(|&o| u32_at(b, o).is_some_and(|v| v != 0))
                .unwrap();
            put_u64(b, at as usize, base + fat + 0x20);
        },
        "points inside .hip_fat",
    );
}

/// split, verify and pack-tree take PE files: `bin/foo.dll` gets
/// `../.kpack/...` and a `/`-separated kernel name, and every wrapper
/// resolves.
#[test]
fn artifact_pipelines_take_dlls() {
    let tmp = tempfile::tempdir().unwrap();
    let f = windows("windows/multi.dll");
    let prefix = "math-libs/hip/stage";
    let art = tmp.path().join("build/gfx110X-build/hip_lib_gfx110X-dgpu");
    let bin = art.join(prefix).join("bin");
    fs::create_dir_all(&bin).unwrap();
    fs::copy(&f.path, bin.join("multi.dll")).unwrap();
    fs::copy(
        fixtures_dir().join("windows/vadd.exe"),
        bin.join("vadd.exe"),
    )
    .unwrap();
    fs::write(art.join("artifact_manifest.txt"), format!("{prefix}\n")).unwrap();
    let split = tmp.path().join("split/gfx110X-build");
    kpack_ok(&[&"split", &"--artifact-dir", &art, &"--output-dir", &split]);
    let generic = split.join("hip_lib_generic").join(prefix);
    let v = kpack_host::offload::verify_file(&generic.join("bin/multi.dll")).unwrap();
    assert_eq!(v.metadata.kernel_name, format!("{prefix}/bin/multi.dll"));
    assert_eq!(
        v.metadata.search_paths,
        ["../.kpack/hip_lib_@GFXARCH@.kpack"]
    );
    kpack_ok(&[&"verify", &"--artifacts-dir", &split]);
    for t in ["gfx1100", "gfx942"] {
        let a = split
            .join(format!("hip_lib_{t}"))
            .join(prefix)
            .join(format!(".kpack/hip_lib_{t}.kpack"));
        let a = kpack_loader::open_archive(&a).unwrap();
        assert!(a.entry(&format!("{prefix}/bin/vadd.exe#0"), t).is_some());
        assert!(a.entry(&format!("{prefix}/bin/multi.dll#3"), t).is_some());
    }

    let tree = tmp.path().join("tree");
    fs::create_dir_all(tree.join("bin")).unwrap();
    fs::copy(&f.path, tree.join("bin/multi.dll")).unwrap();
    let packed = tmp.path().join("packed");
    kpack_ok(&[
        &"pack-tree",
        &"--input",
        &tree,
        &"--output",
        &packed,
        &"--group-name",
        &"rocm",
    ]);
    let out = packed.join("bin/multi.dll");
    let v = kpack_host::offload::verify_file(&out).unwrap();
    assert_eq!(v.metadata.kernel_name, "bin/multi.dll");
    assert_eq!(v.metadata.search_paths, ["../.kpack/rocm_@GFXARCH@.kpack"]);
    let run = run_host(&f, &out);
    assert_eq!(run.registered.len(), 4);
    let truth = code_objects(&f.path);
    let loader = kpack_loader::Loader::new(kpack_loader::Config::default());
    for (_, _, co, meta) in &run.registered {
        let got: PathBuf = out.clone();
        let bytes = loader
            .load_code_object(&meta.encode(), &got, *co as u32, &["gfx942"])
            .unwrap();
        assert!(bytes == truth[&(*co as usize, "gfx942".to_string())]);
    }
}

/// Damaged DLLs and EXEs: classification, the code object reader, what
/// `ls`/`extract` read, the transform and the verifier give errors, never
/// panics; whatever the
/// transform produces passes the verifier (the driver checks it).
#[test]
fn mutated_images_never_panic() {
    use kpack_host::offload::pe::{transform, verify_pe};
    let meta = HipkMetadata::new("bin/x.dll", vec!["../.kpack/x_@GFXARCH@.kpack".into()]).encode();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut produced = 0;
    for name in ["windows/vadd.dll", "windows/multi.dll", "windows/vadd.exe"] {
        let original = fs::read(windows(name).path).unwrap();
        // Headers, the section table, the wrappers and the relocations
        // hold what the transform reads: mutate mostly there.
        let hot = original.len().min(0x1800);
        for round in 0..400 {
            let mut b = original.clone();
            for _ in 0..1 + rng.below(4) {
                let at = if round % 4 == 0 {
                    rng.below(b.len())
                } else {
                    rng.below(hot)
                };
                let v = rng.next_u64() as u8;
                b[at] = match rng.below(3) {
                    0 => v,
                    1 => b[at] ^ (1 << (v % 8)),
                    _ => 0xff,
                };
            }
            let r = std::panic::catch_unwind(|| {
                let _ = kpack_host::binary::classify(&b);
                let _ = kpack_host::offload::code_objects(Path::new("x.dll"), &b);
                let _ = kpack_host::fatbin::read_device_code(Path::new("x.dll"), &b);
                transform(&b, &meta)
            });
            let r = r.unwrap_or_else(|_| panic!("{name}: panicked on mutation round {round}"));
            if let Ok(t) = r {
                let t_bytes = t.to_vec();
                produced += 1;
                let v = std::panic::catch_unwind(|| verify_pe(&t_bytes, Some(t.bundles)));
                let v = v.unwrap_or_else(|_| panic!("{name}: verifier panicked on round {round}"));
                assert!(v.is_ok(), "{name}: round {round}: {}", v.unwrap_err());
            }
        }
    }
    assert!(
        produced > 0,
        "no mutation was transformable: only errors exercised"
    );
}
