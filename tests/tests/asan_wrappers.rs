//! AddressSanitizer builds: padded wrapper tables (formats.md §4.1).
//!
//! clang 19 instruments each translation unit's `__hip_fatbin_wrapper`
//! global when the host side is built with `-fsanitize=address`: the
//! 24-byte record gets a 40-byte zero red zone (64-byte slots) and
//! `.hipFatBinSegment` is 32-aligned, so a link of three such units has a
//! 192-byte table (8 × 24: read as a plain array it is eight "wrappers"),
//! and a link that mixes plain and ASan units has no constant stride at
//! all. These tests build real libraries and PIE executables that way with
//! lld, GNU ld, gold and mold, offload them with `kpack offload`, check
//! that only the records changed (padding, `asan_globals`, its relocations
//! and section link, the wrapper symbols as they were), verify them, load
//! them with the ASan runtime preloaded through the stand-in HIP runtime,
//! and resolve every wrapper the runtime is handed, through the loader, to
//! exactly the bytes clang-offload-bundler extracts from the input. Damaged
//! records stay errors on padded tables.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::*;
use kpack_format::hipk::{HipkMetadata, HIPF_MAGIC, HIPK_MAGIC};
use serde_json::Value;

const CLANGXX: &str = "clang++-19";
const TARGETS: &[&str] = &["gfx1100", "gfx942"];
/// clang 19's ASan runtime, which an ASan library needs loaded first.
const ASAN_RUNTIME: &str = "/usr/lib/llvm-19/lib/clang/19/lib/linux/libclang_rt.asan-x86_64.so";

/// The translation units, compiled once per test process: three with ASan
/// on the host side, one plain, and the PIE's main (ASan).
struct Objects {
    dir: PathBuf,
}

impl Objects {
    fn get() -> &'static Objects {
        static OBJECTS: OnceLock<Objects> = OnceLock::new();
        OBJECTS.get_or_init(|| {
            let dir = workspace()
                .join("target/test-asan")
                .join(std::process::id().to_string());
            std::fs::create_dir_all(&dir).unwrap();
            let hip = workspace().join("integration/hip");
            let units = [
                ("vadd", "vadd.hip", true),
                ("reduce", "reduce.hip", true),
                ("stencil", "stencil.hip", true),
                ("histogram", "histogram.hip", false),
                ("main", "vadd_main.cpp", true),
            ];
            let children: Vec<_> = units
                .iter()
                .map(|&(stem, source, asan)| {
                    let mut c = Command::new(CLANGXX);
                    c.args(["-O2", "-Wall", "-fPIC", "-c"]);
                    if source.ends_with(".hip") {
                        c.args(["-x", "hip", "-nogpulib", "-nogpuinc"]);
                        c.args(TARGETS.iter().map(|t| format!("--offload-arch={t}")));
                    }
                    if asan {
                        c.args(["-Xarch_host", "-fsanitize=address"]);
                    }
                    c.arg("-I").arg(&hip).arg(hip.join(source));
                    c.arg("-o").arg(dir.join(format!("{stem}.o")));
                    (stem, c.spawn().expect("clang++-19"))
                })
                .collect();
            for (stem, mut child) in children {
                assert!(child.wait().unwrap().success(), "compiling {stem}");
            }
            Objects { dir }
        })
    }

    fn obj(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}.o"))
    }
}

/// What is linked.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    /// A library of three ASan units: 64-byte slots.
    Asan,
    /// A library of a plain unit then two ASan units.
    Mixed,
    /// A PIE executable (vadd and main, both ASan; the runtime linked in).
    Pie,
}

impl Shape {
    const ALL: [Shape; 3] = [Shape::Asan, Shape::Mixed, Shape::Pie];

    /// Where the records start in `.hipFatBinSegment`, and its size.
    fn layout(self) -> (Vec<u64>, u64) {
        match self {
            Shape::Asan => (vec![0, 64, 128], 192),
            Shape::Mixed => (vec![0, 32, 96], 160),
            Shape::Pie => (vec![0], 64),
        }
    }

    fn file_name(self, linker: &str) -> String {
        match self {
            Shape::Asan => format!("libasan_{linker}.so"),
            Shape::Mixed => format!("libmixed_{linker}.so"),
            Shape::Pie => format!("asan_pie_{linker}"),
        }
    }
}

