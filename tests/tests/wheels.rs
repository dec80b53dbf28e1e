//! `kpack split-wheels` on a torch-like fat wheel built from the HIP
//! fixtures: every output checked by PyPI's `wheel` (`python -m wheel
//! unpack` verifies each file against the RECORD) and installed by `pip`
//! with one extra, then another; every wrapper of every installed host
//! binary resolves through kpack's loader to exactly what
//! clang-offload-bundler extracts from the original binary for that GPU.
//! Also: METADATA, names and tags; the same bytes for any `-j`;
//! `SOURCE_DATE_EPOCH`; a directory input with symlinks; directory output;
//! bad input.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::wheel::*;
use crate::common::*;
use kpack_host::offload::verify_file;
use kpack_loader::{Config, Loader};

fn split(input: &Path, out: &Path, extra: &[&str]) -> String {
    let mut args: Vec<std::ffi::OsString> = vec!["split-wheels".into()];
    args.extend(with_overrides(therock_args(input, out), extra));
    let args: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|a| a as _).collect();
    kpack_ok(&args)
}

fn device_wheel(key: &str) -> String {
    format!(
        "amd_torch_device_{}-{VERSION}-{TAG}.whl",
        key.replace('-', "_")
    )
}

fn host_wheel() -> String {
    format!("torch-{VERSION}-{TAG}.whl")
}

/// The members of a wheel file and their bytes.
fn members(whl: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut z = zip::ZipArchive::new(fs::File::open(whl).unwrap()).unwrap();
    (0..z.len())
        .map(|i| {
            let mut f = z.by_index(i).unwrap();
            let mut b = Vec::new();
            f.read_to_end(&mut b).unwrap();
            (f.name().unwrap().into_owned(), b)
        })
        .collect()
}

fn text(whl: &Path, name: &str) -> String {
    String::from_utf8(
        members(whl)
            .remove(name)
            .unwrap_or_else(|| panic!("{name} not in {}", whl.display())),
    )
    .unwrap()
}

/// The bundles every device wheel of the torch-like wheel is for.
const KEYS: &[&str] = &["gfx1100", "gfx1101", "gfx110x", "gfx90a", "gfx942"];

