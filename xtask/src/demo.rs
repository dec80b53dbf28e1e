//! `cargo xtask demo`: the kpack CLI on the committed sample fat binary.
//! Needs nothing but cargo.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::cargo;
use crate::fixtures::{SAMPLE, SAMPLE_DIR};

pub fn run(sh: &Shell, root: &Path) -> Result<()> {
    let sample = format!("{SAMPLE_DIR}/{}", SAMPLE.name);
    ensure!(
        sh.path_exists(&sample),
        "{sample} is missing (regenerate it with `cargo xtask fixtures --refresh-sample`)"
    );
    let cargo = cargo();
    banner("building kpack (cargo build --package kpack-cli)");
    cmd!(sh, "{cargo} build --quiet --package kpack-cli --bin kpack")
        .quiet()
        .run()?;
    let kpack = target_dir(sh)?.join("debug").join("kpack");
    let out = target_dir(sh)?.join("demo");
    if sh.path_exists(&out) {
        sh.remove_path(&out)?;
    }

    banner(&format!("kpack ls {sample}"));
    cmd!(sh, "{kpack} ls {sample}").quiet().run()?;

    let shown_out = out.strip_prefix(root).unwrap_or(&out).display().to_string();
    banner(&format!("kpack extract {sample} -o {shown_out}"));
    cmd!(sh, "{kpack} extract {sample} -o {out}")
        .quiet()
        .run()?;

    banner(&format!("files in {shown_out}"));
    let mut files = Vec::new();
    walk(&out, &mut files)?;
    files.sort();
    let mut total = 0;
    for (path, size) in &files {
        let shown = path.strip_prefix(&out).unwrap_or(path);
        println!("{size:>10}  {}", shown.display());
        total += size;
    }
    println!("{total:>10}  total in {} files", files.len());
    let sample_size = std::fs::metadata(root.join(&sample))?.len();
    println!("{sample_size:>10}  {sample} (input)");
    Ok(())
}

fn banner(text: &str) {
    println!("\n== {text}");
}

/// The workspace's target directory, as cargo resolves it.
fn target_dir(sh: &Shell) -> Result<PathBuf> {
    let cargo = cargo();
    let metadata = cmd!(sh, "{cargo} metadata --format-version 1 --no-deps")
        .quiet()
        .read()?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata)?;
    let dir = metadata["target_directory"]
        .as_str()
        .context("cargo metadata has no target_directory")?;
    Ok(PathBuf::from(dir))
}

fn walk(dir: &Path, files: &mut Vec<(PathBuf, u64)>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            walk(&entry.path(), files)?;
        } else {
            files.push((entry.path(), meta.len()));
        }
    }
    Ok(())
}
