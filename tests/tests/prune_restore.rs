//! `kpack prune` and `kpack restore` on real binaries: the output is a fat
//! binary whose bundles give, through clang-offload-bundler, exactly the
//! code objects asked for; every ELF tool accepts it; it loads and runs its
//! host code, and the stand-in HIP runtime is handed HIPF wrappers whose
//! pointers reach valid bundles.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use kpack_bundle::{BUNDLE_MAGIC, CCOB_MAGIC};
use kpack_format::hipk::HIPF_MAGIC;
use serde_json::Value;

type CodeObjects = BTreeMap<(usize, String), Vec<u8>>;

/// The loaded binary: host code runs, every wrapper is HIPF version 1 and
/// points at the start of a bundle.
fn runs_with_hipf_wrappers(f: &Fixture, binary: &Path) {
    let regs = registered_raw(f, binary);
    let want = if f.name == "librdc.so" { 1 } else { f.wrappers };
    assert_eq!(regs.len(), want, "{}: wrappers registered", f.name);
    for (i, r) in regs.iter().enumerate() {
        assert_eq!(r.magic, HIPF_MAGIC, "{}: wrapper {i} magic", f.name);
        assert_eq!(r.version, 1);
        assert!(
            r.bytes.starts_with(BUNDLE_MAGIC) || r.bytes.starts_with(CCOB_MAGIC),
            "{}: wrapper {i} does not point at a bundle",
            f.name
        );
    }
}

/// strip and patchelf still work on it, and the result still verifies.
fn packagers_tools_work(binary: &Path) {
    let dir = tempfile::tempdir().unwrap();
    for (label, cmd) in [
        ("strip", &["strip"][..]),
        (
            "patchelf",
            &["patchelf", "--set-rpath", "/opt/rocm/lib"][..],
        ),
    ] {
        let copy = dir.path().join(label);
        std::fs::copy(binary, &copy).unwrap();
        let out = Command::new(cmd[0])
            .args(&cmd[1..])
            .arg(&copy)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.trim().is_empty(),
            "{label}: {err}"
        );
        kpack_ok(&[&"verify-elf", &copy]);
    }
}

fn only(truth: &CodeObjects, keep: &dyn Fn(&str) -> bool) -> CodeObjects {
    truth
        .iter()
        .filter(|((_, t), _)| keep(t))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn prune(input: &Path, out: &Path, targets: &[&str]) -> Value {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"prune", &input, &"-o", &out];
    args.push(&"--json");
    args.push(&"--targets");
    for t in targets {
        args.push(t);
    }
    serde_json::from_str(&kpack_ok(&args)).unwrap()
}

fn check_prune(name: &str) {
    let f = fixture(name);
    let truth = code_objects(&f.path);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(f.file_name());
    // Keep the first target; `gfx90a` keeps both xnack variants.
    let keep = if f.targets.iter().any(|t| t.starts_with("gfx90a")) {
        "gfx90a"
    } else {
        f.targets[0].as_str()
    };
    let s = prune(&f.path, &out, &[keep]);
    let kept = only(&truth, &|t| t == keep || t.starts_with(&format!("{keep}:")));
    assert!(!kept.is_empty());
    assert_eq!(
        s["kept_targets"].as_array().unwrap().len(),
        kept.keys()
            .map(|(_, t)| t)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );
    assert!(
        code_objects(&out) == kept,
        "{name}: bundler finds other code objects"
    );
    // Every other target's bytes are gone from the file.
    let bytes = std::fs::read(&out).unwrap();
    for ((_, t), co) in &truth {
        if !kept.keys().any(|(_, k)| k == t) && f.compressed_bundles == 0 {
            assert!(
                !bytes
                    .windows(co.len().min(512))
                    .any(|w| w == &co[..co.len().min(512)]),
                "{name}: bytes of {t} left"
            );
        }
    }
    assert_tools_accept(&f.path, &out);
    packagers_tools_work(&out);
    runs_with_hipf_wrappers(&f, &out);
    // Smaller, unless nothing was removed.
    assert!(bytes.len() as u64 <= std::fs::metadata(&f.path).unwrap().len());
}

macro_rules! prune_tests {
    ($($test:ident => $fixture:expr),* $(,)?) => {$(
        #[test]
        fn $test() { check_prune($fixture); }
    )*};
}