/// Link `shape` with `linker` into `dir`.
fn link(shape: Shape, linker: &str, dir: &Path) -> PathBuf {
    let o = Objects::get();
    let out = dir.join(shape.file_name(linker));
    let mut c = Command::new(CLANGXX);
    c.arg(format!("-fuse-ld={linker}"))
        .arg("-fsanitize=address");
    match shape {
        Shape::Asan => {
            c.args(["-shared", "-shared-libsan"]);
            c.args(["vadd", "reduce", "stencil"].map(|s| o.obj(s)));
        }
        Shape::Mixed => {
            c.args(["-shared", "-shared-libsan"]);
            c.args(["histogram", "vadd", "reduce"].map(|s| o.obj(s)));
        }
        Shape::Pie => {
            c.arg("-pie");
            c.args(["vadd", "main"].map(|s| o.obj(s)));
        }
    }
    run_ok(c.arg("-lamdhip64").arg("-o").arg(&out));
    out
}

/// A section's line of `readelf -SW`: (address, file offset, size, and the
/// rest: type, entry size, flags, link, info, alignment).
struct SectionLine {
    addr: u64,
    size: u64,
    rest: String,
}

fn section_line(binary: &Path, name: &str) -> SectionLine {
    let text = run_ok(Command::new("readelf").arg("-SW").arg(binary));
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name) || l.contains(&format!("] {name} ")))
        .unwrap_or_else(|| panic!("{}: no section {name}", binary.display()));
    let after = &line[line.find(']').unwrap() + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // name type addr off size es flg lk inf al
    let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
    SectionLine {
        addr: hex(f[2]),
        size: hex(f[4]),
        rest: [f[1], f[5], f[6], f[7], f[8], f[9]].join(" "),
    }
}

/// A section's bytes (`llvm-objcopy --dump-section`: `-O binary` refuses
/// to drop the sections `asan_globals` links to).
fn dump_section(binary: &Path, name: &str, scratch: &Path) -> Vec<u8> {
    let file = scratch.join("dumped");
    run_ok(
        Command::new("llvm-objcopy-19")
            .arg(format!("--dump-section={name}={}", file.display()))
            .arg(binary)
            .arg(scratch.join("dump.out")),
    );
    std::fs::read(&file).unwrap()
}

/// The wrapper symbols (`readelf -sW` lines of objects named
/// `__hip_fatbin_wrapper`, without their ordinal; mold also keeps ASan's
/// absolute `__hip_fatbin_wrapper.<hash>` markers, not objects).
fn wrapper_symbols(binary: &Path) -> Vec<String> {
    run_ok(Command::new("readelf").arg("-sW").arg(binary))
        .lines()
        .filter(|l| l.contains("__hip_fatbin_wrapper") && l.contains(" OBJECT "))
        .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        .collect()
}

