//! `kpack offload` on real binaries: the rewritten binary is valid for
//! every tool that reads ELF, still loads and runs, and its wrappers lead
//! (through the HIPK metadata and the archives) to exactly the code objects
//! clang-offload-bundler extracts from the original.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use kpack_format::hipk::HIPK_MAGIC;
use serde_json::Value;

struct Offloaded {
    _dir: tempfile::TempDir,
    out: PathBuf,
    archives: PathBuf,
    summary: Value,
}

fn offload_to(input: &Path, dir: tempfile::TempDir) -> Offloaded {
    let out = dir.path().join("lib").join(input.file_name().unwrap());
    let archives = dir.path().join(".kpack");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let summary = offload_json(input, &out, &archives);
    Offloaded {
        _dir: dir,
        out,
        archives,
        summary,
    }
}

fn offload(input: &Path) -> Offloaded {
    offload_to(input, tempfile::tempdir().unwrap())
}

/// Everything the issue asks of one offloaded fixture.
fn check_fixture(name: &str) {
    check_fixture_but(name, &[]);
}

/// [`check_fixture`], with eu-elflint complaints containing one of `known`
/// let through (a known defect of the ELF rewrite, named by the caller).
fn check_fixture_but(name: &str, known: &[&str]) {
    let f = fixture(name);
    let o = offload(&f.path);
    assert_eq!(o.summary["outcome"], "offloaded");
    assert_tools_accept_but(&f.path, &o.out, known);

    // Host code still runs, and the runtime sees HIPK wrappers whose
    // metadata and archives give back the original code objects.
    let regs = registered(&f, &o.out);
    // An -fgpu-rdc link registers once for all its translation units (they
    // share one handle); otherwise every wrapper is registered.
    let registrations = if name == "librdc.so" { 1 } else { f.wrappers };
    assert_eq!(regs.len(), registrations, "{name}: wrappers registered");
    let truth = code_objects(&f.path);
    let kernel_name = o.out.file_name().unwrap().to_string_lossy().into_owned();
    for (i, r) in regs.iter().enumerate() {
        assert_eq!(r.magic, HIPK_MAGIC, "{name}: wrapper {i} magic");
        assert_eq!(r.version, 1);
        let want_co = if f.bundles == 1 { 0 } else { i as u64 };
        assert_eq!(r.co_index, want_co, "{name}: wrapper {i} reserved1");
        assert_eq!(r.metadata.kernel_name, kernel_name);
        assert_eq!(r.metadata.search_paths.len(), 1);
        for t in &f.targets {
            let archive_path = o
                .out
                .parent()
                .unwrap()
                .join(r.metadata.search_paths[0].replace("@GFXARCH@", t));
            let a =
                kpack_loader::open_archive(&archive_path).expect("archive named by the metadata");
            let got = a
                .kernel(&format!("{kernel_name}#{}", r.co_index), t)
                .unwrap();
            assert!(
                got == truth[&(r.co_index as usize, t.clone())],
                "{name}: wrapper {i} {t} differs from the bundler's"
            );
        }
    }
    // Every wrapper in the file, registered or not, points at the metadata
    // and names a code object present in every target's archive.
    let ls: Value = serde_json::from_str(&kpack_ok(&[&"ls", &o.out, &"--json"])).unwrap();
    assert_eq!(ls["kind"], "offloaded");
    let ws = ls["wrappers"].as_array().unwrap();
    assert_eq!(ws.len(), f.wrappers);
    for (i, w) in ws.iter().enumerate() {
        assert_eq!(w["magic"], "HIPK");
        assert_eq!(
            w["binary"], ls["metadata_address"],
            "{name}: wrapper {i} pointer"
        );
        let co = w["reserved1"].as_u64().unwrap();
        assert_eq!(
            co,
            if f.bundles == 1 { 0 } else { i as u64 },
            "{name}: wrapper {i} reserved1"
        );
        for t in &f.targets {
            let a = kpack_loader::open_archive(o.archives.join(format!(
                "{}_{t}.kpack",
                kernel_name.split('.').next().unwrap()
            )))
            .unwrap();
            assert!(
                a.kernel(&format!("{kernel_name}#{co}"), t).unwrap()
                    == truth[&(co as usize, t.clone())]
            );
        }
    }
    // `kpack extract` on the offloaded binary resolves the same way.
    let ex = tempfile::tempdir().unwrap();
    kpack_ok(&[&"extract", &o.out, &"-o", &ex.path()]);
    assert_eq!(
        dir_files(ex.path()).len(),
        truth.len(),
        "{name}: extracted through the archives"
    );
    // Every code object is in an archive.
    let mut n = 0;
    for e in std::fs::read_dir(&o.archives).unwrap() {
        n += kpack_loader::open_archive(e.unwrap().path())
            .unwrap()
            .kernel_count();
    }
    assert_eq!(n, truth.len(), "{name}: archived code objects");

    // The packagers' tools still work, and what they write still loads.
    let scratch = tempfile::tempdir().unwrap();
    if let Some(dwzed) = dwz_accepts(&f.path, &o.out, scratch.path()) {
        let copy = o.out.with_file_name(format!("dwz-{kernel_name}"));
        std::fs::copy(&dwzed, &copy).unwrap();
        kpack_ok(&[&"verify-elf", &copy]);
        assert_eq!(
            registered(&f, &copy).len(),
            registrations,
            "{name} after dwz"
        );
    }
    let tools: [(&str, &[&str]); 4] = [
        ("strip", &["strip"]),
        ("eu-strip", &["eu-strip"]),
        ("debuglink", &["objcopy", "--only-keep-debug"]),
        ("patchelf", &["patchelf", "--set-rpath", "/opt/rocm/lib"]),
    ];
    for (label, cmd) in tools {
        let copy = o
            .out
            .parent()
            .unwrap()
            .join(format!("{label}-{kernel_name}"));
        std::fs::copy(&o.out, &copy).unwrap();
        if label == "debuglink" {
            // objcopy warns (and still exits 0) when it cannot lay a segment
            // out ("section ... can't be allocated in segment"): quiet too.
            let dbg = scratch.path().join("x.debug");
            let quiet = |c: &mut Command| {
                let out = c.output().unwrap();
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(
                    out.status.success() && err.trim().is_empty(),
                    "{c:?} on {name}: {err}"
                );
            };
            quiet(Command::new(cmd[0]).args(&cmd[1..]).arg(&copy).arg(&dbg));
            quiet(
                Command::new("objcopy")
                    .arg("--strip-debug")
                    .arg(format!("--add-gnu-debuglink={}", dbg.display()))
                    .arg(&copy),
            );
            // The debug file: no device code to offload, copied unchanged.
            let dbg_out = scratch.path().join("dbg.out");
            let s = kpack_ok(&[
                &"offload",
                &dbg,
                &"-o",
                &dbg_out,
                &"--archive-dir",
                &scratch.path().join("k"),
                &"--json",
            ]);
            assert!(s.contains("\"debug_only\""), "{name}: {s}");
            assert_eq!(
                std::fs::read(&dbg).unwrap(),
                std::fs::read(&dbg_out).unwrap()
            );
        } else {
            let out = Command::new(cmd[0])
                .args(&cmd[1..])
                .arg(&copy)
                .output()
                .unwrap();
            assert!(out.status.success(), "{label} failed on {name}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.trim().is_empty(),
                "{label} complains about {name}: {err}"
            );
        }
        kpack_ok(&[&"verify-elf", &copy]);
        let regs2 = registered(&f, &copy);
        assert_eq!(regs2.len(), registrations, "{name} after {label}");
        assert!(regs2
            .iter()
            .all(|r| r.magic == HIPK_MAGIC && r.metadata.kernel_name == kernel_name));
    }
}

