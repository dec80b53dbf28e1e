//! rocFFT's per-architecture kernel caches (docs/tutorial.md, the `rocfft`
//! kernel-database handler): real SQLite databases made by the `sqlite3`
//! command with rocFFT's schema go through `split --split-databases
//! rocfft` (two shards, `--gpu-targets`), `verify --split-databases
//! rocfft`, `recombine` and `split-wheels --databases rocfft`; each cache
//! lands in its architecture's artifact or device wheel byte for byte and
//! is still a database `sqlite3` reads; the legacy combined cache stays
//! generic; a cache outside `--gpu-targets` is dropped.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// rocFFT's cache table (rocFFT 1.0.37).
const SCHEMA: &str = "CREATE TABLE cache_v1 (kernel_name TEXT NOT NULL, arch TEXT NOT NULL, \
     hip_version INTEGER NOT NULL, generator_sum BLOB NOT NULL, code BLOB NOT NULL, \
     timestamp INTEGER NOT NULL, \
     PRIMARY KEY (kernel_name, arch, hip_version, generator_sum));";

const CACHE_DIR: &str = "lib/rocfft";

fn sqlite(db: &Path, sql: &str) -> String {
    run_ok(Command::new("sqlite3").arg(db).arg(sql))
}

/// A cache for `arch` (the legacy combined one for `None`: rows of several
/// architectures) with `rows` kernels.
fn make_cache(db: &Path, arch: Option<&str>, rows: usize) {
    fs::create_dir_all(db.parent().unwrap()).unwrap();
    let mut sql = format!("{SCHEMA}\nBEGIN;\n");
    for i in 0..rows {
        let a = arch.unwrap_or(if i % 2 == 0 { "gfx942" } else { "gfx1100" });
        sql.push_str(&format!(
            "INSERT INTO cache_v1 VALUES ('fft_fwd_len{}_{a}', '{a}', 60443484, \
             X'{:064x}', zeroblob({}), {});\n",
            64 << (i % 8),
            i,
            2048 + 97 * i,
            1_760_000_000 + i
        ));
    }
    sql.push_str("COMMIT;");
    sqlite(db, &sql);
}

/// The database is intact and holds `rows` kernels, all for `arch`.
fn check_cache(db: &Path, arch: &str, rows: usize) {
    assert_eq!(sqlite(db, "PRAGMA integrity_check;").trim(), "ok");
    assert_eq!(
        sqlite(
            db,
            "SELECT count(*), group_concat(DISTINCT arch) FROM cache_v1;"
        )
        .trim(),
        format!("{rows}|{arch}"),
        "{}",
        db.display()
    );
}

fn cache_name(arch: &str) -> String {
    format!("rocfft_kernel_cache_{arch}.db")
}

/// An `fft_lib` artifact of one shard: a fat rocFFT library (libvadd.so:
/// gfx1100, gfx1101, gfx942), the legacy cache and one per `arches`.
fn fft_artifact(dir: &Path, arches: &[(&str, usize)]) {
    let stage = dir.join("stage");
    fs::create_dir_all(stage.join("lib")).unwrap();
    fs::write(dir.join("artifact_manifest.txt"), "stage\n").unwrap();
    fs::copy(fixture("libvadd.so").path, stage.join("lib/librocfft.so.0")).unwrap();
    make_cache(
        &stage.join(CACHE_DIR).join("rocfft_kernel_cache.db"),
        None,
        6,
    );
    for (arch, rows) in arches {
        make_cache(
            &stage.join(CACHE_DIR).join(cache_name(arch)),
            Some(arch),
            *rows,
        );
    }
}

fn split(shard: &Path, out: &Path, targets: &[&str]) {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
        &"split",
        &"--batch-artifact-parent-dir",
        &shard,
        &"--output-dir",
        &out,
        &"--split-databases",
        &"rocfft",
        &"--gpu-targets",
    ];
    for t in targets {
        args.push(t);
    }
    kpack_ok(&args);
}

fn verify(dir: &Path, databases: bool) -> std::process::Output {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"verify", &"--artifacts-dir", &dir];
    if databases {
        args.extend([
            &"--split-databases" as &dyn AsRef<std::ffi::OsStr>,
            &"rocfft",
        ]);
    }
    kpack(&args)
}

fn caches(dir: &Path) -> Vec<String> {
    let d = dir.join("stage").join(CACHE_DIR);
    if d.is_dir() {
        names(&d)
    } else {
        Vec::new()
    }
}