/// Every dynamic relocation (`readelf -rW` entries) but those applying at
/// `skip`, as text.
fn relocations_but(binary: &Path, skip: &[u64]) -> Vec<String> {
    let mut v: Vec<String> = run_ok(Command::new("readelf").arg("-rW").arg(binary))
        .lines()
        .filter(|l| {
            let first = l.split_whitespace().next().unwrap_or("");
            u64::from_str_radix(first, 16).is_ok_and(|a| !skip.contains(&a))
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    v.sort();
    v
}

/// What the stand-in HIP runtime was handed when `binary` ran (a library
/// through dlcheck, with the ASan runtime preloaded first; an executable
/// directly, its runtime linked in).
fn run_registered(shape: Shape, binary: &Path) -> Vec<RawRegistration> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let shim = shim();
    let (mut c, preload) = match shape {
        Shape::Pie => (Command::new(binary), shim.display().to_string()),
        _ => {
            let mut c = Command::new(fixtures_dir().join(manifest().dlcheck));
            let symbol = if shape == Shape::Mixed {
                "reduce_host_check"
            } else {
                "vadd_host_check"
            };
            c.arg(binary).arg(symbol);
            (c, format!("{ASAN_RUNTIME}:{}", shim.display()))
        }
    };
    let out = run_ok(
        c.env("LD_PRELOAD", preload)
            .env("KPACK_SHIM_LOG", &log)
            .env("ASAN_OPTIONS", "detect_leaks=0"),
    );
    match shape {
        Shape::Pie => assert_eq!(out, ""),
        Shape::Mixed => assert_eq!(out.trim(), "500500"),
        Shape::Asan => assert_eq!(out.trim(), "1571328"),
    }
    raw_registrations(&log)
}

/// Offload one linked binary and check everything this issue asks of it.
fn check_offload(shape: Shape, linker: &str, input: &Path) {
    let name = shape.file_name(linker);
    let (records, size) = shape.layout();
    let seg = section_line(input, ".hipFatBinSegment");
    assert_eq!(seg.size, size, "{name}: table size");
    assert!(
        seg.rest.ends_with(" 32"),
        "{name}: 32-aligned: {}",
        seg.rest
    );
    let scratch = tempfile::tempdir().unwrap();
    let table_in = objcopy_section(input, ".hipFatBinSegment", scratch.path());
    for (i, &r) in records.iter().enumerate() {
        let at = r as usize;
        assert_eq!(
            u32::from_le_bytes(table_in[at..at + 4].try_into().unwrap()),
            HIPF_MAGIC,
            "{name}: record {i}"
        );
    }

    // Every command reads the table by layout.
    let ls: Value = serde_json::from_str(&kpack_ok(&[&"ls", &input, &"--json"])).unwrap();
    assert_eq!(
        ls["wrappers"].as_array().unwrap().len(),
        records.len(),
        "{name}: ls"
    );
    let ex = tempfile::tempdir().unwrap();
    kpack_ok(&[&"extract", &input, &"-o", &ex.path()]);
    let truth = code_objects(input);
    assert_eq!(dir_files(ex.path()).len(), truth.len(), "{name}: extract");

    // Offload.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lib").join(&name);
    let archives = dir.path().join(".kpack");
    let summary: Value = offload_json(input, &out, &archives);
    assert_eq!(summary["outcome"], "offloaded", "{name}");
    assert_tools_accept(input, &out);

    // Only the records changed: magic, pointer and reserved1 of each; the
    // padding, asan_globals (bytes, header, link), every other relocation
    // and the wrapper symbols are as they were.
    let table_out = objcopy_section(&out, ".hipFatBinSegment", scratch.path());
    assert_eq!(table_in.len(), table_out.len());
    let in_record = |at: usize| {
        records
            .iter()
            .any(|&r| (r as usize..r as usize + 24).contains(&at))
    };
    for at in 0..table_in.len() {
        if !in_record(at) {
            assert_eq!(table_in[at], table_out[at], "{name}: padding byte +{at:#x}");
            assert_eq!(table_out[at], 0, "{name}: padding byte +{at:#x}");
        }
    }
    for (i, &r) in records.iter().enumerate() {
        let at = r as usize;
        let word =
            |b: &[u8], o: usize| u64::from_le_bytes(b[at + o..at + o + 8].try_into().unwrap());
        assert_eq!(&table_out[at..at + 4], b"HIPK", "{name}: record {i}");
        assert_eq!(&table_out[at + 4..at + 8], &table_in[at + 4..at + 8]);
        assert_eq!(
            word(&table_out, 16),
            i as u64,
            "{name}: record {i} co_index"
        );
    }
    let (gi, go) = (
        section_line(input, "asan_globals"),
        section_line(&out, "asan_globals"),
    );
    assert_eq!(
        (gi.addr, gi.size, &gi.rest),
        (go.addr, go.size, &go.rest),
        "{name}: asan_globals header"
    );
    assert_eq!(
        dump_section(input, "asan_globals", scratch.path()),
        dump_section(&out, "asan_globals", scratch.path()),
        "{name}: asan_globals bytes"
    );
    let pointers: Vec<u64> = records.iter().map(|r| seg.addr + r + 8).collect();
    assert_eq!(
        relocations_but(input, &pointers),
        relocations_but(&out, &pointers),
        "{name}: relocations other than the wrappers' pointers"
    );
    // ASan records' symbols have size 64 (record and red zone), a plain
    // one's 24.
    let symbols = wrapper_symbols(input);
    let mut sizes: Vec<&str> = symbols
        .iter()
        .filter_map(|s| s.split_whitespace().nth(1))
        .collect();
    sizes.sort();
    let want = if shape == Shape::Mixed {
        vec!["24", "64", "64"]
    } else {
        vec!["64"; records.len()]
    };
    assert_eq!(sizes, want, "{name}: {symbols:?}");
    assert_eq!(symbols, wrapper_symbols(&out), "{name}: wrapper symbols");

    // Loaded with the ASan runtime: the stand-in HIP runtime is handed HIPK
    // wrappers whose metadata and co_index lead, through the loader's own
    // search, to exactly the bundler's code objects, each wrapper to the
    // bundle it was handed before.
    let before = run_registered(shape, input);
    let after = run_registered(shape, &out);
    assert_eq!(before.len(), records.len(), "{name}: registrations");
    assert_eq!(after.len(), records.len(), "{name}: registrations");
    let bundles = split_bundles(&objcopy_section(input, ".hip_fatbin", scratch.path()));
    let loader = kpack_loader::Loader::new(kpack_loader::Config::default());
    let mut seen = Vec::new();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!((b.magic, a.magic), (HIPF_MAGIC, HIPK_MAGIC), "{name}");
        assert_eq!(a.version, 1);
        let co = a.reserved1 as usize;
        assert!(
            bundles[co].starts_with(&b.bytes),
            "{name}: wrapper registered as bundle {co} pointed at another bundle"
        );
        let meta = HipkMetadata::decode(&a.bytes).expect("HIPK metadata");
        assert_eq!(meta.kernel_name, name);
        for t in TARGETS {
            let got = loader
                .load_code_object(&a.bytes, &out, co as u32, &[t])
                .unwrap_or_else(|e| panic!("{name}: wrapper {co} {t}: {e}"));
            assert!(
                got == truth[&(co, t.to_string())],
                "{name}: wrapper {co} {t} differs from the bundler's"
            );
        }
        seen.push(co);
    }
    seen.sort();
    assert_eq!(seen, (0..records.len()).collect::<Vec<_>>(), "{name}");

    // The other commands on the offloaded binary.
    let why = kpack(&[&"why", &out, &"--arch", &"gfx942"]);
    assert!(why.status.success(), "{name}: why");
    assert_eq!(
        String::from_utf8_lossy(&why.stdout)
            .matches("=> loads")
            .count(),
        records.len(),
        "{name}: why"
    );
    let ex = tempfile::tempdir().unwrap();
    kpack_ok(&[&"extract", &out, &"-o", &ex.path()]);
    assert_eq!(
        dir_files(ex.path()).len(),
        truth.len(),
        "{name}: extract offloaded"
    );

    // Prune and restore keep the padding too, and their outputs load.
    let pruned = dir.path().join(format!("pruned-{name}"));
    kpack_ok(&[&"prune", &input, &"-o", &pruned, &"--targets", &"gfx942"]);
    kpack_ok(&[&"verify-elf", &pruned]);
    let regs = run_registered(shape, &pruned);
    assert!(regs.iter().all(|r| r.magic == HIPF_MAGIC), "{name}: pruned");
    assert_eq!(regs.len(), records.len());
    let restored = dir.path().join("lib").join(format!("restored-{name}"));
    kpack_ok(&[&"restore", &out, &"-o", &restored]);
    kpack_ok(&[&"verify-elf", &restored]);
    let regs = run_registered(shape, &restored);
    assert_eq!(regs.len(), records.len());
    assert_eq!(
        code_objects(&restored),
        truth,
        "{name}: restored code objects"
    );
    let table_restored = objcopy_section(&restored, ".hipFatBinSegment", scratch.path());
    for at in (0..table_in.len()).filter(|&at| !in_record(at)) {
        assert_eq!(table_restored[at], 0, "{name}: restored padding +{at:#x}");
    }

    // pack-tree packs it like any fat binary, and verify --tree finds the
    // tree sound (every kernel of every code object named by the binary).
    let tree_in = dir.path().join("tree-in/lib");
    std::fs::create_dir_all(&tree_in).unwrap();
    std::fs::copy(input, tree_in.join(&name)).unwrap();
    let tree = dir.path().join("tree");
    kpack_ok(&[
        &"pack-tree",
        &"--input",
        &tree_in.parent().unwrap(),
        &"--output",
        &tree,
        &"--group-name",
        &"asan",
    ]);
    let ok = kpack_ok(&[&"verify", &"--tree", &tree]);
    assert!(
        ok.contains("OK: 1 binary with device code (1 offloaded)"),
        "{name}: {ok}"
    );
}