macro_rules! offload_tests {
    ($($test:ident => $fixture:expr),* $(,)?) => {$(
        #[test]
        fn $test() { check_fixture($fixture); }
    )*};
}

offload_tests! {
    libvadd => "libvadd.so",
    vadd_pie => "vadd_pie",
    vadd_nopie => "vadd_nopie",
    libvadd_compressed => "libvadd_compressed.so",
    librdc => "librdc.so",
    libvadd_newdriver => "libvadd_newdriver.so",
    libmulti => "libmulti.so",
    libwide => "libwide.so",
    libvadd_relr => "libvadd_relr.so",
    libvadd_dwarf4 => "libvadd_dwarf4.so",
    libvadd_after_bss_bfd => "libvadd_after_bss_bfd.so",
    libvadd_after_bss_lld => "libvadd_after_bss_lld.so",
    libvadd_fatbin_after_bss_bfd => "libvadd_fatbin_after_bss_bfd.so",
    libvadd_fatbin_after_bss_lld => "libvadd_fatbin_after_bss_lld.so",
    libvadd_before_data_bfd => "libvadd_before_data_bfd.so",
    libvadd_before_data_lld => "libvadd_before_data_lld.so",
    libvadd_two_loads_bfd => "libvadd_two_loads_bfd.so",
}

