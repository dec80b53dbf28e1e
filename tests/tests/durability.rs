//! Durability on request: `kpack` fsyncs nothing by default; with
//! `--durable` or `KPACK_DURABLE=1` it fsyncs each output file and each
//! distinct output directory once, at the end. Counted with strace (the
//! fsync system calls the process and its threads make); the outputs are
//! the same bytes either way.

use std::path::Path;
use std::process::Command;

use crate::common::*;

/// Run `kpack args` under strace with `KPACK_DURABLE` set to `env` (or
/// unset); returns the number of fsync and fdatasync calls it made.
fn fsyncs(args: &[&dyn AsRef<std::ffi::OsStr>], env: Option<&str>, log: &Path) -> usize {
    let mut c = Command::new("strace");
    c.args([
        "-f",
        "-qq",
        "-e",
        "signal=none",
        "-e",
        "trace=fsync,fdatasync",
    ]);
    c.arg("-o").arg(log).arg(kpack_bin());
    for a in args {
        c.arg(a.as_ref());
    }
    c.env_remove("KPACK_DURABLE");
    if let Some(v) = env {
        c.env("KPACK_DURABLE", v);
    }
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("running strace (Debian: apt-get install strace): {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = std::fs::read_to_string(log).unwrap();
    trace
        .lines()
        .filter(|l| l.contains("fsync(") || l.contains("fdatasync("))
        .count()
}

/// `kpack offload` of a binary with three targets: three archives and the
/// binary in two directories.
#[test]
fn offload_fsyncs_only_when_durable() {
    let base = scratch();
    let b = base.path();
    let f = fixture("libvadd.so");
    let run = |name: &str, durable_flag: bool, env: Option<&str>| {
        let out = b.join(name);
        let lib = out.join("lib/libvadd.so");
        let kp = out.join(".kpack");
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> =
            vec![&"offload", &f.path, &"-o", &lib, &"--archive-dir", &kp];
        if durable_flag {
            args.insert(0, &"--durable");
        }
        let log = b.join(format!("{name}.strace"));
        (fsyncs(&args, env, &log), snapshot(&out))
    };
    let (default, reference) = run("default", false, None);
    assert_eq!(default, 0, "fsync without --durable");
    let (off, _) = run("env-off", false, Some("0"));
    assert_eq!(off, 0, "fsync with KPACK_DURABLE=0");
    // 3 archives + the binary, then .kpack and lib.
    for (name, flag, env) in [("flag", true, None), ("env", false, Some("1"))] {
        let (n, snap) = run(name, flag, env);
        assert_eq!(n, 6, "{name}: one fsync per output file and directory");
        assert_eq!(snap, reference, "{name}: the same outputs");
    }
}

/// `kpack pack-tree` (a staged tree renamed into place), with the flag
/// after the subcommand: every file and directory of the tree.
#[test]
fn trees_fsync_only_when_durable() {
    let base = scratch();
    let b = base.path();
    let tree = b.join("tree");
    std::fs::create_dir_all(tree.join("lib")).unwrap();
    for name in ["libvadd.so", "libmulti.so"] {
        std::fs::copy(fixture(name).path, tree.join("lib").join(name)).unwrap();
    }
    let pack = |out: &Path, durable: bool| {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
            &"pack-tree",
            &"--input",
            &tree,
            &"--output",
            &out,
            &"--group-name",
            &"g",
        ];
        if durable {
            args.push(&"--durable");
        }
        fsyncs(&args, None, &b.join("pack.strace"))
    };
    assert_eq!(pack(&b.join("p0"), false), 0);
    let files = snapshot(&b.join("p0")).len();
    let n = pack(&b.join("p1"), true);
    assert!(
        n > files,
        "pack-tree --durable: {n} fsyncs for {files} entries"
    );
    assert_eq!(snapshot(&b.join("p1")), snapshot(&b.join("p0")));
}
