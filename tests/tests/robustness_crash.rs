//! Crash-safe outputs: `kpack split` killed with SIGKILL at many points of a
//! run over the end-to-end fixture tree (one shard of the pipeline
//! fixtures: three artifacts, fat binaries, database files, symlinks)
//! never leaves a partial artifact under its final name:
//! - every output artifact that is visible is byte-identical to the one an
//!   uninterrupted run writes (artifacts appear by renaming a complete
//!   staging directory), so `kpack verify` either rejects the output (a
//!   per-target artifact whose generic artifact is not there yet) or
//!   accepts only complete artifacts;
//! - anything else left behind is a hidden `.kpack-staging-*` or
//!   `.kpack-scratch-*` directory, which verify ignores;
//! - rerunning the same command (with `--overwrite`, since some artifacts
//!   may be complete already) gives byte-identical output to the
//!   uninterrupted run.
//!
//! Also: `kpack offload` and `kpack pack-tree` killed part-way leave no
//! file under a final name.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn split_args(input: &Path, out: &Path) -> Vec<std::ffi::OsString> {
    let mut args = split_shard_args(input, out, "1");
    // Slow compression stretches the run, so that the kill points fall in
    // every phase (packing, archives, manifests, renames).
    args.extend(["--compression-level".into(), "22".into()]);
    args
}

/// Visible entries (not below a hidden top-level directory), and the names
/// of the hidden top-level entries.
fn visible(out: &Path) -> (Snapshot, Vec<String>) {
    let mut hidden = Vec::new();
    if !out.exists() {
        return (Snapshot::new(), hidden);
    }
    let snap = snapshot(out)
        .into_iter()
        .filter(|(k, _)| {
            let top = k.split('/').next().unwrap();
            if top.starts_with('.') {
                if top == k {
                    hidden.push(k.clone());
                }
                false
            } else {
                true
            }
        })
        .collect();
    (snap, hidden)
}

/// Run `kpack args`, SIGKILL it after `delay` (if still running). Returns
/// whether it finished on its own.
fn run_killed(args: &[std::ffi::OsString], delay: Duration) -> bool {
    let mut child = Command::new(kpack_bin())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < delay {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "kpack failed on its own: {st}");
            return true;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    // Child::kill sends SIGKILL.
    child.kill().unwrap();
    let st = child.wait().unwrap();
    st.success()
}