/// clang's new offload driver with `-fgpu-rdc`: clang-linker-wrapper's
/// bundle (16-aligned, not on a page) and its one wrapper. The local
/// symbol `.fatbin_image`, which has the bundle's size, names the metadata
/// afterwards, with the metadata's size.
#[test]
fn librdc_newdriver() {
    check_fixture("librdc_newdriver.so");
}

#[test]
fn librocrand_shrinks_loads_and_keeps_its_code_objects() {
    let input = Path::new(LIBROCRAND);
    let o = offload(input);
    assert_tools_accept(input, &o.out);
    let before = std::fs::metadata(input).unwrap().len();
    let after = std::fs::metadata(&o.out).unwrap().len();
    assert!(
        after * 100 <= before * 55,
        "librocrand: {after} of {before} bytes"
    );
    // Host code: rocrand_get_version() is unchanged.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("v.c");
    std::fs::write(
        &src,
        "#include <dlfcn.h>\n#include <stdio.h>\nint main(int c, char** v) { void* h = dlopen(v[1], RTLD_NOW); if (!h) return 2;\n\
         int (*f)(int*) = (int (*)(int*))dlsym(h, \"rocrand_get_version\"); int x = -1; if (!f || f(&x)) return 3; printf(\"%d\", x); return 0; }\n",
    )
    .unwrap();
    let exe = dir.path().join("v");
    built(Program::c("c11").input(&src).input("-ldl").link(&exe));
    let v0 = run_ok(Command::new(&exe).arg(input));
    let v1 = run_ok(Command::new(&exe).arg(&o.out));
    assert_eq!(v0, v1);
    assert!(!v0.is_empty());
    let copy = dir.path().join("stripped.so");
    std::fs::copy(&o.out, &copy).unwrap();
    run_ok(Command::new("strip").arg(&copy));
    assert_eq!(run_ok(Command::new(&exe).arg(&copy)), v0);
    // Every code object, through the archives.
    let truth = code_objects(input);
    let mut n = 0;
    for ((bundle, target), bytes) in &truth {
        let a = kpack_loader::open_archive(o.archives.join(format!("librocrand_{target}.kpack")))
            .unwrap();
        assert!(
            a.kernel(&format!("librocrand.so.1.1#{bundle}"), target)
                .unwrap()
                == *bytes
        );
        n += 1;
    }
    assert_eq!(n, 7);
}

/// A fat binary whose .hip_fatbin ends exactly on a page boundary, made by
/// linking zero padding after the device code.
#[test]
fn fatbin_ending_on_a_page_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let hip = workspace().join("integration/hip");
    // Compile once, then link the object alone and with zero padding after
    // it (an object of its own, after the HIP one on the link line).
    let obj = dir.path().join("vadd.o");
    run_ok(
        Command::new("clang++-19")
            .args([
                "-x",
                "hip",
                "-nogpulib",
                "-nogpuinc",
                "--offload-arch=gfx1100",
                "-fPIC",
                "-O2",
                "-c",
            ])
            .arg("-I")
            .arg(&hip)
            .arg(hip.join("vadd.hip"))
            .arg("-o")
            .arg(&obj),
    );
    let build = |out: &Path, pad: Option<u64>| {
        let mut c = Command::new("clang++-19");
        c.args(["-shared", "-fuse-ld=lld"]).arg(&obj);
        if let Some(n) = pad {
            let s = dir.path().join("pad.s");
            std::fs::write(
                &s,
                format!(".section .hip_fatbin,\"a\",@progbits\n.zero {n}\n"),
            )
            .unwrap();
            let o = dir.path().join("pad.o");
            run_ok(Command::new("clang-19").arg("-c").arg(&s).arg("-o").arg(&o));
            c.arg(&o);
        }
        run_ok(c.arg("-lamdhip64").arg("-o").arg(out));
    };
    let first = dir.path().join("libfirst.so");
    build(&first, None);
    let size = |p: &Path| {
        let text = run_ok(Command::new("readelf").args(["-SW"]).arg(p));
        let line = text
            .lines()
            .find(|l| l.contains(".hip_fatbin"))
            .unwrap()
            .to_string();
        let f: Vec<&str> = line.split_whitespace().collect();
        let i = f.iter().position(|x| *x == "PROGBITS").unwrap();
        (
            u64::from_str_radix(f[i + 1], 16).unwrap(),
            u64::from_str_radix(f[i + 3], 16).unwrap(),
        )
    };
    let (_, s) = size(&first);
    let lib = dir.path().join("libpage.so");
    build(&lib, Some(4096 - s % 4096));
    let (addr, s2) = size(&lib);
    assert_eq!(
        (addr + s2) % 4096,
        0,
        "padding did not end the section on a page"
    );
    let o = offload(&lib);
    assert_tools_accept(&lib, &o.out);
    let a = kpack_loader::open_archive(o.archives.join("libpage_gfx1100.kpack")).unwrap();
    let truth = code_objects(&lib);
    assert!(a.kernel("libpage.so#0", "gfx1100").unwrap() == truth[&(0, "gfx1100".to_string())]);
}

