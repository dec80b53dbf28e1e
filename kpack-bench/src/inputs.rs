//! The bench's inputs: Debian's ROCm libraries ([`ROCRAND`],
//! [`ROCSPARSE`]), laid out as split inputs ([`make_artifact`]), their
//! device code as files ([`write_device_code`]); placing and removing
//! files.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A library measured.
pub struct Lib {
    /// Section of the table (`rocsparse`).
    pub section: &'static str,
    /// Its name in the table (`librocsparse`).
    pub name: &'static str,
    pub path: &'static str,
    /// The split input: one artifact holding the library.
    pub artifact: &'static str,
    pub artifact_prefix: &'static str,
    /// Symlinks next to the library in the artifact: (name, target).
    pub links: &'static [(&'static str, &'static str)],
    /// Peak RSS limit of split, MiB, if any.
    pub split_rss_limit_mib: Option<f64>,
    /// Limit of the offload transform alone, seconds, if any.
    pub transform_limit_s: Option<f64>,
    /// Runs per `--reps` (more for a small library: its runs take tens of
    /// milliseconds, where a busy machine's noise is large).
    pub rep_factor: usize,
    /// Also split with `--gpu-targets` these (TheRock's per-shard split),
    /// which must cost no more than the full split.
    pub gpu_targets: &'static [&'static str],
}

pub const ROCRAND: Lib = Lib {
    section: "rocrand",
    name: "librocrand",
    path: "/usr/lib/x86_64-linux-gnu/librocrand.so.1.1",
    artifact: "rand_lib_gfx-all",
    artifact_prefix: "rand_lib",
    links: &[("librocrand.so.1", "librocrand.so.1.1")],
    split_rss_limit_mib: None,
    transform_limit_s: None,
    rep_factor: 3,
    gpu_targets: &[],
};

pub const ROCSPARSE: Lib = Lib {
    section: "rocsparse",
    name: "librocsparse",
    path: "/usr/lib/x86_64-linux-gnu/librocsparse.so.0.1",
    artifact: "sparse_lib_gfx-all",
    artifact_prefix: "sparse_lib",
    links: &[("librocsparse.so.0", "librocsparse.so.0.1")],
    split_rss_limit_mib: Some(256.0),
    transform_limit_s: Some(0.2),
    rep_factor: 1,
    gpu_targets: &["gfx90a", "gfx1030"],
};

impl Lib {
    pub fn file_name(&self) -> &'static str {
        self.path.rsplit('/').next().unwrap_or(self.path)
    }
}

/// Lay out the split input: `<dir>/<artifact>/artifact_manifest.txt` and
/// `stage/lib/<library>` (a hard link to the system file) with its links.
pub fn make_artifact(lib: &Lib, dir: &Path) -> Result<PathBuf> {
    let a = dir.join(lib.artifact);
    std::fs::create_dir_all(a.join("stage/lib"))?;
    std::fs::write(a.join("artifact_manifest.txt"), "stage\n")?;
    link_or_copy(
        Path::new(lib.path),
        &a.join("stage/lib").join(lib.file_name()),
    )?;
    for (name, target) in lib.links {
        let at = a.join("stage/lib").join(name);
        remove(&at)?;
        std::os::unix::fs::symlink(target, &at)?;
    }
    Ok(a)
}

/// Write the device code of `input` twice: to `out`, its code objects
/// concatenated in the order the per-target archives hold them (by target,
/// then bundle), and into `files`, one file per code object
/// (`<target>#<bundle>.hsaco`, as `kpack extract` names them). Returns
/// its size and the file names.
pub fn write_device_code(input: &Path, out: &Path, files: &Path) -> Result<(u64, Vec<String>)> {
    let mapped = kpack_loader::map_file(input)?;
    let mut cos = kpack_host::offload::code_objects(input, &mapped)?;
    cos.sort_by(|a, b| (&a.target, a.bundle).cmp(&(&b.target, b.bundle)));
    std::fs::create_dir_all(files)?;
    let mut w = BufWriter::with_capacity(8 << 20, File::create(out)?);
    let mut n = 0u64;
    let mut names = Vec::new();
    for co in &cos {
        w.write_all(&co.data)?;
        let name = format!("{}#{}.hsaco", co.target, co.bundle);
        std::fs::write(files.join(&name), &*co.data)?;
        names.push(name);
        n += co.data.len() as u64;
        mapped.release_slice(&co.data);
    }
    w.flush()?;
    Ok((n, names))
}

/// Remove `path` (file or tree) if it exists.
pub fn remove(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            std::fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
        }
        Ok(_) => std::fs::remove_file(path).with_context(|| format!("removing {}", path.display())),
        Err(_) => Ok(()),
    }
}

/// Hard-link `src` at `dst` (same file system), else copy it.
pub fn link_or_copy(src: &Path, dst: &Path) -> Result<()> {
    if let Some(d) = dst.parent() {
        std::fs::create_dir_all(d)?;
    }
    remove(dst)?;
    if std::fs::hard_link(src, dst).is_err() {
        std::fs::copy(src, dst)
            .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    }
    Ok(())
}