prune_tests! {
    prune_libvadd => "libvadd.so",
    prune_vadd_pie => "vadd_pie",
    prune_vadd_nopie => "vadd_nopie",
    prune_libvadd_compressed => "libvadd_compressed.so",
    prune_librdc => "librdc.so",
    prune_libmulti => "libmulti.so",
    prune_libwide => "libwide.so",
    prune_libvadd_relr => "libvadd_relr.so",
    prune_libvadd_dwarf4 => "libvadd_dwarf4.so",
    prune_libvadd_after_bss_bfd => "libvadd_after_bss_bfd.so",
    prune_libvadd_after_bss_lld => "libvadd_after_bss_lld.so",
    prune_libvadd_fatbin_after_bss_bfd => "libvadd_fatbin_after_bss_bfd.so",
    prune_libvadd_fatbin_after_bss_lld => "libvadd_fatbin_after_bss_lld.so",
    prune_libvadd_before_data_bfd => "libvadd_before_data_bfd.so",
    prune_libvadd_before_data_lld => "libvadd_before_data_lld.so",
    prune_libvadd_two_loads_bfd => "libvadd_two_loads_bfd.so",
}

/// Offload into `dir/lib`, archives in `dir/.kpack`.
fn offloaded(input: &Path, dir: &Path) -> PathBuf {
    let out = dir.join("lib").join(input.file_name().unwrap());
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    kpack_ok(&[
        &"offload",
        &input,
        &"-o",
        &out,
        &"--archive-dir",
        &dir.join(".kpack"),
    ]);
    out
}

fn check_restore(name: &str) {
    let f = fixture(name);
    let dir = tempfile::tempdir().unwrap();
    let host = offloaded(&f.path, dir.path());
    let out = dir.path().join("restored").join(f.file_name());
    let s: Value =
        serde_json::from_str(&kpack_ok(&[&"restore", &host, &"-o", &out, &"--json"])).unwrap();
    assert_eq!(s["bundles"].as_array().unwrap().len(), f.bundles);
    // Exactly the original code objects, bundle by bundle.
    assert!(
        code_objects(&out) == code_objects(&f.path),
        "{name}: restored code objects differ"
    );
    assert_tools_accept(&f.path, &out);
    packagers_tools_work(&out);
    runs_with_hipf_wrappers(&f, &out);
    // And it offloads again like the original.
    let again = tempfile::tempdir().unwrap();
    let host2 = offloaded(&out, again.path());
    kpack_ok(&[&"verify-elf", &host2]);
}

macro_rules! restore_tests {
    ($($test:ident => $fixture:expr),* $(,)?) => {$(
        #[test]
        fn $test() { check_restore($fixture); }
    )*};
}

restore_tests! {
    restore_libvadd => "libvadd.so",
    restore_vadd_pie => "vadd_pie",
    restore_vadd_nopie => "vadd_nopie",
    restore_libvadd_compressed => "libvadd_compressed.so",
    restore_librdc => "librdc.so",
    restore_libmulti => "libmulti.so",
    restore_libwide => "libwide.so",
    restore_libvadd_relr => "libvadd_relr.so",
    restore_libvadd_dwarf4 => "libvadd_dwarf4.so",
    restore_libvadd_after_bss_bfd => "libvadd_after_bss_bfd.so",
    restore_libvadd_after_bss_lld => "libvadd_after_bss_lld.so",
    restore_libvadd_fatbin_after_bss_bfd => "libvadd_fatbin_after_bss_bfd.so",
    restore_libvadd_fatbin_after_bss_lld => "libvadd_fatbin_after_bss_lld.so",
    restore_libvadd_before_data_bfd => "libvadd_before_data_bfd.so",
    restore_libvadd_before_data_lld => "libvadd_before_data_lld.so",
    restore_libvadd_two_loads_bfd => "libvadd_two_loads_bfd.so",
}