/// Two shards split, verified (also with a cache in the wrong place) and
/// recombined.
#[test]
fn rocfft_caches_split_verify_recombine() {
    let t = scratch();
    let inputs = t.path().join("in");
    // Shard s1 builds gfx94X; s2 gfx110X and also has a gfx90a cache that
    // its --gpu-targets leave out.
    fft_artifact(&inputs.join("s1/fft_lib_gfx94X-dcgpu"), &[("gfx942", 5)]);
    fft_artifact(
        &inputs.join("s2/fft_lib_gfx110X-dgpu"),
        &[("gfx1100", 4), ("gfx1101", 3), ("gfx90a", 2)],
    );
    let shards = t.path().join("shards");
    split(&inputs.join("s1"), &shards.join("s1"), &["gfx942"]);
    split(
        &inputs.join("s2"),
        &shards.join("s2"),
        &["gfx1100", "gfx1101"],
    );

    let s1 = shards.join("s1");
    assert_eq!(names(&s1), ["fft_lib_generic", "fft_lib_gfx942"]);
    assert_eq!(
        caches(&s1.join("fft_lib_generic")),
        ["rocfft_kernel_cache.db"]
    );
    assert_eq!(caches(&s1.join("fft_lib_gfx942")), [cache_name("gfx942")]);
    let s2 = shards.join("s2");
    assert_eq!(
        names(&s2),
        ["fft_lib_generic", "fft_lib_gfx1100", "fft_lib_gfx1101"]
    );
    assert_eq!(caches(&s2.join("fft_lib_gfx1100")), [cache_name("gfx1100")]);
    assert!(
        !snapshot(&s2).keys().any(|k| k.contains("gfx90a")),
        "the gfx90a cache is outside --gpu-targets"
    );
    // Byte for byte, and still databases.
    for (shard, input, arch, rows) in [
        (&s1, "s1/fft_lib_gfx94X-dcgpu", "gfx942", 5),
        (&s2, "s2/fft_lib_gfx110X-dgpu", "gfx1100", 4),
        (&s2, "s2/fft_lib_gfx110X-dgpu", "gfx1101", 3),
    ] {
        let rel = Path::new("stage").join(CACHE_DIR).join(cache_name(arch));
        let got = shard.join(format!("fft_lib_{arch}")).join(&rel);
        assert_eq!(
            fs::read(&got).unwrap(),
            fs::read(inputs.join(input).join(&rel)).unwrap()
        );
        check_cache(&got, arch, rows);
    }
    for s in [&s1, &s2] {
        let o = verify(s, true);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    }

    // verify --split-databases rocfft: a per-arch cache left in a generic
    // artifact is a problem; in another target's artifact, always.
    let bad = t.path().join("bad");
    run_ok(Command::new("cp").arg("-a").arg(&s1).arg(&bad));
    let cache = |arch: &str| Path::new("stage").join(CACHE_DIR).join(cache_name(arch));
    fs::copy(
        bad.join("fft_lib_gfx942").join(cache("gfx942")),
        bad.join("fft_lib_generic").join(cache("gfx90a")),
    )
    .unwrap();
    let o = verify(&bad, true);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&cache_name("gfx90a")), "{text}");
    let o = verify(&bad, false);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    fs::remove_file(bad.join("fft_lib_generic").join(cache("gfx90a"))).unwrap();
    fs::rename(
        bad.join("fft_lib_gfx942").join(cache("gfx942")),
        bad.join("fft_lib_gfx942").join(cache("gfx1100")),
    )
    .unwrap();
    let o = verify(&bad, false);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("a database file of gfx1100"), "{text}");

    // recombine: each group artifact gets its architectures' caches.
    let cfg = t.path().join("config.json");
    fs::write(
        &cfg,
        r#"{"primary_shard": "s1",
  "architecture_groups": {"gfx110X": {"architectures": ["gfx1100", "gfx1101"]},
                          "gfx94X": {"architectures": ["gfx942"]}},
  "validation": {"error_on_duplicate_device_code": true,
                 "verify_generic_artifacts_match": false,
                 "error_on_missing_architecture": true}}"#,
    )
    .unwrap();
    let out = t.path().join("recombined");
    kpack_ok(&[
        &"recombine",
        &"--input-shards-dir",
        &shards,
        &"--config",
        &cfg,
        &"--output-dir",
        &out,
    ]);
    assert_eq!(
        names(&out),
        ["fft_lib_generic", "fft_lib_gfx110X", "fft_lib_gfx94X"]
    );
    assert_eq!(
        caches(&out.join("fft_lib_gfx110X")),
        [cache_name("gfx1100"), cache_name("gfx1101")]
    );
    assert_eq!(caches(&out.join("fft_lib_gfx94X")), [cache_name("gfx942")]);
    assert_eq!(
        caches(&out.join("fft_lib_generic")),
        ["rocfft_kernel_cache.db"]
    );
    let dir = |g: &str| out.join(g).join("stage").join(CACHE_DIR);
    check_cache(
        &dir("fft_lib_gfx110X").join(cache_name("gfx1100")),
        "gfx1100",
        4,
    );
    check_cache(
        &dir("fft_lib_gfx110X").join(cache_name("gfx1101")),
        "gfx1101",
        3,
    );
    check_cache(
        &dir("fft_lib_gfx94X").join(cache_name("gfx942")),
        "gfx942",
        5,
    );
    assert_eq!(
        sqlite(
            &dir("fft_lib_generic").join("rocfft_kernel_cache.db"),
            "SELECT count(DISTINCT arch) FROM cache_v1;"
        )
        .trim(),
        "2"
    );
    let o = kpack(&[
        &"verify",
        &"--artifacts-dir",
        &out,
        &"--config",
        &cfg,
        &"--split-databases",
        &"rocfft",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

/// split-wheels --databases rocfft: each cache in its device wheel, the
/// legacy one in the host wheel.
#[test]
fn rocfft_caches_in_device_wheels() {
    let t = scratch();
    let src = t.path().join("wheel");
    let pkg = src.join("pkg");
    fs::create_dir_all(pkg.join("lib")).unwrap();
    fs::copy(fixture("libvadd.so").path, pkg.join("lib/librocfft.so")).unwrap();
    make_cache(&pkg.join(CACHE_DIR).join("rocfft_kernel_cache.db"), None, 4);
    for (arch, rows) in [("gfx942", 3), ("gfx1100", 2)] {
        make_cache(
            &pkg.join(CACHE_DIR).join(cache_name(arch)),
            Some(arch),
            rows,
        );
    }
    let di = src.join("pkg-1.0.dist-info");
    fs::create_dir_all(&di).unwrap();
    fs::write(
        di.join("METADATA"),
        "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
    )
    .unwrap();
    fs::write(
        di.join("WHEEL"),
        "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n",
    )
    .unwrap();
    let out = t.path().join("dist");
    kpack_ok(&[
        &"split-wheels",
        &"--input",
        &src,
        &"--output-dir",
        &out,
        &"--device-package-prefix",
        &"pkg-device",
        &"--overlay-root",
        &"pkg/",
        &"--databases",
        &"rocfft",
    ]);
    let member = |whl: &str, name: &str| -> Option<Vec<u8>> {
        let mut z = zip::ZipArchive::new(fs::File::open(out.join(whl)).unwrap()).unwrap();
        let mut f = z.by_name(name).ok()?;
        let mut b = Vec::new();
        f.read_to_end(&mut b).unwrap();
        Some(b)
    };
    let tag = "1.0-py3-none-linux_x86_64.whl";
    let host = format!("pkg-{tag}");
    assert!(member(&host, "pkg/lib/rocfft/rocfft_kernel_cache.db").is_some());
    for (arch, rows) in [("gfx942", 3), ("gfx1100", 2)] {
        let rel = format!("pkg/{CACHE_DIR}/{}", cache_name(arch));
        assert!(member(&host, &rel).is_none(), "{rel} in the host wheel");
        let bytes = member(&format!("pkg_device_{arch}-{tag}"), &rel)
            .unwrap_or_else(|| panic!("{rel} not in its device wheel"));
        assert_eq!(bytes, fs::read(src.join(&rel)).unwrap());
        let db: PathBuf = t.path().join(cache_name(arch));
        fs::write(&db, bytes).unwrap();
        check_cache(&db, arch, rows);
    }
    // gfx1101 has code objects but no cache: its wheel has none.
    let gfx1101 = format!("pkg_device_gfx1101-{tag}");
    assert!(out.join(&gfx1101).is_file());
    assert!(member(
        &gfx1101,
        &format!("pkg/{CACHE_DIR}/{}", cache_name("gfx1101"))
    )
    .is_none());
}
