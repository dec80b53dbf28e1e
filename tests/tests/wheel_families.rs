//! Device wheels require their family wheels (docs/wheels.md): a
//! target-level device wheel pins, after its host and
//! `--device-requires-dist` lines, the sub-family and family wheels of its
//! packaging chain that the same split emits (exact host version, local
//! part included); family and sub-family wheels pin none. Checked in the
//! METADATA, and by real pip installing one target's device wheel (alone,
//! and through the host's extra) into fresh virtual environments: the
//! family wheel comes with it.

use std::fs;
use std::io::Read;
use std::path::Path;

use crate::common::wheel::*;
use crate::common::*;

fn metadata(whl: &Path) -> String {
    let mut z = zip::ZipArchive::new(fs::File::open(whl).unwrap()).unwrap();
    let name = (0..z.len())
        .map(|i| z.by_index(i).unwrap().name().unwrap().into_owned())
        .find(|n| n.ends_with(".dist-info/METADATA"))
        .unwrap();
    let mut s = String::new();
    z.by_name(&name).unwrap().read_to_string(&mut s).unwrap();
    s
}

fn requires(whl: &Path) -> Vec<String> {
    metadata(whl)
        .lines()
        .filter_map(|l| l.strip_prefix("Requires-Dist: "))
        .map(str::to_string)
        .collect()
}

fn device(out: &Path, key: &str) -> std::path::PathBuf {
    out.join(format!("amd_torch_device_{key}-{VERSION}-{TAG}.whl"))
}

/// The distributions installed in a virtual environment (dist-info names,
/// normalized: `amd_torch_device_gfx110x`).
fn installed(env: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(site_packages(env))
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            let stem = n.strip_suffix(".dist-info")?;
            Some(stem.rsplit_once('-').unwrap().0.to_lowercase())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn target_device_wheels_pull_their_family_wheels() {
    let tmp = scratch();
    let whl = torch_wheel(tmp.path());
    let out = tmp.path().join("dist");
    let mut args: Vec<std::ffi::OsString> = vec!["split-wheels".into()];
    args.extend(therock_args(&whl, &out));
    // A requirement the wheelhouse satisfies (rocm-sdk-device-* is not
    // there).
    args.extend([
        "--device-requires-dist".into(),
        "rocm-bootstrap >= 0.3.0".into(),
    ]);
    let args: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|a| a as _).collect();
    kpack_ok(&args);

    // gfx1100 and gfx1101 belong to gfx110x (emitted) and gfx11 (not).
    let host = format!("torch == {VERSION}");
    let family = format!("amd-torch-device-gfx110x == {VERSION}");
    for k in ["gfx1100", "gfx1101"] {
        assert_eq!(
            requires(&device(&out, k)),
            [host.as_str(), "rocm-bootstrap >= 0.3.0", family.as_str()],
            "{k}"
        );
    }
    // gfx90a and gfx942: no family wheel emitted; gfx110x is a sub-family.
    for k in ["gfx90a", "gfx942", "gfx110x"] {
        assert_eq!(
            requires(&device(&out, k)),
            [host.as_str(), "rocm-bootstrap >= 0.3.0"],
            "{k}"
        );
    }

    // pip: the target's device wheel alone brings the host and family
    // wheels (and their dependencies from the wheelhouse).
    let house = wheelhouse();
    let links = [out.as_path(), house.as_path()];
    let env = new_venv(&tmp.path().join("alone"));
    let r = pip_install(&env, &links, &["amd-torch-device-gfx1100"]);
    assert!(
        r.status.success(),
        "pip: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let got = installed(&env);
    for d in [
        "amd_torch_device_gfx1100",
        "amd_torch_device_gfx110x",
        "torch",
    ] {
        assert!(got.contains(&d.to_string()), "{d} not installed: {got:?}");
    }
    assert!(
        !got.iter().any(|d| d == "amd_torch_device_gfx942"),
        "{got:?}"
    );
    let torch = site_packages(&env).join("torch");
    assert!(torch
        .join("lib/aotriton.images/amd-gfx110x/flash/attn_fwd.aks2")
        .is_file());
    assert_eq!(names(&torch.join(".kpack")), ["torch_gfx1100.kpack"]);

    // The host's extra does the same.
    let env = new_venv(&tmp.path().join("extra"));
    let r = pip_install(&env, &links, &["torch[device-gfx1101]"]);
    assert!(
        r.status.success(),
        "pip: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let got = installed(&env);
    assert!(
        got.contains(&"amd_torch_device_gfx110x".to_string()),
        "{got:?}"
    );
    assert!(
        got.contains(&"amd_torch_device_gfx1101".to_string()),
        "{got:?}"
    );
}
