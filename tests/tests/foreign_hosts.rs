//! Host binaries for AArch64 and ppc64le (little-endian), linked by Debian's
//! GNU cross toolchains (64 KiB segment alignment), offloaded here and run
//! under qemu-user: the rewritten binary loads, its host code works, the
//! stand-in HIP runtime (`integration/hip/hipstub.c`) sees HIPK wrappers
//! whose pointers reach the metadata, and metadata plus archives give
//! exactly the code objects clang-offload-bundler extracts from the input.
//! The packagers' tools (the host's strip and objcopy, eu-strip, patchelf)
//! keep it valid.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use kpack_format::hipk::HIPK_MAGIC;
use kpack_testkit::manifest::Host;
use serde_json::Value;

const UNIT: u64 = 64 * 1024;

/// Run the fixture's host code (libraries through the host's loader) with
/// the stand-in runtime logging to `log`; returns stdout.
fn run_host_logged(f: &Fixture, binary: &Path, log: &Path) -> String {
    run_host(f, binary, &[("KPACK_SHIM_LOG", log)])
}

/// Everything one foreign fixture must survive.
fn check(name: &str) {
    let f = foreign_fixture(name);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lib").join(f.file_name());
    let archives = dir.path().join(".kpack");
    let json = kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &out,
        &"--archive-dir",
        &archives,
        &"--json",
    ]);
    let summary: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(summary["outcome"], "offloaded", "{name}");
    assert_tools_accept(&f.path, &out);
    assert_removed_whole_units(&f.path, &out);

    let truth = code_objects(&f.path);
    check_runs_and_resolves(&f, &out, &truth);
    let mut copies = packaged_copies(&f, &out, dir.path());
    if let Some(dwzed) = dwz_accepts(&f.path, &out, dir.path()) {
        copies.push(("dwz", dwzed));
    }
    for (label, copy) in copies {
        kpack_ok(&[&"verify-elf", &copy]);
        let log = dir.path().join(format!("{label}.log"));
        run_host_logged(&f, &copy, &log);
        let regs = read_registrations(&log);
        assert_eq!(regs.len(), f.wrappers, "{name} after {label}");
        assert!(
            regs.iter().all(|r| r.magic == HIPK_MAGIC),
            "{name} after {label}"
        );
    }
    // The archives hold every code object.
    let n: usize = std::fs::read_dir(&archives)
        .unwrap()
        .map(|e| {
            kpack_loader::open_archive(e.unwrap().path())
                .unwrap()
                .kernel_count()
        })
        .sum();
    assert_eq!(n, truth.len(), "{name}: archived code objects");
}

/// The file shrank by whole 64 KiB units: every one `.hip_fatbin` spans
/// beyond the unit its metadata needs (GNU ld aligns segments to 64 KiB but
/// `.hip_fatbin` only to 4 KiB, so it does not start on a unit).
fn assert_removed_whole_units(input: &Path, output: &Path) {
    let b = std::fs::read(input).unwrap();
    let elf = kpack_host::elf::ElfView::parse(&b).unwrap();
    let fat = elf.section(".hip_fatbin").unwrap().unwrap();
    assert_ne!(fat.addr % UNIT, 0, "the fixture must not start on a unit");
    let first_unit = fat.addr.next_multiple_of(UNIT);
    let last_unit = (fat.addr + fat.size) / UNIT * UNIT;
    let removable = last_unit.saturating_sub(first_unit);
    let (before, after) = (b.len() as u64, std::fs::metadata(output).unwrap().len());
    if removable == 0 {
        // Nothing to cut: only the new headers at the end are added.
        assert!(after < before + 4096, "{}", output.display());
    } else {
        assert_eq!(removable % UNIT, 0);
        assert!(
            before - after >= removable - 4096 && before - after <= removable,
            "{}: {before} -> {after} bytes, {removable} removable",
            output.display()
        );
    }
}

/// The offloaded binary runs under qemu; the stand-in runtime sees one HIPK
/// wrapper per bundle whose pointer reaches the metadata, and the metadata
/// and archives give the bundler's bytes for every target.
fn check_runs_and_resolves(
    f: &Fixture,
    out: &Path,
    truth: &std::collections::BTreeMap<(usize, String), Vec<u8>>,
) {
    let log = out.with_extension("log");
    let stdout = run_host_logged(f, out, &log);
    if let Some(check) = &f.host_check {
        assert_eq!(stdout.trim(), check.value.to_string(), "{}", f.name);
    }
    let regs = read_registrations(&log);
    assert_eq!(regs.len(), f.wrappers, "{}: wrappers registered", f.name);
    let kernel_name = out.file_name().unwrap().to_string_lossy().into_owned();
    for (i, r) in regs.iter().enumerate() {
        assert_eq!(
            (r.magic, r.version),
            (HIPK_MAGIC, 1),
            "{}: wrapper {i}",
            f.name
        );
        assert_eq!(r.co_index, i as u64, "{}: wrapper {i} co_index", f.name);
        assert_eq!(r.metadata.kernel_name, kernel_name);
        for t in &f.targets {
            let rel = r.metadata.search_paths[0].replace("@GFXARCH@", t);
            let a = kpack_loader::open_archive(out.parent().unwrap().join(rel)).unwrap();
            let got = a.kernel(&format!("{kernel_name}#{i}"), t).unwrap();
            assert!(
                got == truth[&(i, t.clone())],
                "{}: wrapper {i} {t} differs from the bundler's",
                f.name
            );
        }
    }
}