fn check_linker(linker: &str) {
    let dir = tempfile::tempdir().unwrap();
    for shape in Shape::ALL {
        let input = link(shape, linker, dir.path());
        check_offload(shape, linker, &input);
    }
}

#[test]
fn lld() {
    check_linker("lld");
}

#[test]
fn gnu_ld() {
    check_linker("bfd");
}

#[test]
fn gold() {
    check_linker("gold");
}

#[test]
fn mold() {
    check_linker("mold");
}

/// Damaged records stay errors, wherever they sit in a padded table: a
/// wrong magic, a wrong version, a pointer that names no bundle, a record
/// zeroed in the file (its relocation still applies between records), a
/// record cut off by the end of the table.
#[test]
fn damaged_padded_records_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let input = link(Shape::Mixed, "lld", dir.path());
    let bytes = std::fs::read(&input).unwrap();
    let elf = kpack_host::elf::ElfView::parse(&bytes).unwrap();
    let seg = elf.section(".hipFatBinSegment").unwrap().unwrap();
    let (off, addr) = (seg.offset as usize, seg.addr);
    let relas = elf.relas().unwrap();
    let fat = elf.section(".hip_fatbin").unwrap().unwrap().addr;
    let mut cases: BTreeMap<&str, (Vec<u8>, &str)> = BTreeMap::new();
    let mut b = bytes.clone();
    b[off + 96..off + 100].copy_from_slice(b"XXXX");
    cases.insert("magic", (b, "wrapper 2: unknown magic 0x58585858"));
    let mut b = bytes.clone();
    b[off + 36..off + 40].copy_from_slice(&7u32.to_le_bytes());
    cases.insert("version", (b, "wrapper 1: version 7"));
    let mut b = bytes.clone();
    let r = relas
        .iter()
        .find(|r| r.r_offset == addr + 32 + 8)
        .expect("the relocation of record 1");
    let at = r.entry_offset as usize + 16;
    b[at..at + 8].copy_from_slice(&(fat + 8).to_le_bytes());
    cases.insert("pointer", (b, "does not point at the start of a bundle"));
    let mut b = bytes.clone();
    b[off + 32..off + 56].fill(0);
    cases.insert("zeroed", (b, "between wrapper records"));
    let mut b = bytes.clone();
    b[off + 152..off + 160].copy_from_slice(&[1; 8]);
    cases.insert("cut", (b, "runs past the end of the table"));
    for (what, (damaged, needle)) in cases {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("libbad.so");
        std::fs::write(&path, damaged).unwrap();
        let out = d.path().join("out.so");
        let err = kpack_fails(&[
            &"offload",
            &path,
            &"-o",
            &out,
            &"--archive-dir",
            &d.path().join("k"),
        ]);
        assert!(err.contains(needle), "{what}: {err}");
        assert!(!out.exists());
    }
}

