//! `kpack doctor`: every offloaded binary under the paths resolved for
//! every GPU target as the runtime resolves it, each failure with its fix.
//! On real parts: a fake kernel-driver topology for detection, a packed
//! install tree with an archive removed, a split torch-like wheel
//! pip-installed into a venv before and after `pip install
//! "torch[device-...]"`, an application folder with a copied library,
//! binaries without recorded targets (as upstream writes them), fat and
//! invalid binaries, `ROCM_KPACK_PATH`, a Windows DLL.

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::Command;

use crate::common::wheel::*;
use crate::common::*;
use serde_json::Value;

/// `kpack doctor ARGS --json` with `env`: the exit status and the report
/// (no report when nothing could be checked: then stderr).
fn doctor(args: &[&dyn AsRef<OsStr>], env: &[(&str, &OsStr)]) -> (i32, Value, String) {
    let mut c = Command::new(kpack_bin());
    c.arg("doctor").arg("--json");
    for a in args {
        c.arg(a.as_ref());
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    let code = out.status.code().expect("an exit status");
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (code, v, stderr)
}

/// The problems of a report as (binary file name, target, kind, fix).
fn problems(v: &Value) -> Vec<(String, String, String, String)> {
    v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let name = Path::new(p["binary"].as_str().unwrap());
            (
                name.file_name().unwrap().to_string_lossy().into_owned(),
                p["target"].as_str().unwrap().to_string(),
                p["kind"].as_str().unwrap().to_string(),
                p["fix"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A KFD topology at `root`: one node per `(gfx_target_version,
/// capability)`, node 0 a CPU.
fn topology(root: &Path, gpus: &[(u64, u64)]) {
    let nodes = root.join("class/kfd/kfd/topology/nodes");
    let write = |n: usize, text: String| {
        fs::create_dir_all(nodes.join(n.to_string())).unwrap();
        fs::write(nodes.join(n.to_string()).join("properties"), text).unwrap();
    };
    write(
        0,
        "cpu_cores_count 8\nsimd_count 0\ngfx_target_version 0\ncapability 0\n".into(),
    );
    for (i, (v, cap)) in gpus.iter().enumerate() {
        write(
            i + 1,
            format!("simd_count 304\ngfx_target_version {v}\ncapability {cap}\n"),
        );
    }
}

#[test]
fn targets_come_from_the_kernel_drivers_topology() {
    let t = scratch();
    let out = t.path().join("packed");
    pack_fixtures_in_lib(t.path(), &["libwide.so", "libmulti.so"], &out);
    let sys = t.path().join("sys");
    // An MI210 with ECC on, and a Radeon RX 7900.
    topology(&sys, &[(90010, 0x0400_0000 | 0x100), (110000, 0)]);
    let (code, v, err) = doctor(&[&out, &"--sysfs-root", &sys], &[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        v["targets"],
        serde_json::json!(["gfx90a:sramecc+:xnack-", "gfx1100"])
    );
    // libwide's xnack- archive serves the MI210; libmulti has no code for it.
    assert_eq!(
        problems(&v),
        [(
            "libmulti.so".into(),
            "gfx90a:sramecc+:xnack-".into(),
            "no_code_for_target".into(),
            String::new()
        )]
    );
    let msg = v["problems"][0]["message"].as_str().unwrap();
    assert!(msg.contains("split for gfx1100, gfx942 only"), "{msg}");
    // XNACK on: the xnack+ archive.
    let (code, v, err) = doctor(
        &[&out, &"--sysfs-root", &sys],
        &[("HSA_XNACK", "1".as_ref())],
    );
    assert_eq!(code, 1, "{err}");
    assert_eq!(v["targets"][0], "gfx90a:sramecc+:xnack+");
    assert_eq!(problems(&v).len(), 1);
    // Without libmulti, everything resolves: exit 0.
    fs::remove_file(out.join("lib/libmulti.so")).unwrap();
    let (code, v, err) = doctor(&[&out, &"--sysfs-root", &sys], &[]);
    assert_eq!((code, problems(&v).len()), (0, 0), "{err}");
    // No GPU node, no --arch: nothing could be checked (2), pointing at --arch.
    let empty = t.path().join("nogpu");
    topology(&empty, &[]);
    let (code, _, err) = doctor(&[&out, &"--sysfs-root", &empty], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no GPU found") && err.contains("--arch"),
        "{err}"
    );
    let (code, _, err) = doctor(&[&t.path().join("missing"), &"--arch", &"gfx942"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("missing: no such file"), "{err}");
}

#[test]
fn a_packed_tree_with_an_archive_removed() {
    let t = scratch();
    let out = t.path().join("packed");
    pack_fixtures_in_lib(t.path(), &["libvadd.so", "libmulti.so"], &out);
    let (code, v, err) = doctor(&[&out, &"--arch", &"gfx942", &"--arch", &"gfx1100"], &[]);
    assert_eq!((code, problems(&v).len()), (0, 0), "{err}");
    fs::remove_file(out.join(".kpack/g_gfx942.kpack")).unwrap();
    let (code, v, _) = doctor(&[&out, &"--arch", &"gfx942", &"--arch", &"gfx1100"], &[]);
    assert_eq!(code, 1);
    let got = problems(&v);
    assert_eq!(got.len(), 2, "{v}");
    let want_fix = out.join(".kpack/g_gfx942.kpack").display().to_string();
    for (bin, target, kind, fix) in &got {
        assert!(bin == "libvadd.so" || bin == "libmulti.so");
        assert_eq!(
            (target.as_str(), kind.as_str()),
            ("gfx942", "missing_archive")
        );
        assert!(fix.contains(&want_fix), "{fix}");
    }
    // Text: one line per problem naming the binary, the target, what was
    // looked for and the fix.
    let o = kpack(&[&"doctor", &out, &"--arch", &"gfx942:sramecc+:xnack-"]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(" [gfx942")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    for l in lines {
        assert!(l.contains("looked for") && l.contains("; fix: "), "{l}");
        assert!(l.contains("g_gfx942:sramecc+:xnack-.kpack"), "{l}");
    }
    assert!(String::from_utf8_lossy(&o.stderr).contains("2 problem(s) found"));
}

/// A split torch-like wheel, installed host-only: each binary's fix is the
/// device extra; a GPU the wheel has no code for gets no fix; with the
/// extra installed all resolves; an archive deleted from an installed
/// device wheel is a reinstall of that wheel.
#[test]
fn a_pip_installed_split_wheel_before_and_after_its_device_extra() {
    let tmp = scratch();
    let whl = torch_wheel(tmp.path());
    let dist = tmp.path().join("dist");
    let mut args: Vec<std::ffi::OsString> = vec!["split-wheels".into()];
    args.extend(therock_args(&whl, &dist));
    let args: Vec<&dyn AsRef<OsStr>> = args.iter().map(|a| a as _).collect();
    kpack_ok(&args);
    let env = new_venv(&tmp.path().join("venv"));
    let install = |req: &str| {
        let r = pip_install(&env, &[&dist, &wheelhouse()], &[req]);
        assert!(
            r.status.success(),
            "pip: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    };
    install("torch");
    let site = site_packages(&env);
    let (code, v, err) = doctor(&[&site, &"--arch", &"gfx1100"], &[]);
    assert_eq!(code, 1, "{err}");
    let got = problems(&v);
    assert!(got.len() >= 4, "{v}");
    for (bin, target, kind, fix) in &got {
        assert_eq!(target, "gfx1100", "{bin}");
        assert_eq!(kind, "missing_archive", "{bin}");
        assert_eq!(fix, "pip install \"torch[device-gfx1100]\"", "{bin}");
    }
    // The wheel has no code for gfx1151: say so, never an extra.
    let (code, v, _) = doctor(&[&site, &"--arch", &"gfx1151"], &[]);
    assert_eq!(code, 1);
    for (bin, _, kind, fix) in problems(&v) {
        assert_eq!(
            (kind.as_str(), fix.as_str()),
            ("no_code_for_target", ""),
            "{bin}"
        );
    }
    assert!(!v.to_string().contains("pip install"), "{v}");
    install("torch[device-gfx1100]");
    let (code, v, err) = doctor(&[&site, &"--arch", &"gfx1100"], &[]);
    assert_eq!((code, problems(&v).len()), (0, 0), "{err}\n{v}");
    assert!(v["offloaded"].as_u64().unwrap() >= 4);
    // verify --tree agrees: MIOpen's CK library, archived and installed
    // fat as upstream's wheels do, is no mixed build.
    kpack_ok(&[&"verify", &"--tree", &site.join("torch")]);
    fs::remove_file(site.join("torch/.kpack/torch_gfx1100.kpack")).unwrap();
    let (code, v, _) = doctor(&[&site, &"--arch", &"gfx1100"], &[]);
    assert_eq!(code, 1);
    for (bin, _, _, fix) in problems(&v) {
        assert_eq!(
            fix, "pip install --force-reinstall \"amd-torch-device-gfx1100\"",
            "{bin}"
        );
    }
}

/// A library copied into an application folder loses its archives: the
/// fix names the archive found among the paths and where it must go.
#[test]
fn an_application_folder_with_a_copied_library() {
    let t = scratch();
    let out = t.path().join("rocm");
    pack_fixtures_in_lib(t.path(), &["libvadd.so"], &out);
    let app = t.path().join("apps/myapp");
    fs::create_dir_all(&app).unwrap();
    fs::copy(out.join("lib/libvadd.so"), app.join("libvadd.so")).unwrap();
    let (code, v, err) = doctor(&[&app, &out, &"--arch", &"gfx942"], &[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(problems(&v).len(), 1, "{v}");
    let p = &v["problems"][0];
    assert_eq!(p["binary"], app.join("libvadd.so").display().to_string());
    let from = out.join(".kpack/g_gfx942.kpack").display().to_string();
    let to = t
        .path()
        .join("apps/.kpack/g_gfx942.kpack")
        .display()
        .to_string();
    assert_eq!(
        p["fix"],
        format!("copy {from} to {to} (or `kpack bundle` the binary)"),
        "{p}"
    );
    // Following the fix makes it resolve.
    fs::create_dir_all(t.path().join("apps/.kpack")).unwrap();
    fs::copy(&from, &to).unwrap();
    let (code, _, err) = doctor(&[&app, &"--arch", &"gfx942"], &[]);
    assert_eq!(code, 0, "{err}");
}

/// A binary as upstream writes it (no `kpack_targets`): doctor falls back
/// to the archives present.
#[test]
fn binaries_without_recorded_targets_fall_back_to_the_archives() {
    let t = scratch();
    let root = t.path().join("tree");
    let lib = root.join("lib/libvadd.so");
    let f = fixture("libvadd.so");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &lib,
        &"--archive-dir",
        &root.join(".kpack"),
    ]);
    // The same rewrite with the reference's two keys only.
    let bytes = fs::read(&f.path).unwrap();
    let meta = kpack_format::hipk::HipkMetadata::new(
        "libvadd.so",
        vec!["../.kpack/libvadd_@GFXARCH@.kpack".into()],
    );
    let rewritten = kpack_host::offload::rewrite(&f.path, &bytes, &meta).unwrap();
    let mut out = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .truncate(true)
        .open(&lib)
        .unwrap();
    let source = fs::File::open(&f.path).unwrap();
    kpack_host::offload::write_rewritten(&f.path, &rewritten, Some(&source), &mut out).unwrap();
    drop(out);
    let ls: Value = serde_json::from_str(&kpack_ok(&[&"ls", &lib, &"--json"])).unwrap();
    assert!(ls["targets"].is_null(), "{ls}");
    let (code, _, err) = doctor(&[&root, &"--arch", &"gfx1100"], &[]);
    assert_eq!(code, 0, "{err}");
    let (code, v, _) = doctor(&[&root, &"--arch", &"gfx90a"], &[]);
    assert_eq!(code, 1);
    assert_eq!(
        problems(&v),
        [(
            "libvadd.so".into(),
            "gfx90a".into(),
            "no_code_for_target".into(),
            String::new()
        )]
    );
    let msg = v["problems"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("archives present serve gfx1100, gfx1101, gfx942 only"),
        "{msg}"
    );
}

/// Fat binaries (without code for the GPU, or where the archives expect an
/// offloaded one), invalid binaries, and `ROCM_KPACK_PATH`.
#[test]
fn fat_and_invalid_binaries_and_the_environment() {
    let t = scratch();
    let out = t.path().join("packed");
    pack_fixtures_in_lib(t.path(), &["libvadd.so", "libmulti.so"], &out);
    // A fat binary: its own code, none for gfx90a.
    let fat = t.path().join("fat");
    fs::create_dir_all(&fat).unwrap();
    fs::copy(fixture("libvadd.so").path, fat.join("libvadd.so")).unwrap();
    let (code, v, _) = doctor(&[&fat, &"--arch", &"gfx90a"], &[]);
    assert_eq!(code, 1);
    assert_eq!(problems(&v)[0].2, "no_code_for_target");
    let (code, _, _) = doctor(&[&fat, &"--arch", &"gfx1101"], &[]);
    assert_eq!(code, 0);
    // The fat build over the offloaded one, and a damaged binary.
    fs::copy(fixture("libmulti.so").path, out.join("lib/libmulti.so")).unwrap();
    // Damaged metadata: the verifier refuses the binary.
    let vadd = out.join("lib/libvadd.so");
    let mut b = fs::read(&vadd).unwrap();
    let at = {
        let elf = kpack_host::elf::ElfView::parse(&b).unwrap();
        elf.section(".rocm_kpack_ref").unwrap().unwrap().offset as usize
    };
    b[at] = 0xc1;
    fs::write(&vadd, &b).unwrap();
    let (code, v, _) = doctor(&[&out, &"--arch", &"gfx942"], &[]);
    assert_eq!(code, 1);
    let kinds: Vec<String> = problems(&v).into_iter().map(|p| p.2).collect();
    assert!(kinds.contains(&"fat_binary".to_string()), "{v}");
    assert!(kinds.contains(&"invalid_binary".to_string()), "{v}");
    // ROCM_KPACK_PATH replaces the embedded paths, as at run time.
    let t2 = scratch();
    let out2 = t2.path().join("packed");
    pack_fixtures_in_lib(t2.path(), &["libvadd.so"], &out2);
    let moved = t2.path().join("elsewhere.kpack");
    fs::rename(out2.join(".kpack/g_gfx942.kpack"), &moved).unwrap();
    let lib = out2.join("lib");
    assert_eq!(doctor(&[&lib, &"--arch", &"gfx942"], &[]).0, 1);
    let env = [("ROCM_KPACK_PATH", moved.as_os_str())];
    assert_eq!(doctor(&[&lib, &"--arch", &"gfx942"], &env).0, 0);
}

/// Windows DLLs resolve as ELF libraries do.
#[test]
fn a_windows_dll() {
    let t = scratch();
    let f = foreign_fixture("windows/vadd.dll");
    let dll = t.path().join("app/bin/vadd.dll");
    let archives = t.path().join("app/.kpack");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &dll,
        &"--archive-dir",
        &archives,
    ]);
    let app = t.path().join("app");
    assert_eq!(doctor(&[&app, &"--arch", &"gfx942"], &[]).0, 0);
    fs::remove_file(archives.join("vadd_gfx942.kpack")).unwrap();
    let (code, v, _) = doctor(&[&app, &"--arch", &"gfx942"], &[]);
    assert_eq!(code, 1);
    assert_eq!(problems(&v)[0].0, "vadd.dll");
    assert_eq!(problems(&v)[0].2, "missing_archive");
}