/// Copies of the offloaded binary after the packagers' tools: the host's
/// strip, eu-strip, the host's objcopy --only-keep-debug with
/// --add-gnu-debuglink, patchelf --set-rpath.
fn packaged_copies(f: &Fixture, out: &Path, scratch: &Path) -> Vec<(&'static str, PathBuf)> {
    let host = f.host;
    let copy = |label: &str| {
        let p = out.with_file_name(format!("{label}-{}", f.file_name()));
        std::fs::copy(out, &p).unwrap();
        p
    };
    let quiet = |c: &mut Command, label: &str| {
        let o = c.output().unwrap();
        assert!(o.status.success(), "{label} failed on {}", f.name);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.trim().is_empty(),
            "{label} complains about {}: {err}",
            f.name
        );
    };
    let stripped = copy("strip");
    quiet(Command::new(host.tool("strip")).arg(&stripped), "strip");
    let eu = copy("eu-strip");
    quiet(Command::new("eu-strip").arg(&eu), "eu-strip");
    let linked = copy("debuglink");
    let dbg = scratch.join(format!("{}.debug", f.file_name()));
    let objcopy = host.tool("objcopy");
    quiet(
        Command::new(&objcopy)
            .arg("--only-keep-debug")
            .arg(&linked)
            .arg(&dbg),
        "objcopy --only-keep-debug",
    );
    quiet(
        Command::new(&objcopy)
            .arg("--strip-debug")
            .arg(format!("--add-gnu-debuglink={}", dbg.display()))
            .arg(&linked),
        "objcopy --add-gnu-debuglink",
    );
    // The debug file itself: NOBITS .hip_fatbin, nothing to offload.
    let dbg_out = scratch.join("dbg.out");
    let s = kpack_ok(&[
        &"offload",
        &dbg,
        &"-o",
        &dbg_out,
        &"--archive-dir",
        &scratch.join("dbgk"),
        &"--json",
    ]);
    assert!(s.contains("\"debug_only\""), "{}: {s}", f.name);
    assert_eq!(
        std::fs::read(&dbg).unwrap(),
        std::fs::read(&dbg_out).unwrap()
    );
    let patched = copy("patchelf");
    quiet(
        Command::new("patchelf")
            .args(["--set-rpath", "/opt/rocm/lib"])
            .arg(&patched),
        "patchelf",
    );
    vec![
        ("strip", stripped),
        ("eu-strip", eu),
        ("debuglink", linked),
        ("patchelf", patched),
    ]
}

macro_rules! foreign_tests {
    ($($test:ident => $fixture:expr),* $(,)?) => {$(
        #[test]
        fn $test() { check($fixture); }
    )*};
}

foreign_tests! {
    aarch64_libvadd => "aarch64/libvadd.so",
    aarch64_libbig => "aarch64/libbig.so",
    aarch64_vadd_pie => "aarch64/vadd_pie",
    ppc64le_libvadd => "ppc64le/libvadd.so",
    ppc64le_libbig => "ppc64le/libbig.so",
    ppc64le_vadd_pie => "ppc64le/vadd_pie",
}

/// Every foreign fixture is covered above.
#[test]
fn every_foreign_fixture_is_tested() {
    let tested = [
        "aarch64/libvadd.so",
        "aarch64/libbig.so",
        "aarch64/vadd_pie",
        "ppc64le/libvadd.so",
        "ppc64le/libbig.so",
        "ppc64le/vadd_pie",
    ];
    // Windows fixtures: tests/windows.rs.
    let all: Vec<String> = manifest()
        .foreign
        .into_iter()
        .filter(|e| e.host != Host::X86_64Windows)
        .map(|e| e.name)
        .collect();
    assert_eq!(all, tested);
    for host in [Host::Aarch64Linux, Host::Ppc64leLinux] {
        assert!(manifest().foreign.iter().any(|e| e.host == host));
    }
}

/// A host binary for a machine kpack does not rewrite is refused by name,
/// and nothing is written.
#[test]
fn unknown_machine_is_refused_by_name() {
    let f = foreign_fixture("aarch64/libvadd.so");
    let mut b = std::fs::read(&f.path).unwrap();
    b[18..20].copy_from_slice(&243u16.to_le_bytes()); // EM_RISCV
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("libriscv.so");
    std::fs::write(&input, &b).unwrap();
    let out = dir.path().join("out");
    let err = kpack_fails(&[
        &"offload",
        &input,
        &"-o",
        &out.join("libriscv.so"),
        &"--archive-dir",
        &out.join(".kpack"),
    ]);
    assert!(err.contains("EM_RISCV (RISC-V, 243)"), "{err}");
    assert!(!out.exists());
}
