//! Section `doctor`: `kpack doctor` over a site-packages of a few hundred
//! binaries, as a torch install has them: 280 host-only libraries (real
//! ones, copied from the system's library directory) and 20 offloaded
//! libraries (librocrand under 20 names, packed by pack-tree into
//! `torch/.kpack`), with a dist-info whose RECORD lists every file. Timed:
//! doctor for one target, and for every target librocrand has; every
//! binary resolves (exit 0). Its work: each file classified, each
//! offloaded binary's code objects loaded through the loader for each
//! target, and `verify --tree` of `torch/`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::args;
use crate::context::Ctx;
use crate::measure::{resident, timed, tree_size, warm, Runs};
use crate::report::Row;
use kpack_testkit::inputs::rocm::{host_libraries, ROCRAND};
use kpack_testkit::tree::remove;

const HOST_LIBRARIES: usize = 280;
const OFFLOADED: usize = 20;

section!(
    "doctor",
    "kpack doctor over a site-packages of 300 binaries",
    run
);

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    if !Path::new(ROCRAND.path).is_file() {
        return Ok(vec![Row::not_installed(
            NAME,
            "doctor",
            "kpack doctor",
            ROCRAND.path,
        )]);
    }
    let dir = ctx.work.join(NAME);
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let site = site_packages(ctx, &dir)?;
    warm(&[&site])?;
    let targets = [
        "gfx1030",
        "gfx803",
        "gfx900:xnack-",
        "gfx906:sramecc+:xnack-",
        "gfx908:sramecc+:xnack-",
        "gfx90a:sramecc+:xnack+",
        "gfx90a:sramecc+:xnack-",
    ];
    let mut rows = Vec::new();
    for (id, archs) in [("doctor_1", &targets[..1]), ("doctor_7", &targets[..])] {
        let mut args = args!["doctor", &site, "--json"].to_vec();
        for a in archs {
            args.extend(args!["--arch", a]);
        }
        let mut runs = Runs::default();
        for rep in 0..ctx.reps {
            eprintln!("  {id}, rep {}/{}", rep + 1, ctx.reps);
            let r = resident(&[&site]);
            runs.push(timed(&ctx.kpack, &args, &dir)?, r);
        }
        let work = format!(
            "kpack doctor, {} target(s), over a site-packages of {} binaries ({OFFLOADED} offloaded)",
            archs.len(),
            HOST_LIBRARIES + OFFLOADED
        );
        let mut row = Row::new(NAME, id, work);
        runs.fill(&mut row);
        row.bytes_in = Some(tree_size(&site));
        rows.push(row);
    }
    if !ctx.keep_work {
        remove(&dir)?;
    }
    Ok(rows)
}

/// `dir/site` laid out as described in the module's documentation.
fn site_packages(ctx: &Ctx, dir: &Path) -> Result<PathBuf> {
    let input = dir.join("in/torch/lib");
    std::fs::create_dir_all(&input)?;
    for (i, lib) in host_libraries(HOST_LIBRARIES)?.iter().enumerate() {
        let name = lib.file_name().context("a file name")?;
        std::fs::copy(
            lib,
            input.join(format!("{i:03}-{}", name.to_string_lossy())),
        )?;
    }
    for i in 0..OFFLOADED {
        std::fs::copy(ROCRAND.path, input.join(format!("librocrand_{i}.so")))?;
    }
    let site = dir.join("site");
    let torch = site.join("torch");
    let a = args![
        "pack-tree",
        "--input",
        dir.join("in/torch"),
        "--output",
        &torch,
        "--group-name",
        "torch"
    ];
    timed(&ctx.kpack, &a, dir)?;
    let info = site.join("torch-2.10.0.dist-info");
    std::fs::create_dir_all(&info)?;
    std::fs::write(
        info.join("METADATA"),
        "Metadata-Version: 2.4\nName: torch\nVersion: 2.10.0\n",
    )?;
    let mut record = String::new();
    for f in crate::measure::files_under(&torch) {
        let rel = f.strip_prefix(&site)?;
        record.push_str(&format!("{},,\n", rel.display()));
    }
    std::fs::write(info.join("RECORD"), record)?;
    Ok(site)
}