#[test]
fn split_check_install_and_load() {
    let tmp = scratch();
    let whl = torch_wheel(tmp.path());
    let before = fs::read(&whl).unwrap();
    let out = tmp.path().join("dist");
    let stdout = split(&whl, &out, &["--generate-variant-wheel"]);
    assert_eq!(fs::read(&whl).unwrap(), before, "the input changed");
    assert!(stdout.starts_with("Split complete:\n"), "{stdout}");
    for k in KEYS {
        let line = format!(
            "  Device wheel ({k}): {}",
            out.join(device_wheel(k)).display()
        );
        assert!(stdout.contains(&line), "{line}\n{stdout}");
    }
    let mut want: Vec<String> = KEYS.iter().map(|k| device_wheel(k)).collect();
    want.push(host_wheel());
    want.push(host_wheel().replace(".whl", "-variant.whl"));
    want.sort();
    assert_eq!(
        names(&out),
        want,
        "exactly the outputs, nothing left behind"
    );

    // PyPI's wheel verifies every member against RECORD.
    for w in &want {
        python_ok(&[
            &"-m",
            &"wheel",
            &"unpack",
            &"-d",
            &tmp.path().join("unpacked"),
            &out.join(w),
        ]);
    }
    check_host_wheel(&out.join(host_wheel()));
    check_device_wheels(&out);

    // pip: the host wheel with one GPU's device wheels.
    let env = new_venv(&tmp.path().join("venv"));
    let r = pip_install(&env, &[&out, &wheelhouse()], &["torch[device-gfx1100]"]);
    assert!(
        r.status.success(),
        "pip: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let torch = site_packages(&env).join("torch");
    assert_eq!(kpacks(&torch), ["torch_gfx1100.kpack"]);
    check_databases(&torch, &["gfx1100", "gfx110x"]);
    assert!(
        site_packages(&env).join("rocm_bootstrap").is_dir(),
        "rocm-bootstrap installed as a dependency"
    );
    let loaded = check_loads(&torch, "gfx1100");
    assert_eq!(loaded, 10, "wrappers resolved");
    assert_eq!(
        fs::metadata(torch.join("bin/vadd"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );

    // A second extra adds its files.
    let r = pip_install(&env, &[&out, &wheelhouse()], &["torch[device-gfx942]"]);
    assert!(
        r.status.success(),
        "pip: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert_eq!(
        kpacks(&torch),
        ["torch_gfx1100.kpack", "torch_gfx942.kpack"]
    );
    check_databases(&torch, &["gfx1100", "gfx110x", "gfx942"]);
    check_loads(&torch, "gfx942");
    check_loads(&torch, "gfx1100");
}

fn kpacks(torch: &Path) -> Vec<String> {
    names(&torch.join(".kpack"))
}

/// The installed database files are exactly those of `keys`; the generic
/// files are there; MIOpen's CK library is its original (fat) self.
fn check_databases(torch: &Path, keys: &[&str]) {
    for (rel, key) in DATABASES {
        assert_eq!(torch.join(rel).is_file(), keys.contains(key), "{rel}");
    }
    for rel in GENERIC {
        assert!(torch.join(rel).is_file(), "{rel}");
    }
    let ck = torch.join(MIOPEN_CK.0);
    assert_eq!(ck.is_file(), keys.contains(&"gfx1100"));
    if ck.is_file() {
        assert_eq!(
            fs::read(&ck).unwrap(),
            fs::read(fixtures_dir().join(MIOPEN_CK.1)).unwrap()
        );
    }
}

/// Every wrapper of every installed host binary resolves through the
/// loader, from its installed path, to the bundler's code object of its
/// bundle for `target`. Returns the number of wrappers.
fn check_loads(torch: &Path, target: &str) -> usize {
    let loader = Loader::new(Config::default());
    let mut n = 0;
    for (rel, fixture) in FAT {
        let installed = torch.join(rel);
        let v = verify_file(&installed).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert_eq!(v.metadata.kernel_name, *rel);
        let depth = rel.matches('/').count();
        assert_eq!(
            v.metadata.search_paths,
            [format!(
                "{}.kpack/torch_@GFXARCH@.kpack",
                "../".repeat(depth)
            )]
        );
        let want = code_objects(&fixtures_dir().join(fixture));
        for &co in &v.co_indices {
            let got = loader
                .load_code_object(&v.metadata.encode(), &installed, co as u32, &[target])
                .unwrap_or_else(|e| panic!("{rel} #{co} for {target}: {e}"));
            assert_eq!(
                got,
                want[&(co as usize, target.to_string())],
                "{rel} #{co} {target}"
            );
            n += 1;
        }
    }
    n
}

fn check_host_wheel(host: &Path) {
    let m = members(host);
    let dist_info = format!("torch-{VERSION}.dist-info");
    let names: Vec<&String> = m.keys().collect();
    for (rel, _) in FAT {
        assert!(m.contains_key(&format!("torch/{rel}")), "{rel}");
    }
    for (rel, _) in DATABASES.iter().chain([&MIOPEN_CK]) {
        assert!(
            !m.contains_key(&format!("torch/{rel}")),
            "{rel} left in the host wheel"
        );
    }
    assert!(!names.iter().any(|n| n.contains(".kpack/")), "{names:?}");
    assert!(m.contains_key("torchgen/__init__.py"));
    // The host binaries have no device code left.
    let t = tempfile::tempdir().unwrap();
    for (rel, _) in FAT {
        let p = t.path().join(rel.replace('/', "_"));
        let bytes = &m[&format!("torch/{rel}")];
        fs::write(&p, bytes).unwrap();
        assert_eq!(
            kpack_host::binary::classify(bytes),
            kpack_host::binary::Class::Offloaded,
            "{rel}"
        );
        verify_file(&p).unwrap_or_else(|e| panic!("{rel}: {e}"));
    }
    // METADATA: the original header, the extras, the body.
    let md = String::from_utf8(m[&format!("{dist_info}/METADATA")].clone()).unwrap();
    let v = VERSION;
    let extra = |t: &str, chain: &[&str]| {
        let mut s = format!("Provides-Extra: device-{t}\n");
        for c in chain {
            s += &format!("Requires-Dist: amd-torch-device-{c} == {v}; extra == \"device-{t}\"\n");
        }
        s
    };
    let mut want = format!(
        "Metadata-Version: 2.1\nName: torch\nVersion: {v}\nSummary: Tensors\nRequires-Dist: rocm-bootstrap >= 0.3.0\n"
    );
    want += &extra("gfx1100", &["gfx1100", "gfx110x"]);
    want += &extra("gfx1101", &["gfx1101", "gfx110x"]);
    want += &extra("gfx90a", &["gfx90a"]);
    want += &extra("gfx942", &["gfx942"]);
    want += "Provides-Extra: device-all\n";
    for k in KEYS {
        want += &format!("Requires-Dist: amd-torch-device-{k} == {v}; extra == \"device-all\"\n");
    }
    want += "\nThe body.\n";
    assert_eq!(md, want);
    // RECORD: PEP 376 lines, its own line, every member once.
    let record = String::from_utf8(m[&format!("{dist_info}/RECORD")].clone()).unwrap();
    assert_eq!(record.lines().count(), m.len());
    assert!(record.contains(&format!("\n{dist_info}/RECORD,,\n")));
    for line in record.lines().filter(|l| !l.ends_with(",,")) {
        let digest = line
            .split(",sha256=")
            .nth(1)
            .and_then(|r| r.split(',').next());
        assert_eq!(
            digest.map(str::len),
            Some(43),
            "urlsafe base64 of 32 bytes, no padding: {line}"
        );
    }
}

fn check_device_wheels(out: &Path) {
    for k in KEYS {
        let w = out.join(device_wheel(k));
        let m = members(&w);
        let di = format!("amd_torch_device_{k}-{VERSION}.dist-info");
        let md = text(&w, &format!("{di}/METADATA"));
        assert!(
            md.starts_with(&format!(
                "Metadata-Version: 2.4\nName: amd-torch-device-{k}\nVersion: {VERSION}\n"
            )),
            "{md}"
        );
        // gfx1100 and gfx1101 also pin their sub-family's wheel.
        let family = match *k {
            "gfx1100" | "gfx1101" => {
                format!("Requires-Dist: amd-torch-device-gfx110x == {VERSION}\n")
            }
            _ => String::new(),
        };
        assert!(
            md.ends_with(&format!("Requires-Dist: torch == {VERSION}\n{family}")),
            "{md}"
        );
        assert_eq!(text(&w, &format!("{di}/top_level.txt")), "torch\n");
        assert_eq!(
            text(&w, &format!("{di}/WHEEL")),
            format!("Wheel-Version: 1.0\nGenerator: rocm-kpack-split-python-wheels\nRoot-Is-Purelib: false\nTag: {TAG}\n")
        );
        let mut z = zip::ZipArchive::new(fs::File::open(&w).unwrap()).unwrap();
        for i in 0..z.len() {
            let f = z.by_index(i).unwrap();
            let name = f.name().unwrap().into_owned();
            let stored = f.compression() == zip::CompressionMethod::Stored;
            assert_eq!(
                stored,
                name.ends_with(".kpack"),
                "{name}: {:?}",
                f.compression()
            );
        }
        let payload: BTreeSet<String> = m
            .keys()
            .filter(|n| n.starts_with("torch/"))
            .cloned()
            .collect();
        let mut want: BTreeSet<String> = DATABASES
            .iter()
            .filter(|(_, key)| key == k)
            .map(|(rel, _)| format!("torch/{rel}"))
            .collect();
        if *k == "gfx1100" {
            want.insert(format!("torch/{}", MIOPEN_CK.0));
        }
        if *k != "gfx110x" {
            let targets: &[&str] = if *k == "gfx90a" { &[] } else { &[k] };
            for t in targets {
                want.insert(format!("torch/.kpack/torch_{t}.kpack"));
            }
        }
        assert_eq!(payload, want, "{k}");
    }
    assert!(text(
        &out.join(device_wheel("gfx110x")),
        &format!("amd_torch_device_gfx110x-{VERSION}.dist-info/METADATA")
    )
    .contains("Summary: AMD device kernels (RDNA3) for torch\n"));
}

#[test]
fn same_bytes_for_any_jobs_and_source_date_epoch() {
    let tmp = scratch();
    let whl = torch_wheel(tmp.path());
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    split(
        &whl,
        &a,
        &[
            "-j",
            "1",
            "--device-requires-dist",
            "rocm-sdk-device-@GFXARCH@ == 7.1",
            "x",
        ],
    );
    split(
        &whl,
        &b,
        &[
            "-j",
            "2",
            "--device-requires-dist",
            "rocm-sdk-device-@GFXARCH@ == 7.1",
            "x",
        ],
    );
    assert_eq!(dir_files(&a), dir_files(&b));
    // @GFXARCH@ only in target wheels; a target's wheel then pins its
    // sub-family's.
    let gfx1100 = text(
        &a.join(device_wheel("gfx1100")),
        &format!("amd_torch_device_gfx1100-{VERSION}.dist-info/METADATA"),
    );
    assert!(gfx1100.ends_with(&format!("Requires-Dist: torch == {VERSION}\nRequires-Dist: rocm-sdk-device-gfx1100 == 7.1\nRequires-Dist: x\nRequires-Dist: amd-torch-device-gfx110x == {VERSION}\n")), "{gfx1100}");
    let family = text(
        &a.join(device_wheel("gfx110x")),
        &format!("amd_torch_device_gfx110x-{VERSION}.dist-info/METADATA"),
    );
    assert!(
        family.ends_with(&format!(
            "Requires-Dist: torch == {VERSION}\nRequires-Dist: x\n"
        )),
        "{family}"
    );

    let c = tmp.path().join("c");
    let mut cmd = std::process::Command::new(kpack_bin());
    cmd.arg("split-wheels")
        .args(therock_args(&whl, &c))
        .env("SOURCE_DATE_EPOCH", "1700000000");
    run_ok(&mut cmd);
    let mut z = zip::ZipArchive::new(fs::File::open(c.join(host_wheel())).unwrap()).unwrap();
    for i in 0..z.len() {
        let t = z.by_index(i).unwrap().last_modified().unwrap();
        assert_eq!(
            (t.year(), t.month(), t.day(), t.hour(), t.minute()),
            (2023, 11, 14, 22, 13)
        );
    }
    let mut z = zip::ZipArchive::new(fs::File::open(a.join(host_wheel())).unwrap()).unwrap();
    let t = z.by_index(0).unwrap().last_modified().unwrap();
    assert_eq!((t.year(), t.month(), t.day()), (1980, 1, 1));
}

#[test]
fn directory_input_with_symlinks_and_directory_output() {
    let tmp = scratch();
    let src = tmp.path().join("torch-unpacked");
    torch_tree(&src, true);
    let before = snapshot(&src);
    let out = tmp.path().join("out");
    split(
        &src,
        &out,
        &[
            "--output-format",
            "directory",
            "--generate-variant-wheel",
            "--variant-label",
            "amd",
        ],
    );
    assert_eq!(snapshot(&src), before, "the input directory changed");
    let host = out.join(host_wheel().trim_end_matches(".whl"));
    assert!(out.join(host_wheel().replace(".whl", "-amd")).is_dir());
    // The symlink became a file: the offloaded library.
    let lib = host.join("torch/lib/libtorch_hip.so");
    let link = host.join("torch/lib/libtorch_hip.so.1");
    assert!(!fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(&link).unwrap(), fs::read(&lib).unwrap());
    verify_file(&link).unwrap();
    assert_eq!(
        fs::metadata(host.join("torch/bin/vadd"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    // The same tree as the wheel output, unpacked.
    let w = tmp.path().join("w");
    split(&src, &w, &[]);
    let unpacked = tmp.path().join("u");
    python_ok(&[
        &"-m",
        &"wheel",
        &"unpack",
        &"-d",
        &unpacked,
        &w.join(host_wheel()),
    ]);
    let u = unpacked.join(format!("torch-{VERSION}"));
    let files = |d: &Path| -> BTreeMap<String, Vec<u8>> {
        snapshot(d)
            .into_iter()
            .filter(|(_, e)| e.0 == 'f')
            .map(|(k, _)| (k.clone(), fs::read(d.join(&k)).unwrap()))
            .collect()
    };
    assert_eq!(files(&host), files(&u));
    let dev = out.join(device_wheel("gfx942").trim_end_matches(".whl"));
    assert!(dev.join("torch/.kpack/torch_gfx942.kpack").is_file());
}

/// A file the tests make bad in some way, and what the error must say.
fn bad(tmp: &Path, name: &str, make: impl FnOnce(&Path) -> PathBuf, extra: &[&str], want: &str) {
    let dir = tmp.join(name);
    fs::create_dir_all(&dir).unwrap();
    let input = make(&dir);
    let out = dir.join("out");
    let mut args: Vec<std::ffi::OsString> = vec!["split-wheels".into()];
    args.extend(with_overrides(therock_args(&input, &out), extra));
    let args: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|a| a as _).collect();
    let err = kpack_fails(&args);
    assert!(
        err.contains(&input.display().to_string()),
        "{name}: the error does not name the wheel: {err}"
    );
    assert!(err.contains(want), "{name}: {err}");
    let left: Vec<String> = if out.exists() {
        names(&out)
    } else {
        Vec::new()
    };
    assert!(
        left.is_empty(),
        "{name}: left in the output directory: {left:?}"
    );
}

#[test]
fn bad_input_fails_cleanly() {
    let tmp = scratch();
    let t = tmp.path();
    let whl = torch_wheel(t);
    bad(
        t,
        "not-a-zip",
        |d| {
            let p = d.join("torch-1-py3-none-any.whl");
            fs::write(&p, "text").unwrap();
            p
        },
        &[],
        "not a wheel",
    );
    bad(
        t,
        "not-a-whl",
        |d| {
            let p = d.join("torch.tar");
            fs::write(&p, "text").unwrap();
            p
        },
        &[],
        "not a wheel",
    );
    bad(
        t,
        "missing",
        |d| d.join("nothing.whl"),
        &[],
        "does not exist",
    );
    bad(
        t,
        "no-dist-info",
        |d| {
            let s = d.join("w");
            torch_tree(&s, false);
            fs::remove_dir_all(s.join(format!("torch-{VERSION}.dist-info"))).unwrap();
            s
        },
        &[],
        "no *.dist-info",
    );
    bad(
        t,
        "two-dist-info",
        |d| {
            let s = d.join("w");
            torch_tree(&s, false);
            fs::create_dir(s.join("other-1.dist-info")).unwrap();
            s
        },
        &[],
        "2 *.dist-info",
    );
    bad(
        t,
        "no-fat",
        |d| {
            let s = d.join("w");
            torch_tree(&s, false);
            // No binary at all (a host-only library would be split as
            // host code only: tests/tests/no_device_code.rs).
            for (rel, _) in FAT.iter().chain([&MIOPEN_CK]) {
                fs::remove_file(s.join("torch").join(rel)).unwrap();
            }
            fs::remove_file(s.join("torch/lib/libcuda_like.so")).unwrap();
            s
        },
        &[],
        "no fat binaries found under torch/",
    );
    bad(
        t,
        "overlay",
        |_| whl.clone(),
        &["--overlay-root", "notthere/"],
        "overlay root 'notthere' does not exist",
    );
    bad(
        t,
        "handler",
        |_| whl.clone(),
        &["--databases", "rocblas", "tensile"],
        "unknown database handler \"tensile\"",
    );
    bad(
        t,
        "conflict",
        |d| {
            let s = d.join("w");
            torch_tree(&s, false);
            fs::create_dir_all(s.join("torch/.kpack")).unwrap();
            fs::write(s.join("torch/.kpack/torch_gfx942.kpack"), "stale").unwrap();
            s
        },
        &[],
        "conflicting payload path torch/.kpack/torch_gfx942.kpack",
    );
}

/// A target rocm-bootstrap 0.3.0 does not know gets a device wheel of its
/// own name, no family chain, and a warning.
#[test]
fn unknown_target_gets_its_own_wheel_and_a_warning() {
    let tmp = scratch();
    let src = tmp.path().join("w");
    torch_tree(&src, false);
    let db = src.join("torch/lib/rocblas/library/TensileLibrary_Type_HH_gfx1300.co");
    fs::write(&db, "a new GPU").unwrap();
    let out = tmp.path().join("out");
    let mut cmd = std::process::Command::new(kpack_bin());
    cmd.arg("split-wheels").args(therock_args(&src, &out));
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("kpack: warning: ")
            && err.contains("gfx1300 is not a target rocm-bootstrap 0.3.0 knows"),
        "{err}"
    );
    let w = out.join(device_wheel("gfx1300"));
    assert!(members(&w).contains_key("torch/lib/rocblas/library/TensileLibrary_Type_HH_gfx1300.co"));
    let md = text(
        &out.join(host_wheel()),
        &format!("torch-{VERSION}.dist-info/METADATA"),
    );
    assert!(md.contains(&format!(
        "Provides-Extra: device-gfx1300\nRequires-Dist: amd-torch-device-gfx1300 == {VERSION}; extra == \"device-gfx1300\"\nProvides-Extra: device-gfx90a\n"
    )), "{md}");
}
