//! Determinism: the bytes every command writes do not depend on `--jobs`
//! (1 or 8), on the run (repeated runs), or on the order in which the file
//! system lists directory entries (the same trees created in opposite
//! orders, on tmpfs, which lists newest first). Covers split (batch, all
//! three shards of the pipeline fixtures), recombine, pack-tree, verify
//! (its JSON report) and offload. (`pipeline.rs` checks split with
//! `--jobs 1`/`2` on one shard; this extends it to every command.)

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::*;

/// Does the listing order really differ? (tmpfs lists newest first.)
fn listing_order(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn assert_same(what: &str, runs: &[(String, Snapshot)]) {
    let (first_name, first) = &runs[0];
    assert!(first.len() > 10, "{what}: only {} entries", first.len());
    for (name, other) in &runs[1..] {
        assert_eq!(
            first.keys().collect::<Vec<_>>(),
            other.keys().collect::<Vec<_>>(),
            "{what}: {first_name} and {name} hold different paths"
        );
        for (k, v) in first {
            assert!(
                other[k] == *v,
                "{what}: {k} differs between {first_name} and {name}"
            );
        }
    }
}

fn split_all(shards: &Path, out: &Path, jobs: &str) {
    for (shard, _, _) in SHARDS {
        split_shard(&shards.join(shard), &out.join(shard), jobs);
    }
}

#[test]
fn every_command_is_deterministic() {
    let base = scratch();
    let b = base.path();
    let a_in = b.join("in-a");
    make_shards(&a_in);
    let b_in = b.join("in-b");
    reversed_copy(&a_in, &b_in);
    let sample =
        "gfx110X-build/blas_lib_gfx110X-dgpu/math-libs/BLAS/rocBLAS/stage/lib/rocblas/library";
    assert_ne!(
        listing_order(&a_in.join(sample)),
        listing_order(&b_in.join(sample)),
        "the two input trees list in the same order: the test would prove nothing"
    );

    // split: --jobs 1 on tree a, --jobs 8 on tree b, --jobs 8 again on a.
    let runs = [
        ("split-j1-a", &a_in, "1"),
        ("split-j8-b", &b_in, "8"),
        ("split-j8-a", &a_in, "8"),
    ];
    let mut snaps = Vec::new();
    for (name, input, jobs) in runs {
        let out = b.join(name);
        split_all(input, &out, jobs);
        snaps.push((name.to_string(), snapshot(&out)));
    }
    assert_same("split", &snaps);

    // verify: the same JSON report whatever --jobs.
    let reports: Vec<String> = ["1", "8", "8"]
        .iter()
        .map(|j| {
            kpack_ok(&[
                &"verify",
                &"--artifacts-dir",
                &b.join("split-j1-a/gfx110X-build"),
                &"--json",
                &"--jobs",
                j,
            ])
        })
        .collect();
    assert!(reports[0].contains("\"wrappers_resolved\""));
    assert!(
        reports.iter().all(|r| *r == reports[0]),
        "verify reports differ"
    );

    // recombine: the split outputs, and the same laid out in reverse order.
    let config = b.join("config.json");
    fs::write(&config, PACKAGING_CONFIG).unwrap();
    let split_rev = b.join("split-rev");
    reversed_copy(&b.join("split-j1-a"), &split_rev);
    let mut snaps = Vec::new();
    for (name, input, jobs) in [
        ("recombine-j1", b.join("split-j1-a"), "1"),
        ("recombine-j8-rev", split_rev.clone(), "8"),
        ("recombine-j8", b.join("split-j8-b"), "8"),
    ] {
        let out = b.join(name);
        kpack_ok(&[
            &"recombine",
            &"--input-shards-dir",
            &input,
            &"--config",
            &config,
            &"--output-dir",
            &out,
            &"--jobs",
            &jobs,
        ]);
        snaps.push((name.to_string(), snapshot(&out)));
    }
    assert_same("recombine", &snaps);
    let group = b.join("recombine-j1");
    kpack_ok(&[&"verify", &"--artifacts-dir", &group, &"--config", &config]);

    // pack-tree: an install tree (blas + fft of the first shard), and the
    // same in reverse order; --jobs and its alias --max-workers.
    let (shard, family, _) = SHARDS[0];
    let tree = b.join("rocm");
    install(
        &[
            a_in.join(shard).join(format!("blas_lib_{family}")),
            a_in.join(shard).join(format!("fft_lib_{family}")),
        ],
        &tree,
    );
    let tree_rev = b.join("rocm-rev");
    reversed_copy(&tree, &tree_rev);
    let mut snaps = Vec::new();
    for (name, input, flag, jobs) in [
        ("pack-j1", &tree, "--jobs", "1"),
        ("pack-j8-rev", &tree_rev, "--max-workers", "8"),
        ("pack-j8", &tree, "--jobs", "8"),
    ] {
        let out = b.join(name);
        kpack_ok(&[
            &"pack-tree",
            &"--input",
            input,
            &"--output",
            &out,
            &"--group-name",
            &"rocm",
            &flag,
            &jobs,
        ]);
        snaps.push((name.to_string(), snapshot(&out)));
    }
    assert_same("pack-tree", &snaps);
}

/// offload (no --jobs: archives are compressed in parallel on all cores):
/// repeated runs, both schemes, a multi-bundle binary.
#[test]
fn offload_is_deterministic() {
    let base = scratch();
    for compression in ["zstd", "none"] {
        let mut snaps = Vec::new();
        for run in 0..3 {
            let out: PathBuf = base.path().join(format!("{compression}-{run}"));
            kpack_ok(&[
                &"offload",
                &fixture("libmulti.so").path,
                &"-o",
                &out.join("lib/libmulti.so"),
                &"--archive-dir",
                &out.join(".kpack"),
                &"--compression",
                &compression,
            ]);
            snaps.push((format!("run {run}"), snapshot(&out)));
        }
        assert_eq!(snaps[0].1.len(), 5, "{:?}", snaps[0].1.keys());
        let (first_name, first) = &snaps[0];
        for (name, other) in &snaps[1..] {
            assert!(
                first == other,
                "offload --compression {compression}: {first_name} and {name} differ"
            );
        }
    }
}
