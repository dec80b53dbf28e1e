//! Prune and restore of librocsparse, and what `kpack size`
//! shows for its targets: `kpack prune` to one target, `kpack restore` of
//! its offloaded form (every target, from the archives), each timed as a
//! child process; the per-target bytes of `kpack size --json` in the row's
//! details. Then `kpack verify --tree` over librocsparse's offloaded form
//! installed as a tree (`lib/` and `.kpack/`), on one thread and on all,
//! against its floor: reading the archives' TOCs and every code object's
//! symbol table, on one thread, in process.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::args;
use crate::context::Ctx;
use crate::measure::{resident, timed, warm, Runs};
use crate::report::{FloorRatio, Row};
use kpack_testkit::inputs::rocm::ROCSPARSE;
use kpack_testkit::tree::remove;

section!(
    "rewrite",
    "prune and restore of librocsparse, and verify --tree over its offloaded form installed as a tree",
    run
);

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let s = NAME;
    let lib = &ROCSPARSE;
    let input = Path::new(lib.path);
    if !input.is_file() {
        let why = format!("{} is not installed", lib.path);
        return Ok(vec![
            Row::unavailable(s, "prune", "prune librocsparse", why.clone()),
            Row::unavailable(s, "restore", "restore librocsparse", why.clone()),
            Row::unavailable(s, "verify_tree", "kpack verify --tree", why),
        ]);
    }
    let dir = ctx.work.join(s);
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let size = kpack_json(ctx, &args!["size", input, "--json"], &dir)?;
    let targets = size["roots"][0]["targets"].clone();
    let first = targets
        .as_object()
        .and_then(|t| t.keys().next().cloned())
        .context("librocsparse has no targets")?;
    // The offloaded form restore starts from (not timed).
    let host = dir.join("offloaded").join(lib.file_name());
    kpack_json(
        ctx,
        &args![
            "offload",
            input,
            "-o",
            &host,
            "--archive-dir",
            dir.join("offloaded/.kpack"),
            "--json"
        ],
        &dir,
    )?;
    warm(&[input, &host])?;
    let (pruned, restored) = (dir.join("pruned.so"), dir.join("restored.so"));
    let (mut prune, mut restore) = (Runs::default(), Runs::default());
    for rep in 0..ctx.reps {
        eprintln!(
            "{}: prune and restore, run {}/{}",
            lib.name,
            rep + 1,
            ctx.reps
        );
        remove(&pruned)?;
        let r = resident(&[input]);
        let a = args!["prune", input, "-o", &pruned, "--targets", &first, "--json"];
        prune.push(timed(&ctx.kpack, &a, &dir)?, r);
        remove(&restored)?;
        let r = resident(&[&host]);
        let a = args!["restore", &host, "-o", &restored, "--json"];
        restore.push(timed(&ctx.kpack, &a, &dir)?, r);
    }
    let mut p = Row::new(s, "prune", format!("prune {} to {first}", lib.name));
    prune.fill(&mut p);
    p.bytes_in = Some(std::fs::metadata(input)?.len());
    p.bytes_out = Some(std::fs::metadata(&pruned)?.len());
    p.details = json!({"size_targets": targets});
    let mut r = Row::new(s, "restore", format!("restore {} (every target)", lib.name));
    restore.fill(&mut r);
    r.bytes_in = Some(std::fs::metadata(&host)?.len());
    r.bytes_out = Some(std::fs::metadata(&restored)?.len());
    // Not under "archives": the table reads that key as archive figures.
    let summary: Value = serde_json::from_str(&restore.last_stdout).unwrap_or(Value::Null);
    r.details = json!({"compressed": summary["compressed"], "bundles": summary["bundles"].as_array().map(Vec::len), "targets": summary["targets"]});
    let mut rows = vec![p, r];
    rows.extend(verify_tree(ctx, &dir)?);
    Ok(rows)
}

/// `kpack verify --tree` over librocsparse installed as a tree, and its
/// floor (the TOCs and every code object's symbol table, one thread).
fn verify_tree(ctx: &Ctx, dir: &Path) -> Result<Vec<Row>> {
    let s = NAME;
    let lib = &ROCSPARSE;
    let tree = dir.join("tree");
    let host = tree.join("lib").join(lib.file_name());
    let kernel_name = format!("lib/{}", lib.file_name());
    kpack_json(
        ctx,
        &args![
            "offload",
            Path::new(lib.path),
            "-o",
            &host,
            "--archive-dir",
            tree.join(".kpack"),
            "--kernel-name",
            &kernel_name,
            "--search-path",
            "../.kpack/rocsparse_@GFXARCH@.kpack",
            "--group",
            "rocsparse",
            "--json"
        ],
        dir,
    )?;
    warm(&[&tree])?;
    let (mut floor, mut one, mut all) = (Runs::default(), Runs::default(), Runs::default());
    let mut kernels = 0;
    for rep in 0..ctx.reps {
        eprintln!("{}: verify --tree, run {}/{}", lib.name, rep + 1, ctx.reps);
        let t0 = std::time::Instant::now();
        kernels = read_symbol_tables(&tree.join(".kpack"))?;
        floor.wall.push(t0.elapsed().as_secs_f64());
        let r = resident(&[&tree]);
        one.push(
            timed(
                &ctx.kpack,
                &args!["verify", "--tree", &tree, "-j", "1"],
                dir,
            )?,
            r,
        );
        all.push(
            timed(&ctx.kpack, &args!["verify", "--tree", &tree], dir)?,
            r,
        );
    }
    let mut f = Row::new(
        s,
        "verify_tree_floor",
        format!(
            "read the TOCs and every code object's symbol table ({}, 1 thread)",
            lib.name
        ),
    );
    floor.fill(&mut f);
    f.details = json!({"kernels": kernels});
    let mut rows = vec![f];
    for (id, runs, work) in [
        ("verify_tree_1", one, "kpack verify --tree -j 1"),
        ("verify_tree", all, "kpack verify --tree (all cores)"),
    ] {
        let mut r = Row::new(s, id, format!("{work} ({} installed)", lib.name));
        runs.fill(&mut r);
        if let (Some(w), Some(fw)) = (r.wall(), rows[0].wall()) {
            r.floors.push(FloorRatio {
                floor: rows[0].id.clone(),
                ratio: w / fw,
            });
        }
        rows.push(r);
    }
    Ok(rows)
}

/// Every archive of `dir`: its TOC, then every code object read and its
/// `*.kd` symbols listed. Returns the number of kernels.
fn read_symbol_tables(dir: &Path) -> Result<usize> {
    let mut kernels = 0;
    for e in std::fs::read_dir(dir)? {
        let a = kpack_loader::open_archive(e?.path())?;
        for entry in a.entries() {
            let bytes = a.read(entry)?;
            kernels += kpack_host::kernels::defined_kernels(&bytes)
                .map(|k| k.len())
                .unwrap_or(0);
        }
    }
    Ok(kernels)
}

fn kpack_json(ctx: &Ctx, a: &[std::ffi::OsString], cwd: &Path) -> Result<Value> {
    let run = timed(&ctx.kpack, a, cwd)?;
    serde_json::from_str(&run.stdout).context("kpack --json output is not JSON")
}
