//! Walking directory trees in sorted order, and copying their entries
//! (symlinks as symlinks, file modes kept).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{ArtifactError, Result};

/// One entry below a root directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Path relative to the root.
    pub rel: PathBuf,
    pub kind: NodeKind,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    Dir,
    /// A symbolic link and its target, as written.
    Symlink(PathBuf),
    File {
        size: u64,
    },
}

impl Node {
    /// The relative path with `/` separators (file names must be UTF-8).
    pub(crate) fn rel_str(&self, root: &Path) -> Result<String> {
        rel_string(&self.rel).ok_or_else(|| {
            ArtifactError::input(root.join(&self.rel), "file name is not valid UTF-8")
        })
    }
}

pub(crate) fn rel_string(rel: &Path) -> Option<String> {
    let parts: Option<Vec<&str>> = rel.components().map(|c| c.as_os_str().to_str()).collect();
    Some(parts?.join("/"))
}

/// Every entry below `root` (not `root` itself), depth first, each
/// directory's entries sorted by name: the order does not depend on the
/// file system. Symlinks are not followed. Sockets, FIFOs and devices are
/// an error.
pub(crate) fn scan(root: &Path) -> Result<Vec<Node>> {
    let mut out = Vec::new();
    scan_into(root, Path::new(""), &mut out)?;
    Ok(out)
}

fn scan_into(root: &Path, rel: &Path, out: &mut Vec<Node>) -> Result<()> {
    let dir = root.join(rel);
    let mut entries = Vec::new();
    for e in fs::read_dir(&dir).map_err(|e| ArtifactError::io(&dir, e))? {
        let e = e.map_err(|e| ArtifactError::io(&dir, e))?;
        entries.push(e.file_name());
    }
    entries.sort();
    for name in entries {
        let rel = rel.join(&name);
        let path = root.join(&rel);
        let meta = fs::symlink_metadata(&path).map_err(|e| ArtifactError::io(&path, e))?;
        let ty = meta.file_type();
        let mode = meta.permissions().mode() & 0o7777;
        if ty.is_symlink() {
            let target = fs::read_link(&path).map_err(|e| ArtifactError::io(&path, e))?;
            out.push(Node {
                rel,
                kind: NodeKind::Symlink(target),
                mode,
            });
        } else if ty.is_dir() {
            out.push(Node {
                rel: rel.clone(),
                kind: NodeKind::Dir,
                mode,
            });
            scan_into(root, &rel, out)?;
        } else if ty.is_file() {
            out.push(Node {
                rel,
                kind: NodeKind::File { size: meta.len() },
                mode,
            });
        } else {
            let what = if ty.is_fifo() {
                "a FIFO"
            } else if ty.is_socket() {
                "a socket"
            } else {
                "a device file"
            };
            return Err(ArtifactError::input(
                path,
                format!("{what}: artifacts may hold only files, directories and symlinks"),
            ));
        }
    }
    Ok(())
}

/// Create `dir` and its missing parents (mode 0755 less the umask).
pub(crate) fn make_dirs(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| ArtifactError::io(dir, e))
}

/// Remove whatever is at `dst` (not a directory), if anything: a copy
/// over an existing file would write through it and then fail to set the
/// mode of a file another user owns (EPERM), or fail to open a read-only
/// one; a new file is ours.
fn unlink(dst: &Path) -> Result<()> {
    match fs::remove_file(dst) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ArtifactError::io(dst, e)),
        _ => Ok(()),
    }
}

/// Copy a regular file, keeping its permission bits. An existing `dst` is
/// unlinked first.
pub fn copy_file(src: &Path, dst: &Path, mode: u32) -> Result<u64> {
    if let Some(p) = dst.parent() {
        make_dirs(p)?;
    }
    unlink(dst)?;
    let n = fs::copy(src, dst).map_err(|e| ArtifactError::io(dst, e))?;
    fs::set_permissions(dst, fs::Permissions::from_mode(mode))
        .map_err(|e| ArtifactError::io(dst, e))?;
    Ok(n)
}

/// Create `dst` with this mode (an existing one is unlinked first), open
/// for reading and writing, and fill it with `f`.
pub fn create_file<T>(
    dst: &Path,
    mode: u32,
    f: impl FnOnce(&mut fs::File) -> Result<T>,
) -> Result<T> {
    if let Some(p) = dst.parent() {
        make_dirs(p)?;
    }
    unlink(dst)?;
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(|e| ArtifactError::io(dst, e))?;
    let value = f(&mut file)?;
    fs::set_permissions(dst, fs::Permissions::from_mode(mode))
        .map_err(|e| ArtifactError::io(dst, e))?;
    Ok(value)
}

