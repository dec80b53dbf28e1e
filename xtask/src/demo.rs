//! `cargo xtask demo`: the kpack CLI on the committed sample fat binary:
//! list it, extract it, offload it, and resolve the offloaded binary's code
//! objects back through its archives.
//! Needs nothing but cargo.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use kpack_testkit::fixtures::{SAMPLE, SAMPLE_DIR};
use xshell::{cmd, Shell};

use crate::{debug_kpack, target_dir};

pub fn run(sh: &Shell, root: &Path) -> Result<()> {
    let sample = format!("{SAMPLE_DIR}/{}", SAMPLE.name);
    ensure!(
        sh.path_exists(&sample),
        "{sample} is missing (regenerate it with `cargo xtask fixtures --refresh-sample`)"
    );
    banner("building kpack (cargo build --package kpack-cli)");
    let kpack = debug_kpack(sh)?;
    let out = target_dir(sh)?.join("demo");
    if sh.path_exists(&out) {
        sh.remove_path(&out)?;
    }
    let shown_out = out.strip_prefix(root).unwrap_or(&out).display().to_string();
    let demo = Demo {
        sh,
        kpack,
        sample,
        out,
        shown_out,
    };
    let extracted = demo.ls_and_extract()?;
    let host = demo.offload()?;
    demo.resolve(&host, &extracted)?;
    demo.list_files(root, &host)
}

/// The demo's commands: kpack, the sample, and where the outputs go (`out`,
/// shown as `shown_out`).
struct Demo<'a> {
    sh: &'a Shell,
    kpack: PathBuf,
    sample: String,
    out: PathBuf,
    shown_out: String,
}

impl Demo<'_> {
    /// `kpack ls` and `kpack extract` of the sample; the extracted code
    /// objects' directory.
    fn ls_and_extract(&self) -> Result<PathBuf> {
        let Demo {
            sh, kpack, sample, ..
        } = self;
        banner(&format!("kpack ls {sample}"));
        cmd!(sh, "{kpack} ls {sample}").quiet().run()?;
        let extracted = self.out.join("extracted");
        banner(&format!(
            "kpack extract {sample} -o {}/extracted",
            self.shown_out
        ));
        cmd!(sh, "{kpack} extract {sample} -o {extracted}")
            .quiet()
            .run()?;
        Ok(extracted)
    }

    /// The main job: device code into per-target archives, host-only
    /// binary; then `ls` and `verify-elf` of that binary, which it returns.
    fn offload(&self) -> Result<PathBuf> {
        let Demo {
            sh,
            kpack,
            sample,
            shown_out,
            ..
        } = self;
        let host = self.out.join("lib").join(SAMPLE.name);
        let archives = self.out.join(".kpack");
        banner(&format!(
            "kpack offload {sample} -o {shown_out}/lib/{} --archive-dir {shown_out}/.kpack",
            SAMPLE.name
        ));
        cmd!(
            sh,
            "{kpack} offload {sample} -o {host} --archive-dir {archives}"
        )
        .quiet()
        .run()?;
        banner(&format!("kpack ls {shown_out}/lib/{}", SAMPLE.name));
        cmd!(sh, "{kpack} ls {host}").quiet().run()?;
        banner(&format!("kpack verify-elf {shown_out}/lib/{}", SAMPLE.name));
        cmd!(sh, "{kpack} verify-elf {host}").quiet().run()?;
        Ok(host)
    }

    /// `kpack extract` of the offloaded `host` (through its metadata and
    /// archives): every code object must equal the one in `extracted`.
    fn resolve(&self, host: &Path, extracted: &Path) -> Result<()> {
        let Demo {
            sh,
            kpack,
            shown_out,
            ..
        } = self;
        let resolved = self.out.join("resolved");
        banner(&format!(
            "kpack extract {shown_out}/lib/{} -o {shown_out}/resolved   (through its metadata and archives)",
            SAMPLE.name
        ));
        cmd!(sh, "{kpack} extract {host} -o {resolved}")
            .quiet()
            .run()?;
        for entry in std::fs::read_dir(extracted)? {
            let name = entry?.file_name();
            let a = std::fs::read(extracted.join(&name))?;
            let b = std::fs::read(resolved.join(&name))
                .with_context(|| format!("{} not resolved", name.to_string_lossy()))?;
            ensure!(
                a == b,
                "{} differs after the round trip",
                name.to_string_lossy()
            );
        }
        println!("every code object resolved through the archives is identical to the original");
        Ok(())
    }

    /// The files written, with their sizes, then the sizes of the sample
    /// and of the host-only output.
    fn list_files(&self, root: &Path, host: &Path) -> Result<()> {
        let Demo {
            sample,
            out,
            shown_out,
            ..
        } = self;
        banner(&format!("files in {shown_out}"));
        let mut files = Vec::new();
        walk(out, &mut files)?;
        files.sort();
        for (path, size) in &files {
            let shown = path.strip_prefix(out).unwrap_or(path);
            println!("{size:>10}  {}", shown.display());
        }
        let sample_size = std::fs::metadata(root.join(sample))?.len();
        let host_size = std::fs::metadata(host)?.len();
        println!("\n{sample_size:>10}  {sample} (input)");
        println!(
            "{host_size:>10}  {shown_out}/lib/{} (host-only output)",
            SAMPLE.name
        );
        Ok(())
    }
}

fn banner(text: &str) {
    println!("\n== {text}");
}

/// The workspace's target directory, as cargo resolves it.
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