/// Restore of chosen targets, archives found through ROCM_KPACK_PATH, and
/// the clear errors (nothing written).
#[test]
fn restore_targets_environment_and_errors() {
    let f = fixture("libwide.so");
    let dir = tempfile::tempdir().unwrap();
    let host = offloaded(&f.path, dir.path());
    let out = dir.path().join("r.so");
    kpack_ok(&[
        &"restore",
        &host,
        &"-o",
        &out,
        &"--targets",
        &"gfx90a",
        &"gfx1100",
    ]);
    let want = only(&code_objects(&f.path), &|t| {
        t == "gfx1100" || t.starts_with("gfx90a")
    });
    assert!(code_objects(&out) == want);

    // The archives moved away: only ROCM_KPACK_PATH finds them.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::rename(dir.path().join(".kpack"), &elsewhere).unwrap();
    let missing = dir.path().join("missing.so");
    let err = kpack_fails(&[&"restore", &host, &"-o", &missing]);
    assert!(err.contains("no archive found"), "{err}");
    assert!(!missing.exists());
    let list: Vec<PathBuf> = std::fs::read_dir(&elsewhere)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("gfx1030"))
        .collect();
    let out = Command::new(kpack_bin())
        .args([
            "restore".as_ref(),
            host.as_os_str(),
            "-o".as_ref(),
            missing.as_os_str(),
        ])
        .env("ROCM_KPACK_PATH", std::env::join_paths(&list).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(code_objects(&missing) == only(&code_objects(&f.path), &|t| t == "gfx1030"));

    // Uncompressed bundles no longer fit (offload moved the dynamic symbol
    // tables into the section's first page): a clear error.
    std::fs::rename(&elsewhere, dir.path().join(".kpack")).unwrap();
    let never = dir.path().join("never.so");
    let err = kpack_fails(&[&"restore", &host, &"-o", &never, &"--compression", &"none"]);
    assert!(
        err.contains("the bundles need") && err.contains("holds"),
        "{err}"
    );
    assert!(!never.exists());
    let err = kpack_fails(&[&"restore", &host, &"-o", &never, &"--targets", &"gfx1151"]);
    assert!(err.contains("no code objects for gfx1151"), "{err}");
    let err = kpack_fails(&[&"restore", &f.path, &"-o", &never]);
    assert!(err.contains("a fat binary already"), "{err}");
    assert!(!never.exists());
}

#[test]
fn prune_errors_write_nothing() {
    let f = fixture("libvadd.so");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.so");
    let err = kpack_fails(&[&"prune", &f.path, &"-o", &out, &"--targets", &"gfx908"]);
    assert!(
        err.contains("none of its code objects is for gfx908"),
        "{err}"
    );
    let err = kpack_fails(&[&"prune", &f.path, &"-o", &out, &"--targets", &"x/../y"]);
    assert!(err.contains("x/../y"), "{err}");
    let host = offloaded(&f.path, dir.path());
    let err = kpack_fails(&[&"prune", &host, &"-o", &out, &"--targets", &"gfx1100"]);
    assert!(err.contains("an offloaded binary"), "{err}");
    let err = kpack_fails(&[
        &"prune",
        &fixture("libhostonly.so").path,
        &"-o",
        &out,
        &"--targets",
        &"gfx1100",
    ]);
    assert!(err.contains("without device code"), "{err}");
    assert!(!out.exists());
}

/// Debian's librocrand: pruned to two targets and restored from its
/// offloaded form, each giving the bundler's code objects, and its host
/// code still answers.
#[test]
fn librocrand_prune_and_restore() {
    let input = Path::new(LIBROCRAND);
    let truth = code_objects(input);
    let dir = tempfile::tempdir().unwrap();
    let pruned = dir.path().join("pruned.so");
    prune(input, &pruned, &["gfx90a:xnack-", "gfx1030"]);
    assert!(code_objects(&pruned) == only(&truth, &|t| t == "gfx90a:xnack-" || t == "gfx1030"));
    assert_tools_accept(input, &pruned);
    let host = offloaded(input, dir.path());
    let restored = dir.path().join("restored.so");
    kpack_ok(&[&"restore", &host, &"-o", &restored]);
    assert!(code_objects(&restored) == truth);
    assert_tools_accept(input, &restored);
    for lib in [&pruned, &restored] {
        let ok = Command::new("python3")
            .arg("-c")
            .arg("import ctypes,sys; l=ctypes.CDLL(sys.argv[1]); v=ctypes.c_int(); assert l.rocrand_get_version(ctypes.byref(v))==0; print(v.value)")
            .arg(lib)
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
    }
}