#[test]
fn small_fatbin_is_rewritten_in_place() {
    // libvadd_compressed's .hip_fatbin is smaller than a page: nothing to
    // cut, so the metadata goes over it and the rest is zeroed.
    let f = fixture("libvadd_compressed.so");
    let o = offload(&f.path);
    let bytes = std::fs::read(&o.out).unwrap();
    let fatbin = std::fs::read(&f.path).unwrap();
    let bundle_start = fatbin.windows(4).position(|w| w == b"CCOB").unwrap();
    // No byte of the compressed bundle's payload is left.
    let payload = &fatbin[bundle_start + 24..bundle_start + 88];
    assert!(bytes.windows(payload.len()).all(|w| w != payload));
    assert!(!bytes.windows(4).any(|w| w == b"CCOB"));
}

#[test]
fn already_offloaded_is_a_noop_and_link_inputs_are_copied() {
    let f = fixture("libvadd.so");
    let o = offload(&f.path);
    let again = o.out.with_file_name("again.so");
    let out = kpack(&[
        &"offload",
        &o.out,
        &"-o",
        &again,
        &"--archive-dir",
        &o.archives,
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already offloaded"));
    assert_eq!(
        std::fs::read(&again).unwrap(),
        std::fs::read(&o.out).unwrap()
    );

    let obj = std::fs::read_dir(fixtures_dir().join("obj"))
        .unwrap()
        .flat_map(|e| walk(e.unwrap().path()))
        .find(|p| p.extension().is_some_and(|x| x == "o"))
        .expect("an object file among the fixtures' objects");
    let dir = tempfile::tempdir().unwrap();
    let out_o = dir.path().join("copy.o");
    let err = kpack(&[
        &"offload",
        &obj,
        &"-o",
        &out_o,
        &"--archive-dir",
        &dir.path(),
    ]);
    assert!(err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("link input"));
    assert_eq!(std::fs::read(&out_o).unwrap(), std::fs::read(&obj).unwrap());
    let ar = dir.path().join("libx.a");
    run_ok(Command::new("ar").arg("rcs").arg(&ar).arg(&obj));
    let out_a = dir.path().join("copy.a");
    assert!(kpack(&[
        &"offload",
        &ar,
        &"-o",
        &out_a,
        &"--archive-dir",
        &dir.path()
    ])
    .status
    .success());
    assert_eq!(std::fs::read(&out_a).unwrap(), std::fs::read(&ar).unwrap());
}

fn walk(p: PathBuf) -> Vec<PathBuf> {
    if p.is_dir() {
        std::fs::read_dir(&p)
            .unwrap()
            .flat_map(|e| walk(e.unwrap().path()))
            .collect()
    } else {
        vec![p]
    }
}

#[test]
fn in_place_keeps_mode_and_does_not_write_through_hard_links() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture("libvadd.so");
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libvadd.so");
    std::fs::copy(&f.path, &lib).unwrap();
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o750)).unwrap();
    let link = dir.path().join("hardlink.so");
    std::fs::hard_link(&lib, &link).unwrap();
    kpack_ok(&[
        &"offload",
        &lib,
        &"-o",
        &lib,
        &"--archive-dir",
        &dir.path().join(".kpack"),
    ]);
    assert_eq!(
        std::fs::metadata(&lib).unwrap().permissions().mode() & 0o777,
        0o750
    );
    assert_eq!(
        std::fs::read(&link).unwrap(),
        std::fs::read(&f.path).unwrap(),
        "hard link written through"
    );
    kpack_ok(&[&"verify-elf", &lib]);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with(".kpack-tmp")),
        "temporary left: {names:?}"
    );
}

