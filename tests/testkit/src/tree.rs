//! Directory trees: laying files out with their modes, and snapshots for
//! comparing trees.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result};

/// Remove `path` (file, symlink or tree) if it exists.
pub fn remove(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
        }
        Ok(_) => fs::remove_file(path).with_context(|| format!("removing {}", path.display())),
        Err(_) => Ok(()),
    }
}

/// Hard-link `src` at `dst` (creating its directory, replacing what is
/// there) when both are on one file system, else copy it.
pub fn link_or_copy(src: &Path, dst: &Path) -> Result<()> {
    if let Some(d) = dst.parent() {
        fs::create_dir_all(d)?;
    }
    remove(dst)?;
    if fs::hard_link(src, dst).is_err() {
        fs::copy(src, dst)
            .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    }
    Ok(())
}

/// Every entry below a directory: relative path -> (kind `d`/`f`/`l`,
/// bytes or symlink target, mode; 0 for symlinks).
pub type Snapshot = BTreeMap<String, (char, Vec<u8>, u32)>;

/// Write `bytes` to `path` (creating its directory) with `mode`.
pub fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    fs::create_dir_all(path.parent().context("a path without a parent")?)?;
    fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Copy the file `src` to `dst` (creating its directory) with `mode`.
pub fn copy(src: &Path, dst: &Path, mode: u32) -> Result<()> {
    let bytes = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
    write(dst, &bytes, mode)
}

/// A symlink at `at` (creating its directory) pointing at `target`.
pub fn symlink(target: &str, at: &Path) -> Result<()> {
    fs::create_dir_all(at.parent().context("a path without a parent")?)?;
    std::os::unix::fs::symlink(target, at).with_context(|| format!("linking {}", at.display()))
}

/// Every entry below `dir` (symlinks not followed).
pub fn snapshot(dir: &Path) -> Result<Snapshot> {
    let mut out = Snapshot::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Snapshot) -> Result<()> {
    let mut paths = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        paths.push(e?.path());
    }
    paths.sort();
    for p in paths {
        let rel = p.strip_prefix(root)?.display().to_string();
        let m = fs::symlink_metadata(&p)?;
        let mode = m.permissions().mode() & 0o7777;
        if m.file_type().is_symlink() {
            let target = fs::read_link(&p)?.display().to_string();
            out.insert(rel, ('l', target.into_bytes(), 0));
        } else if m.is_dir() {
            out.insert(rel, ('d', Vec::new(), mode));
            walk(root, &p, out)?;
        } else {
            out.insert(rel, ('f', fs::read(&p)?, mode));
        }
    }
    Ok(())
}

/// Lay out a snapshot below `root` (files with their modes, symlinks as
/// symlinks); an entry that is already there is an error.
pub fn restore(snapshot: &Snapshot, root: &Path) -> Result<()> {
    for (rel, (kind, bytes, mode)) in snapshot {
        let dst = root.join(rel);
        match kind {
            'd' => fs::create_dir_all(&dst)?,
            _ if fs::symlink_metadata(&dst).is_ok() => {
                anyhow::bail!("{rel} is there already")
            }
            'l' => symlink(std::str::from_utf8(bytes)?, &dst)?,
            _ => write(&dst, bytes, *mode)?,
        }
    }
    Ok(())
}
