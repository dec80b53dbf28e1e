//! `kpack bundle`: offloaded binaries copied into an application folder
//! with the archives they need, re-pointed where the layout changes their
//! search paths, and loaded from there: dlopen with the C runtime finding
//! every code object (the install they came from moved away), a Windows
//! DLL under Wine beside its loader. Also `--targets`, `--layout keep`,
//! `--with-deps`, and bad requests that leave the folder as it was.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::common::*;
use kpack_format::hipk::HIPK_MAGIC;
use serde_json::Value;

fn bundle_json(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Value {
    let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"bundle"];
    a.extend_from_slice(args);
    a.push(&"--json");
    serde_json::from_str(&kpack_ok(&a)).unwrap()
}

/// The bundler's code objects of fixture `name` as the checker expects
/// them, in `dir`.
fn expected(name: &str, dir: &Path) {
    let f = fixture(name);
    fs::create_dir_all(dir).unwrap();
    for ((bundle, t), bytes) in code_objects(&f.path) {
        let file = if f.bundles > 1 {
            format!("{t}#{bundle}.co")
        } else {
            format!("{t}.co")
        };
        fs::write(dir.join(file), bytes).unwrap();
    }
}

/// The runtime (the C checker) loads every code object of every wrapper
/// of each bundled library from `app`, identical to the bundler's.
fn assert_runtime_loads(app: &Path, libs: &[&str], scratch: &Path) {
    let checker = runtime_checker();
    for name in libs {
        let f = fixture(name);
        let want = scratch.join(format!("expected-{name}"));
        expected(name, &want);
        let run = Command::new(&checker)
            .arg(app.join(name))
            .arg(&want)
            .args(&f.targets)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&run.stdout);
        let ok = format!(
            "{} code objects loaded and identical, 0 failures",
            f.wrappers * f.targets.len()
        );
        assert!(out.contains(&ok), "{name}: {out}");
    }
}

#[test]
fn a_bundle_loads_from_its_new_place() {
    let t = scratch();
    let rocm = t.path().join("rocm");
    pack_fixtures_in_lib(t.path(), &["libvadd.so", "libmulti.so"], &rocm);
    let app = t.path().join("app");
    let libs = [rocm.join("lib/libvadd.so"), rocm.join("lib/libmulti.so")];
    let s = bundle_json(&[&libs[0], &libs[1], &"--into", &app]);
    assert_eq!(names(&app), [".kpack", "libmulti.so", "libvadd.so"]);
    let archives = ["g_gfx1100.kpack", "g_gfx1101.kpack", "g_gfx942.kpack"];
    assert_eq!(names(&app.join(".kpack")), archives);
    // 1 code object × 3 targets, 4 × 2.
    assert_eq!(s["loads_checked"], 11);
    let repointed = serde_json::json!([".kpack/g_@GFXARCH@.kpack"]);
    for (b, name) in s["binaries"]
        .as_array()
        .unwrap()
        .iter()
        .zip(["libvadd.so", "libmulti.so"])
    {
        assert_eq!(
            (&b["repointed"], &b["search_paths"]),
            (&Value::Bool(true), &repointed)
        );
        assert_tools_accept(&fixture(name).path, &app.join(name));
        // Only the search paths changed: kernel name and targets kept.
        let ls: Value =
            serde_json::from_str(&kpack_ok(&[&"ls", &app.join(name), &"--json"])).unwrap();
        assert_eq!(ls["kernel_name"], format!("lib/{name}"));
        assert_eq!(ls["search_paths"], repointed);
        assert!(ls["targets"].as_array().unwrap().len() >= 2);
    }
    // The install it came from goes away: the bundle is enough.
    fs::rename(&rocm, t.path().join("gone")).unwrap();
    assert_runtime_loads(&app, &["libvadd.so", "libmulti.so"], t.path());
    kpack_ok(&[&"doctor", &app, &"--arch", &"gfx942", &"--arch", &"gfx1100"]);
    // A rerun into the same folder changes nothing.
    let before = snapshot(&app);
    fs::rename(t.path().join("gone"), &rocm).unwrap();
    bundle_json(&[&libs[0], &libs[1], &"--into", &app]);
    assert_eq!(snapshot(&app), before);
}