/// Create a symlink `dst` → `target` (the target as written, not
/// resolved); an existing `dst` is unlinked first.
pub(crate) fn copy_symlink(target: &Path, dst: &Path) -> Result<()> {
    if let Some(p) = dst.parent() {
        make_dirs(p)?;
    }
    unlink(dst)?;
    std::os::unix::fs::symlink(target, dst).map_err(|e| ArtifactError::io(dst, e))
}

/// Give a staged artifact directory write permission for its owner until
/// it is renamed into the output directory: renaming a directory into
/// another needs write permission on it, even for its owner, so a staged
/// copy of a read-only input artifact could otherwise not be moved. After
/// the rename, [`copy_mode`] gives it the input's mode.
pub(crate) fn owner_writable(dir: &Path) -> Result<()> {
    let mode = fs::metadata(dir)
        .map_err(|e| ArtifactError::io(dir, e))?
        .permissions()
        .mode();
    fs::set_permissions(dir, fs::Permissions::from_mode(mode | 0o700))
        .map_err(|e| ArtifactError::io(dir, e))
}

/// Give `dst` the permission bits of `src`.
pub(crate) fn copy_mode(src: &Path, dst: &Path) -> Result<()> {
    let mode = fs::metadata(src)
        .map_err(|e| ArtifactError::io(src, e))?
        .permissions()
        .mode()
        & 0o7777;
    fs::set_permissions(dst, fs::Permissions::from_mode(mode))
        .map_err(|e| ArtifactError::io(dst, e))
}

/// Give `out` and every directory below it the mode of the directory at
/// the same relative path below `src`, where that exists. Run after
/// everything is written (a read-only directory would block writes into
/// it).
pub(crate) fn copy_dir_modes(out: &Path, src: &Path) -> Result<()> {
    let mut dirs = vec![PathBuf::new()];
    collect_dirs(out, Path::new(""), &mut dirs)?;
    // Deepest first, so that a directory without write permission for its
    // owner is changed after its children.
    for rel in dirs.iter().rev() {
        let s = src.join(rel);
        if let Ok(meta) = fs::symlink_metadata(&s) {
            if meta.is_dir() {
                let mode = meta.permissions().mode() & 0o7777;
                let d = out.join(rel);
                fs::set_permissions(&d, fs::Permissions::from_mode(mode))
                    .map_err(|e| ArtifactError::io(&d, e))?;
            }
        }
    }
    Ok(())
}

fn collect_dirs(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let dir = root.join(rel);
    let mut names = Vec::new();
    for e in fs::read_dir(&dir).map_err(|e| ArtifactError::io(&dir, e))? {
        let e = e.map_err(|e| ArtifactError::io(&dir, e))?;
        if e.file_type()
            .map_err(|err| ArtifactError::io(e.path(), err))?
            .is_dir()
        {
            names.push(e.file_name());
        }
    }
    names.sort();
    for n in names {
        let r = rel.join(n);
        out.push(r.clone());
        collect_dirs(root, &r, out)?;
    }
    Ok(())
}

/// Copy a whole tree (symlinks as symlinks, modes kept) to `dst`, which
/// must not exist. Returns the bytes of regular files copied.
pub fn copy_tree(src: &Path, dst: &Path) -> Result<u64> {
    make_dirs(dst)?;
    let mut bytes = 0;
    for node in scan(src)? {
        let (s, d) = (src.join(&node.rel), dst.join(&node.rel));
        match &node.kind {
            NodeKind::Dir => make_dirs(&d)?,
            NodeKind::Symlink(t) => copy_symlink(t, &d)?,
            NodeKind::File { .. } => bytes += copy_file(&s, &d, node.mode)?,
        }
    }
    copy_dir_modes(dst, src)?;
    Ok(bytes)
}

/// Total size of the regular files below `dir`.
pub(crate) fn tree_bytes(dir: &Path) -> Result<u64> {
    Ok(scan(dir)?
        .iter()
        .map(|n| match n.kind {
            NodeKind::File { size } => size,
            _ => 0,
        })
        .sum())
}

