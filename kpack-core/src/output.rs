//! Crash-safe output: every file kpack writes is written to a temporary file
//! in the destination directory and renamed into place only when complete, so
//! an error or an interrupted run never leaves a partial file under the final
//! name. Renaming also replaces the destination's directory entry instead of
//! writing through it, so a hard-linked destination is never modified.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result, WithPath};

/// The directory a path's file lives in (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Write `path` atomically: `f` fills a temporary file beside it, which is
/// flushed and renamed over `path` only if `f` succeeds. The file gets mode
/// 0666 less the umask, like any newly created file.
pub fn write_atomically(path: &Path, f: impl FnOnce(&mut File) -> io::Result<()>) -> Result<()> {
    write_atomically_with_mode(path, None, f)
}

/// [`write_atomically`] with an explicit file mode (Unix permission bits),
/// e.g. to keep the input's mode when rewriting a binary.
pub fn write_atomically_with_mode(
    path: &Path,
    mode: Option<u32>,
    f: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = parent_dir(path);
    let mut tmp = tempfile::Builder::new()
        .prefix(".kpack-tmp-")
        .permissions(fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .with_path(path)?;
    if let Some(mode) = mode {
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(mode)).with_path(path)?;
    }
    f(tmp.as_file_mut()).with_path(path)?;
    tmp.as_file_mut().flush().with_path(path)?;
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// Write bytes to `path` atomically.
pub fn write_file_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomically(path, |f| f.write_all(bytes))
}

/// A directory assembled under a temporary name beside its final path and
/// renamed into place by [`StagedDir::commit`]. Dropped without commit, it is
/// removed with everything in it.
pub struct StagedDir {
    tmp: Option<tempfile::TempDir>,
    dest: PathBuf,
}

impl StagedDir {
    /// Stage a directory that will become `dest` (which must not exist yet
    /// when committing, unless `commit_merge` is used).
    pub fn new(dest: &Path) -> Result<Self> {
        let parent = parent_dir(dest);
        fs::create_dir_all(parent).with_path(parent)?;
        let tmp = tempfile::Builder::new()
            .prefix(".kpack-staging-")
            .tempdir_in(parent)
            .with_path(parent)?;
        Ok(StagedDir {
            tmp: Some(tmp),
            dest: dest.to_path_buf(),
        })
    }

    /// Where to write the contents meanwhile.
    pub fn path(&self) -> &Path {
        self.tmp.as_ref().map(|t| t.path()).unwrap_or(&self.dest)
    }

    /// Move the staged contents to the destination. A destination that does
    /// not exist is created by one rename; into an existing directory each
    /// staged entry is renamed in turn (replacing files of the same name).
    pub fn commit(mut self) -> Result<PathBuf> {
        let tmp = self.tmp.take().expect("StagedDir committed twice");
        let staged = tmp.keep();
        let result = if !self.dest.exists() {
            fs::rename(&staged, &self.dest).with_path(&self.dest)
        } else {
            merge_into(&staged, &self.dest)
        };
        let _ = fs::remove_dir_all(&staged);
        result.map(|()| self.dest.clone())
    }
}

fn merge_into(from: &Path, to: &Path) -> Result<()> {
    for entry in fs::read_dir(from).with_path(from)? {
        let entry = entry.with_path(from)?;
        let target = to.join(entry.file_name());
        let ty = entry.file_type().with_path(entry.path())?;
        if ty.is_dir() && target.is_dir() {
            merge_into(&entry.path(), &target)?;
        } else {
            fs::rename(entry.path(), &target).with_path(&target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.bin");
        let r = write_atomically(&p, |f| {
            f.write_all(b"partial")?;
            Err(io::Error::other("boom"))
        });
        assert!(r.is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn replaces_hard_link_instead_of_writing_through() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        fs::write(&a, b"original").unwrap();
        fs::hard_link(&a, &b).unwrap();
        write_file_atomically(&b, b"new").unwrap();
        assert_eq!(fs::read(&a).unwrap(), b"original");
        assert_eq!(fs::read(&b).unwrap(), b"new");
    }

    #[test]
    fn staged_dir_vanishes_without_commit() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("d");
        {
            let s = StagedDir::new(&dest).unwrap();
            fs::write(s.path().join("x"), b"1").unwrap();
        }
        assert!(!dest.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        let s = StagedDir::new(&dest).unwrap();
        fs::write(s.path().join("x"), b"1").unwrap();
        s.commit().unwrap();
        assert_eq!(fs::read(dest.join("x")).unwrap(), b"1");
    }
}