/// clang 19 for `x86_64-pc-windows-msvc` pads the same way: a DLL of a
/// plain unit and two ASan units has a 160-byte `.hipFatB` with records at
/// +0x0, +0x20 and +0x60. Offloaded, verified and run under Wine (the ASan
/// entry points the units call are stubs: no Windows ASan runtime here;
/// the globals instrumentation, which pads the records, needs none), every
/// wrapper the stand-in `amdhip64.dll` is handed resolves to the bundler's
/// bytes. A record zeroed in the file is refused (its DIR64 base relocation
/// then applies between records).
#[test]
fn pe_mixed_table() {
    use kpack_testkit::manifest::{wine_path, Host, WINE};
    let w = fixtures_dir().join(Host::X86_64Windows.dir());
    let hip = workspace().join("integration/hip");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let target = "--target=x86_64-pc-windows-msvc";
    std::fs::write(
        d.join("asanstub.c"),
        "void __asan_init(void) {}\nvoid __asan_version_mismatch_check_v8(void) {}\n\
         #define S(n) void __asan_load##n(void *p) { (void)p; } void __asan_store##n(void *p) { (void)p; }\n\
         S(1) S(2) S(4) S(8) S(16)\n",
    )
    .unwrap();
    run_ok(
        Command::new("clang-19")
            .args([target, "-O2", "-c", "-o"])
            .arg(d.join("asanstub.o"))
            .arg(d.join("asanstub.c")),
    );
    let mut objects = Vec::new();
    for (stem, asan) in [("histogram", false), ("vadd", true), ("reduce", true)] {
        let o = d.join(format!("{stem}.o"));
        let mut c = Command::new(CLANGXX);
        c.args([target, "-O2", "-x", "hip", "-nogpulib", "-nogpuinc", "-c"]);
        c.args(TARGETS.iter().map(|t| format!("--offload-arch={t}")));
        if asan {
            // Checks of loads and stores as calls (to the stubs), none on
            // the stack.
            c.args(["-Xarch_host", "-fsanitize=address"]);
            c.args(["-mllvm", "-asan-instrumentation-with-call-threshold=0"]);
            c.args(["-mllvm", "-asan-stack=0"]);
        }
        run_ok(
            c.arg("-I")
                .arg(&hip)
                .arg(hip.join(format!("{stem}.hip")))
                .arg("-o")
                .arg(&o),
        );
        objects.push(o);
    }
    let dll = d.join("mixed.dll");
    run_ok(
        Command::new(CLANGXX)
            .args([target, "-fuse-ld=lld", "-nostdlib", "-shared"])
            .args([
                "-Wl,-entry:_DllMainCRTStartup",
                "-Wl,-export:reduce_host_check",
            ])
            .args(&objects)
            .arg(d.join("asanstub.o"))
            .arg(w.join("crt.o"))
            .arg(w.join("amdhip64.lib"))
            .arg("-o")
            .arg(&dll),
    );
    let bytes = std::fs::read(&dll).unwrap();
    let pe = kpack_host::pe::PeView::parse(&bytes).unwrap();
    let seg = pe.section(".hipFatB").unwrap().unwrap();
    assert_eq!(seg.mem_size(), 160, "the table is padded");
    let ls: Value = serde_json::from_str(&kpack_ok(&[&"ls", &dll, &"--json"])).unwrap();
    assert_eq!(ls["wrappers"].as_array().unwrap().len(), 3);

    let out = d.join("bin/mixed.dll");
    kpack_ok(&[
        &"offload",
        &dll,
        &"-o",
        &out,
        &"--archive-dir",
        &d.join(".kpack"),
    ]);
    kpack_ok(&[&"verify-elf", &out]);
    let after = std::fs::read(&out).unwrap();
    let pe_out = kpack_host::pe::PeView::parse(&after).unwrap();
    let (t_in, t_out) = (seg.data, pe_out.section(".hipFatB").unwrap().unwrap().data);
    for at in 0..160 {
        if ![0usize, 32, 96].iter().any(|&r| (r..r + 24).contains(&at)) {
            assert_eq!((t_in[at], t_out[at]), (0, 0), "padding +{at:#x}");
        }
    }

    // Under Wine: the fixtures' prefix (see windows.rs).
    let prefix = w.join("wineprefix");
    let boot = Command::new(WINE)
        .args(["wineboot", "--init"])
        .env("WINEPREFIX", &prefix)
        .env("WINEDEBUG", "-all")
        .output()
        .expect("wine64");
    assert!(boot.status.success());
    let text = run_ok(
        Host::X86_64Windows
            .command(&w.join("winload.exe"))
            .arg(wine_path(&out))
            .arg("reduce_host_check")
            .env("WINEPREFIX", &prefix),
    );
    let mut lines = text.lines();
    assert_eq!(lines.next().map(str::trim), Some("500500"));
    let truth = code_objects(&dll);
    let loader = kpack_loader::Loader::new(kpack_loader::Config::default());
    let mut n = 0;
    for (i, l) in lines.enumerate() {
        let p: Vec<&str> = l.trim().split(' ').collect();
        assert_eq!(u32::from_str_radix(p[0], 16).unwrap(), HIPK_MAGIC);
        assert_eq!(p[2], i.to_string(), "co_index of wrapper {i}");
        let meta: Vec<u8> = (0..p[3].len() / 2)
            .map(|k| u8::from_str_radix(&p[3][2 * k..2 * k + 2], 16).unwrap())
            .collect();
        for t in TARGETS {
            let got = loader
                .load_code_object(&meta, &out, i as u32, &[t])
                .unwrap();
            assert!(got == truth[&(i, t.to_string())], "wrapper {i} {t}");
        }
        n += 1;
    }
    assert_eq!(n, 3, "wrappers handed to the runtime");

    // Damage: record 1 zeroed in the file.
    let mut b = bytes.clone();
    let off = seg.raw_offset as usize;
    b[off + 32..off + 56].fill(0);
    let bad = d.join("bad.dll");
    std::fs::write(&bad, b).unwrap();
    let err = kpack_fails(&[
        &"offload",
        &bad,
        &"-o",
        &d.join("x.dll"),
        &"--archive-dir",
        &d.join("k"),
    ]);
    assert!(err.contains("between wrapper records"), "{err}");
}
