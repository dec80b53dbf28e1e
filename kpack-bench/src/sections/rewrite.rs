//! Prune and restore of librocsparse (issue 16), and what `kpack size`
//! shows for its targets: `kpack prune` to one target, `kpack restore` of
//! its offloaded form (every target, from the archives), each timed as a
//! child process; the per-target bytes of `kpack size --json` in the row's
//! details.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::args;
use crate::context::Ctx;
use crate::inputs::{remove, ROCSPARSE};
use crate::measure::{resident, timed, warm, Runs};
use crate::report::Row;

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let s = "rewrite";
    let lib = &ROCSPARSE;
    let input = Path::new(lib.path);
    if !input.is_file() {
        let why = format!("{} is not installed", lib.path);
        return Ok(vec![
            Row::unavailable(s, "prune", "prune librocsparse", why.clone()),
            Row::unavailable(s, "restore", "restore librocsparse", why),
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
    Ok(vec![p, r])
}

fn kpack_json(ctx: &Ctx, a: &[std::ffi::OsString], cwd: &Path) -> Result<Value> {
    let run = timed(&ctx.kpack, a, cwd)?;
    serde_json::from_str(&run.stdout).context("kpack --json output is not JSON")
}