/// Do two files have the same bytes? Compared in chunks, without reading
/// either whole into memory.
pub fn same_bytes(a: &Path, b: &Path) -> Result<bool> {
    use std::io::Read;
    let (ma, mb) = (
        fs::metadata(a).map_err(|e| ArtifactError::io(a, e))?,
        fs::metadata(b).map_err(|e| ArtifactError::io(b, e))?,
    );
    if ma.len() != mb.len() {
        return Ok(false);
    }
    let mut fa = fs::File::open(a).map_err(|e| ArtifactError::io(a, e))?;
    let mut fb = fs::File::open(b).map_err(|e| ArtifactError::io(b, e))?;
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = read_full(&mut fa, &mut ba).map_err(|e| ArtifactError::io(a, e))?;
        let m = read_full(&mut fb, &mut bb).map_err(|e| ArtifactError::io(b, e))?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }

    fn read_full(f: &mut fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match f.read(&mut buf[n..])? {
                0 => break,
                k => n += k,
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Set in the child process of [`copy_over_another_users_file`]: the
    /// directory to copy in.
    const AS_OTHER_USER: &str = "KPACK_TEST_COPY_AS_OTHER_USER";
    const OTHER_UID: u32 = 4242;

    /// A destination that exists and belongs to a third user (writable by
    /// all, as in a shared build tree) is replaced by a file of the user
    /// copying: `fs::copy` alone writes through it and then fails to set
    /// its mode (EPERM). Run as a real non-root user (setpriv) when the
    /// tests run as root; otherwise over a read-only file of our own
    /// (which `fs::copy` alone cannot open).
    /// What offloading writes a binary with: [`create_file`].
    fn write_new(dst: &Path, bytes: &[u8], mode: u32) {
        use std::io::Write;
        create_file(dst, mode, |f| {
            f.write_all(bytes).map_err(|e| ArtifactError::io(dst, e))
        })
        .unwrap();
    }

    #[test]
    fn copy_over_another_users_file() {
        if let Some(dir) = std::env::var_os(AS_OTHER_USER) {
            let dir = Path::new(&dir);
            copy_file(&dir.join("src"), &dir.join("dst"), 0o640).unwrap();
            write_new(&dir.join("dst2"), b"new", 0o600);
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("tree");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("src"), b"the new bytes").unwrap();
        fs::write(dir.join("dst"), b"old").unwrap();
        fs::write(dir.join("dst2"), b"old").unwrap();
        let root = is_root(&dir);
        if root {
            use std::os::unix::fs::chown;
            fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
            chown(&dir, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
            for f in ["dst", "dst2"] {
                chown(dir.join(f), Some(OTHER_UID + 1), Some(OTHER_UID + 1)).unwrap();
                fs::set_permissions(dir.join(f), fs::Permissions::from_mode(0o666)).unwrap();
            }
            fs::set_permissions(dir.join("src"), fs::Permissions::from_mode(0o644)).unwrap();
            let exe = std::env::current_exe().unwrap();
            let out = std::process::Command::new("setpriv")
                .args([
                    "--reuid",
                    &OTHER_UID.to_string(),
                    "--regid",
                    &OTHER_UID.to_string(),
                ])
                .arg("--clear-groups")
                .arg(exe)
                .args(["--exact", "tree::tests::copy_over_another_users_file"])
                .env(AS_OTHER_USER, &dir)
                .output()
                .expect("setpriv (util-linux)");
            assert!(
                out.status.success(),
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            for f in ["dst", "dst2"] {
                assert_eq!(fs::metadata(dir.join(f)).unwrap().uid(), OTHER_UID, "{f}");
            }
        } else {
            for f in ["dst", "dst2"] {
                fs::set_permissions(dir.join(f), fs::Permissions::from_mode(0o444)).unwrap();
            }
            copy_file(&dir.join("src"), &dir.join("dst"), 0o640).unwrap();
            write_new(&dir.join("dst2"), b"new", 0o600);
        }
        assert_eq!(fs::read(dir.join("dst")).unwrap(), b"the new bytes");
        assert_eq!(fs::metadata(dir.join("dst")).unwrap().mode() & 0o777, 0o640);
        assert_eq!(fs::read(dir.join("dst2")).unwrap(), b"new");
        assert_eq!(
            fs::metadata(dir.join("dst2")).unwrap().mode() & 0o777,
            0o600
        );
    }

    /// Are we root? (The owner of a file we just created.)
    fn is_root(dir: &Path) -> bool {
        fs::metadata(dir).unwrap().uid() == 0
    }

    #[test]
    fn scan_is_sorted_and_keeps_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        for n in ["b", "a", "c"] {
            fs::create_dir(r.join(n)).unwrap();
            fs::write(r.join(n).join("z"), n).unwrap();
            fs::write(r.join(n).join("y"), n).unwrap();
        }
        std::os::unix::fs::symlink("a/z", r.join("link")).unwrap();
        let rels: Vec<String> = scan(r)
            .unwrap()
            .iter()
            .map(|n| rel_string(&n.rel).unwrap())
            .collect();
        assert_eq!(
            rels,
            ["a", "a/y", "a/z", "b", "b/y", "b/z", "c", "c/y", "c/z", "link"]
        );
        let o = tempfile::tempdir().unwrap();
        let out = o.path().join("copy");
        copy_tree(r, &out).unwrap();
        assert_eq!(fs::read_link(out.join("link")).unwrap(), Path::new("a/z"));
        assert_eq!(fs::read(out.join("b/y")).unwrap(), b"b");
        kpack_host::output::remove_tree(&out).unwrap();
    }
}