#[test]
fn split_killed_at_any_point() {
    let base = scratch();
    let b = base.path();
    let (shard, family, targets) = SHARDS[0];
    make_shard(&b.join("in"), shard, family, targets);
    let input = b.join("in").join(shard);

    // The uninterrupted run.
    let reference = b.join("ref");
    let clock = Instant::now();
    let o = Command::new(kpack_bin())
        .args(split_args(&input, &reference))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let total = clock.elapsed();
    let (want, hidden) = visible(&reference);
    assert!(hidden.is_empty(), "{hidden:?}");
    let artifacts: Vec<String> = names(&reference);
    assert!(artifacts.len() >= 8, "{artifacts:?}");

    let mut killed = 0;
    let mut partial = 0;
    let mut rejected = 0;
    // Kill points spread over the run (and a few right at the start).
    let mut delays: Vec<Duration> = [1u32, 3, 6]
        .iter()
        .map(|ms| Duration::from_millis(u64::from(*ms)))
        .collect();
    for pct in [5u32, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99] {
        delays.push(total * pct / 100);
    }
    for (i, delay) in delays.iter().enumerate() {
        let out = b.join(format!("out-{i}"));
        let finished = run_killed(&split_args(&input, &out), *delay);
        killed += usize::from(!finished);
        let (got, hidden) = visible(&out);
        for h in &hidden {
            assert!(
                h.starts_with(".kpack-staging-") || h.starts_with(".kpack-scratch-"),
                "kill point {i}: unexpected leftover {h}"
            );
        }
        // Every visible artifact is complete: identical to the reference.
        let present: Vec<String> = if out.exists() {
            names(&out)
                .into_iter()
                .filter(|n| !n.starts_with('.'))
                .collect()
        } else {
            Vec::new()
        };
        for a in &present {
            assert!(artifacts.contains(a), "kill point {i}: unknown output {a}");
            for (k, v) in want
                .iter()
                .filter(|(k, _)| k.starts_with(&format!("{a}/")) || *k == a)
            {
                assert!(
                    got.get(k) == Some(v),
                    "kill point {i} ({delay:?}): {k} is missing or differs: a partial artifact is visible"
                );
            }
        }
        for k in got.keys() {
            assert!(
                want.contains_key(k),
                "kill point {i}: {k} is not in the reference"
            );
        }
        if !present.is_empty() && present.len() < artifacts.len() {
            partial += 1;
        }
        // verify: rejects, or accepts complete artifacts only.
        if out.exists() {
            let v = kpack(&[&"verify", &"--artifacts-dir", &out]);
            if !v.status.success() {
                rejected += 1;
                assert_eq!(v.status.code(), Some(1));
            }
        }
        // Rerun: the same bytes as the uninterrupted run.
        let mut args = split_args(&input, &out);
        args.push("--overwrite".into());
        let o = Command::new(kpack_bin()).args(&args).output().unwrap();
        assert!(
            o.status.success(),
            "kill point {i}: rerun failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let (again, _) = visible(&out);
        assert_eq!(
            again.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "kill point {i}: rerun"
        );
        for (k, v) in &want {
            assert!(
                again[k] == *v,
                "kill point {i}: {k} differs after the rerun"
            );
        }
        kpack_ok(&[&"verify", &"--artifacts-dir", &out]);
    }
    eprintln!(
        "split of {} artifacts in {total:?}: {} kill points, {killed} killed mid-run, {partial} left some artifacts complete, verify rejected {rejected}",
        artifacts.len(),
        delays.len()
    );
    assert!(
        killed >= delays.len() / 2,
        "only {killed} runs were killed mid-run"
    );
}

/// Kill points over a run that takes `total` uninterrupted: a few right at
/// the start, then spread over the run, and a last one long after its end
/// (the run finishes: its complete output is checked like the others).
fn kill_points(total: Duration) -> Vec<Duration> {
    let mut delays: Vec<Duration> = [1u64, 3].map(Duration::from_millis).to_vec();
    for pct in [10u32, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99] {
        delays.push(total * pct / 100);
    }
    delays.push(Duration::from_secs(60));
    delays
}

/// What the kill points of one command did: how many runs the kill
/// interrupted, and how many checks of what they left were made (each
/// check asserts).
#[derive(Default, Debug)]
struct Tally {
    interrupted: usize,
    checks: usize,
}

/// How long `kpack args` takes, uninterrupted.
fn timed_run(args: &[std::ffi::OsString]) -> Duration {
    let clock = Instant::now();
    let o = Command::new(kpack_bin()).args(args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    clock.elapsed()
}

fn offload_args(input: &Path, out: &Path) -> Vec<std::ffi::OsString> {
    vec![
        "offload".into(),
        input.into(),
        "-o".into(),
        out.join("lib/libwide.so").into(),
        "--archive-dir".into(),
        out.join(".kpack").into(),
        "--compression-level".into(),
        "19".into(),
    ]
}

fn pack_tree_args(tree: &Path, out: &Path) -> Vec<std::ffi::OsString> {
    vec![
        "pack-tree".into(),
        "--input".into(),
        tree.into(),
        "--output".into(),
        out.into(),
        "--group-name".into(),
        "g".into(),
        "--compression-level".into(),
        "19".into(),
    ]
}

/// What a killed offload left in `out`: the binary, if there, is complete;
/// every archive under its final name opens. The number of checks.
fn check_offload_output(out: &Path) -> usize {
    let mut checks = 0;
    let lib = out.join("lib/libwide.so");
    if lib.exists() {
        kpack_ok(&[&"verify-elf", &lib]);
        checks += 1;
    }
    if out.join(".kpack").exists() {
        for name in names(&out.join(".kpack")) {
            if !name.starts_with(".kpack-tmp-") {
                kpack_loader::open_archive(out.join(".kpack").join(&name))
                    .unwrap_or_else(|e| panic!("partial archive {name}: {e}"));
                checks += 1;
            }
        }
    }
    checks
}

/// offload and pack-tree killed part-way: no output under a final name
/// that is not complete (each file appears by rename; pack-tree's tree by
/// renaming its staging directory). Some kill points must really interrupt
/// a run, and some must leave output to check.
#[test]
fn offload_and_pack_tree_killed() {
    let base = scratch();
    let b = base.path();
    let f = fixture("libwide.so");
    let tree = b.join("tree");
    let libs = ["libwide.so", "libmulti.so", "libvadd.so"];
    fs::create_dir_all(tree.join("lib")).unwrap();
    for name in libs {
        fs::copy(fixture(name).path, tree.join("lib").join(name)).unwrap();
    }

    let mut offload = Tally::default();
    let total = timed_run(&offload_args(&f.path, &b.join("o-ref")));
    for (i, delay) in kill_points(total).into_iter().enumerate() {
        let out = b.join(format!("o{i}"));
        offload.interrupted += usize::from(!run_killed(&offload_args(&f.path, &out), delay));
        offload.checks += check_offload_output(&out);
    }

    let mut pack = Tally::default();
    let total = timed_run(&pack_tree_args(&tree, &b.join("p-ref")));
    for (i, delay) in kill_points(total).into_iter().enumerate() {
        let out = b.join(format!("p{i}"));
        let finished = run_killed(&pack_tree_args(&tree, &out), delay);
        pack.interrupted += usize::from(!finished);
        if finished || out.exists() {
            // Complete: every binary offloaded, every archive readable.
            for name in libs {
                kpack_ok(&[&"verify-elf", &out.join("lib").join(name)]);
                pack.checks += 1;
            }
        }
    }
    eprintln!("offload: {offload:?}; pack-tree: {pack:?}");
    for (what, t) in [("offload", &offload), ("pack-tree", &pack)] {
        assert!(t.interrupted > 0, "{what}: no kill point interrupted a run");
        assert!(t.checks > 0, "{what}: no kill point left output to check");
    }
}
