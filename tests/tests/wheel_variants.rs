//! `--generate-variant-wheel --variant-format pep825` (docs/wheels.md,
//! variant wheels): one variant wheel per target, each accepted by PyPI's
//! `variantlib` (which refuses upstream's format), the index file
//! `<name>-<version>-variants.json`, and `uv pip install --preview-features
//! wheel-variants --find-links` installing the variant of the first
//! target with its device wheels into a fresh virtual environment.

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use crate::common::wheel::*;
use crate::common::*;

const TARGETS: &[&str] = &["gfx1100", "gfx1101", "gfx90a", "gfx942"];

fn split(whl: &Path, out: &Path, extra: &[&str]) -> String {
    let mut args: Vec<std::ffi::OsString> = vec!["split-wheels".into()];
    args.extend(therock_args(whl, out));
    args.push("--generate-variant-wheel".into());
    args.extend(extra.iter().map(Into::into));
    let args: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|a| a as _).collect();
    kpack_ok(&args)
}

fn member(whl: &Path, name: &str) -> String {
    let mut z = zip::ZipArchive::new(fs::File::open(whl).unwrap()).unwrap();
    let mut s = String::new();
    z.by_name(name)
        .unwrap_or_else(|_| panic!("{name} not in {}", whl.display()))
        .read_to_string(&mut s)
        .unwrap();
    s
}

fn variantlib(args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
    let mut c = Command::new(venv().join("bin/variantlib"));
    for a in args {
        c.arg(a.as_ref());
    }
    c.output().expect("run variantlib")
}

#[test]
fn pep825_variant_wheels_validate_and_install_with_uv() {
    let tmp = scratch();
    let whl = torch_wheel(tmp.path());
    let out = tmp.path().join("dist");
    let stdout = split(&whl, &out, &["--variant-format", "pep825"]);
    let host = format!("torch-{VERSION}-{TAG}.whl");
    let index = format!("torch-{VERSION}-variants.json");
    for t in TARGETS {
        let name = host.replace(".whl", &format!("-{t}.whl"));
        let line = format!("  Variant wheel ({t}): {}", out.join(&name).display());
        assert!(stdout.contains(&line), "{line}\n{stdout}");
    }
    assert!(stdout.contains(&format!("  Variants index: {}", out.join(&index).display())));
    assert!(out.join(&index).is_file());

    // variantlib reads every variant wheel (exactly one variant, labelled
    // as its file name says) and the index.
    let di = format!("torch-{VERSION}.dist-info");
    for t in TARGETS {
        let w = out.join(host.replace(".whl", &format!("-{t}.whl")));
        let o = variantlib(&[&"analyze-wheel", &"-i", &w]);
        let text =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{text}");
        assert!(text.contains(&format!("amd :: gfx_arch :: {t}")), "{text}");
        let vj: serde_json::Value =
            serde_json::from_str(&member(&w, &format!("{di}/variant.json"))).unwrap();
        assert_eq!(
            vj["$schema"],
            "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json"
        );
        assert_eq!(
            vj["variants"],
            serde_json::json!({*t: {"amd": {"gfx_arch": [t]}}})
        );
        // Its METADATA requires its device wheels.
        let md = member(&w, &format!("{di}/METADATA"));
        assert!(
            md.contains(&format!(
                "\nRequires-Dist: amd-torch-device-{t} == {VERSION}\n"
            )),
            "{md}"
        );
        python_ok(&[
            &"-m",
            &"wheel",
            &"unpack",
            &"-d",
            &tmp.path().join("unpacked"),
            &w,
        ]);
    }
    let check_index = "import json, sys\n\
         from variantlib.variants_json import VariantsJson\n\
         v = VariantsJson(json.load(open(sys.argv[1])))\n\
         print(sorted(v.variants))";
    let labels = python_ok(&[&"-c", &check_index, &out.join(&index)]);
    assert_eq!(labels.trim(), format!("{TARGETS:?}").replace('"', "'"));

    // uv installs the first target's variant (the order of the static
    // properties), and with it that target's device wheels.
    let env = new_venv(&tmp.path().join("venv"));
    let o = Command::new(venv().join("bin/uv"))
        .args([
            "pip",
            "install",
            "--preview-features",
            "wheel-variants",
            "--no-index",
            "--python",
        ])
        .arg(env.join("bin/python"))
        .arg("--find-links")
        .arg(&out)
        .arg("--find-links")
        .arg(wheelhouse())
        .arg("torch")
        .env("UV_CACHE_DIR", tmp.path().join("uv-cache"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "uv: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let site = site_packages(&env);
    let installed: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(site.join(&di).join("variant.json")).unwrap())
            .unwrap();
    assert_eq!(
        installed["variants"],
        serde_json::json!({"gfx1100": {"amd": {"gfx_arch": ["gfx1100"]}}})
    );
    assert_eq!(names(&site.join("torch/.kpack")), ["torch_gfx1100.kpack"]);
    assert!(site
        .join("torch/lib/aotriton.images/amd-gfx110x/flash/attn_fwd.aks2")
        .is_file());
}

/// Upstream's format stays the default, and variantlib refuses it
/// (several variants in one wheel).
#[test]
fn upstream_variant_wheel_is_the_default() {
    let tmp = scratch();
    let whl = torch_wheel(tmp.path());
    let out = tmp.path().join("dist");
    let stdout = split(&whl, &out, &[]);
    let w = out.join(format!("torch-{VERSION}-{TAG}-variant.whl"));
    assert!(stdout.contains(&format!("  Variant wheel: {}", w.display())));
    assert!(!out.join(format!("torch-{VERSION}-variants.json")).exists());
    let o = variantlib(&[&"analyze-wheel", &"-i", &w]);
    assert!(!o.status.success());
    // --variant-label belongs to the upstream format.
    let mut args: Vec<std::ffi::OsString> = vec!["split-wheels".into()];
    args.extend(therock_args(&whl, &tmp.path().join("o2")));
    for a in [
        "--generate-variant-wheel",
        "--variant-format",
        "pep825",
        "--variant-label",
        "x",
    ] {
        args.push(a.into());
    }
    let args: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|a| a as _).collect();
    let err = kpack_fails(&args);
    assert!(err.contains("--variant-label"), "{err}");
}