#[test]
fn only_the_chosen_targets() {
    let t = scratch();
    let rocm = t.path().join("rocm");
    pack_fixtures_in_lib(t.path(), &["libvadd.so", "libwide.so"], &rocm);
    // gfx90a takes both xnack archives.
    let app = t.path().join("app");
    let (vadd, wide) = (rocm.join("lib/libvadd.so"), rocm.join("lib/libwide.so"));
    let s = bundle_json(&[
        &vadd,
        &wide,
        &"--into",
        &app,
        &"--targets",
        &"gfx942",
        &"gfx90a",
    ]);
    let archives = [
        "g_gfx90a:xnack+.kpack",
        "g_gfx90a:xnack-.kpack",
        "g_gfx942.kpack",
    ];
    assert_eq!(names(&app.join(".kpack")), archives);
    assert_eq!(s["binaries"][0]["targets"], serde_json::json!(["gfx942"]));
    assert_eq!(doctor_code(&app, "gfx942").0, 1, "libwide has no gfx942");
    assert_eq!(doctor_code(&app, "gfx1100").0, 1, "gfx1100 was left out");
    let o = kpack(&[
        &"doctor",
        &app.join("libwide.so"),
        &"--arch",
        &"gfx90a:xnack-",
    ]);
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn the_layout_kept() {
    let t = scratch();
    let rocm = t.path().join("rocm");
    pack_fixtures_in_lib(t.path(), &["libvadd.so"], &rocm);
    let kept = t.path().join("kept");
    let lib = rocm.join("lib/libvadd.so");
    let s = bundle_json(&[&lib, &"--into", &kept, &"--layout", &"keep"]);
    assert_eq!(s["binaries"][0]["repointed"], false);
    // The binary copied as it is, its archives where its paths look.
    assert_eq!(
        fs::read(kept.join("lib/libvadd.so")).unwrap(),
        fs::read(&lib).unwrap()
    );
    let archives = ["g_gfx1100.kpack", "g_gfx1101.kpack", "g_gfx942.kpack"];
    assert_eq!(names(&kept.join(".kpack")), archives);
    fs::remove_dir_all(&rocm).unwrap();
    assert_runtime_loads(&kept.join("lib"), &["libvadd.so"], t.path());
}

#[test]
fn with_the_libraries_it_needs() {
    let t = scratch();
    let rocm = t.path().join("rocm");
    pack_fixtures_in_lib(t.path(), &["libvadd.so"], &rocm);
    // It needs libhostonly.so from its prefix, found through $ORIGIN.
    let lib = rocm.join("lib/libvadd.so");
    fs::copy(
        fixture("libhostonly.so").path,
        rocm.join("lib/libhostonly.so"),
    )
    .unwrap();
    for args in [
        ["--add-needed", "libhostonly.so"],
        ["--set-rpath", "$ORIGIN"],
    ] {
        run_ok(Command::new("patchelf").args(args).arg(&lib));
    }
    let deps = t.path().join("deps");
    let s = bundle_json(&[&lib, &"--into", &deps, &"--with-deps"]);
    let dep = &s["binaries"][1];
    assert_eq!(
        (dep["dest"].as_str(), dep["dependency"].as_bool()),
        (Some("libhostonly.so"), Some(true))
    );
    // Loads from the bundle alone.
    fs::rename(&rocm, t.path().join("gone")).unwrap();
    let check = fixture("libvadd.so").host_check.clone().unwrap();
    let out = run_ok(
        Command::new(fixtures_dir().join(manifest().dlcheck))
            .arg(deps.join("libvadd.so"))
            .arg(&*check.symbol),
    );
    assert_eq!(out.trim(), check.value.to_string());
    kpack_ok(&[&"doctor", &deps, &"--arch", &"gfx942"]);
}

fn doctor_code(dir: &Path, arch: &str) -> (i32, String) {
    let o = kpack(&[&"doctor", &dir, &"--arch", &arch]);
    (
        o.status.code().unwrap(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

#[test]
fn bad_requests_leave_the_folder_as_it_was() {
    let t = scratch();
    let rocm = t.path().join("rocm");
    pack_fixtures_in_lib(t.path(), &["libvadd.so", "libmulti.so"], &rocm);
    let lib = rocm.join("lib/libvadd.so");
    // An archive the binary needs for a chosen target is gone.
    fs::rename(
        rocm.join(".kpack/g_gfx942.kpack"),
        t.path().join("away.kpack"),
    )
    .unwrap();
    let app = t.path().join("app");
    let err = kpack_fails(&[&"bundle", &lib, &"--into", &app, &"--targets", &"gfx942"]);
    assert!(
        err.contains("libvadd.so: split for gfx942, but no archive"),
        "{err}"
    );
    assert!(!app.exists(), "nothing written");
    fs::rename(
        t.path().join("away.kpack"),
        rocm.join(".kpack/g_gfx942.kpack"),
    )
    .unwrap();
    // A folder that holds another file where the bundle goes.
    fs::create_dir_all(&app).unwrap();
    fs::write(app.join("libvadd.so"), b"the app's own").unwrap();
    fs::write(app.join("app.exe"), b"app").unwrap();
    let before = snapshot(&app);
    let err = kpack_fails(&[&"bundle", &lib, &"--into", &app]);
    assert!(
        err.contains("--overwrite") && err.contains("libvadd.so"),
        "{err}"
    );
    assert_eq!(snapshot(&app), before);
    kpack_ok(&[&"bundle", &lib, &"--into", &app, &"--overwrite"]);
    assert_eq!(fs::read(app.join("app.exe")).unwrap(), b"app");
    kpack_ok(&[&"verify-elf", &app.join("libvadd.so")]);
    // Two binaries of one name, flat; a file that does not exist; a bad target.
    let other = t.path().join("other/libvadd.so");
    fs::create_dir_all(other.parent().unwrap()).unwrap();
    fs::copy(rocm.join("lib/libmulti.so"), &other).unwrap();
    let err = kpack_fails(&[&"bundle", &lib, &other, &"--into", &t.path().join("x")]);
    assert!(err.contains("--layout keep"), "{err}");
    let err = kpack_fails(&[&"bundle", &t.path().join("nope.so"), &"--into", &app]);
    assert!(err.contains("nope.so: no such file"), "{err}");
    let err = kpack_fails(&[&"bundle", &lib, &"--into", &app, &"--targets", &"sm_90"]);
    assert!(err.contains("sm_90"), "{err}");
    assert!(!t.path().join("x").exists());
}

/// The Windows deployment: a DLL beside the program that loads it, its
/// archives in `.kpack` there; under Wine the stand-in HIP runtime sees
/// wrappers whose metadata, resolved from the DLL's new place, gives the
/// bundler's code objects.
#[test]
fn a_windows_dll_beside_its_loader() {
    let f = crate::windows::windows("windows/vadd.dll");
    let t = scratch();
    let prefix = t.path().join("rocm");
    let dll = prefix.join("bin/vadd.dll");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &dll,
        &"--archive-dir",
        &prefix.join(".kpack"),
    ]);
    let app = t.path().join("app");
    let s = bundle_json(&[&dll, &"--into", &app]);
    assert_eq!(
        s["binaries"][0]["search_paths"],
        serde_json::json!([".kpack/vadd_@GFXARCH@.kpack"])
    );
    kpack_ok(&[&"verify-binary", &app.join("vadd.dll")]);
    fs::rename(&prefix, t.path().join("gone")).unwrap();
    let run = crate::windows::run_host(&f, &app.join("vadd.dll"));
    assert_eq!(run.value, f.host_check.as_ref().unwrap().value);
    assert_eq!(run.registered.len(), f.wrappers);
    let truth = code_objects(&f.path);
    let loader = kpack_loader::Loader::new(kpack_loader::Config::default());
    for (i, (magic, _, co, meta)) in run.registered.iter().enumerate() {
        assert_eq!(*magic, HIPK_MAGIC, "wrapper {i}");
        assert_eq!(meta.search_paths, [".kpack/vadd_@GFXARCH@.kpack"]);
        for t in &f.targets {
            let got = loader
                .load_code_object(
                    &meta.encode(),
                    &app.join("vadd.dll"),
                    *co as u32,
                    &[t.as_str()],
                )
                .unwrap();
            assert!(got == truth[&(*co as usize, t.clone())], "wrapper {i} {t}");
        }
    }
}