/// Damaged inputs are refused with a clear error and no output.
fn refuses(bytes: &[u8], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("libbad.so");
    std::fs::write(&input, bytes).unwrap();
    let out = dir.path().join("out.so");
    let archives = dir.path().join("arch");
    let err = kpack_fails(&[&"offload", &input, &"-o", &out, &"--archive-dir", &archives]);
    assert!(err.contains("libbad.so") && err.contains(needle), "{err}");
    assert!(!out.exists());
    assert!(!archives.exists() || std::fs::read_dir(&archives).unwrap().next().is_none());
}

fn wrapper_offset(bytes: &[u8]) -> usize {
    let elf = kpack_host::elf::ElfView::parse(bytes).unwrap();
    elf.section(".hipFatBinSegment").unwrap().unwrap().offset as usize
}

#[test]
fn refuses_unknown_magic() {
    let mut b = std::fs::read(fixture("libvadd.so").path).unwrap();
    let w = wrapper_offset(&b);
    b[w..w + 4].copy_from_slice(b"XXXX");
    refuses(&b, "unknown magic");
}

#[test]
fn refuses_pointer_not_at_a_bundle() {
    // ET_EXEC: the pointer is the value in the file.
    let mut b = std::fs::read(fixture("vadd_nopie").path).unwrap();
    let w = wrapper_offset(&b);
    let p = u64::from_le_bytes(b[w + 8..w + 16].try_into().unwrap());
    b[w + 8..w + 16].copy_from_slice(&(p + 16).to_le_bytes());
    refuses(&b, "does not point at the start of a bundle");
}

#[test]
fn refuses_relocation_into_removed_bytes() {
    // Another RELATIVE relocation made to point into .hip_fatbin.
    let mut b = std::fs::read(fixture("libvadd.so").path).unwrap();
    let h = kpack_host::elf::ElfView::parse(&b).unwrap();
    let relas = h.relas().unwrap();
    let fat = h.section(".hip_fatbin").unwrap().unwrap().addr;
    let w = h.section(".hipFatBinSegment").unwrap().unwrap().addr;
    let r = relas
        .iter()
        .find(|r| r.r_type == 8 && r.r_offset != w + 8)
        .expect("another RELATIVE relocation");
    let at = r.entry_offset as usize + 16;
    b[at..at + 8].copy_from_slice(&(fat + 64).to_le_bytes());
    refuses(&b, "points inside .hip_fatbin");
}

// A binary without device code is copied with a note, not refused:
// tests/tests/no_device_code.rs.

/// The runtime end to end: a C program linking the installed static
/// runtime library (the CMake consumer's checker) stands in for the HIP runtime, dlopens
/// each offloaded library, takes each registered wrapper's pointer,
/// discovers the binary's path from it and loads every target's code object
/// through `kpack_load_code_object`: the bytes equal the bundler's.
#[test]
fn c_runtime_loads_offloaded_fixtures() {
    let dir = tempfile::tempdir().unwrap();
    let checker = runtime_checker();
    for f in fixtures()
        .into_iter()
        .filter(|f| f.device_code() && f.name.ends_with(".so"))
    {
        let o = offload(&f.path);
        let expected = dir.path().join(format!("expected-{}", f.name));
        std::fs::create_dir(&expected).unwrap();
        for ((bundle, t), bytes) in code_objects(&f.path) {
            let name = if f.bundles > 1 {
                format!("{t}#{bundle}.co")
            } else {
                format!("{t}.co")
            };
            std::fs::write(expected.join(name), bytes).unwrap();
        }
        // A bundle built without a target (libmixed.so): no code for it,
        // as with the fat binary.
        let mut absent = 0;
        for (bundle, t) in (0..f.bundles).flat_map(|b| f.targets.iter().map(move |t| (b, t))) {
            if !f.targets_of(bundle).contains(t) {
                std::fs::write(expected.join(format!("{t}#{bundle}.none")), b"").unwrap();
                absent += 1;
            }
        }
        let out = run_ok(
            Command::new(&checker)
                .arg(&o.out)
                .arg(&expected)
                .args(&f.targets),
        );
        // Every wrapper, registered or not (librdc.so registers one of its
        // three).
        let want = format!(
            "{} code objects loaded and identical, 0 failures",
            f.wrappers * f.targets.len() - absent
        );
        assert!(out.contains(&want), "{}: {out}", f.name);
        let absent_line = format!("{absent} code objects absent, as in the fat binary");
        assert_eq!(out.contains(&absent_line), absent > 0, "{}: {out}", f.name);
    }
}
