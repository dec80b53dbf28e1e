//! Crash-safe output, durable on request.
//!
//! - **Files** ([`write_atomically`]) are written to a temporary file in the
//!   destination directory and renamed into place: an error or an
//!   interrupted run (killed included) never leaves a partial file under the
//!   final name. Renaming also replaces the destination's directory entry
//!   instead of writing through it, so a hard-linked destination is never
//!   modified.
//! - **Directories** ([`StagedDir`]) are assembled under a hidden staging
//!   name (`.kpack-staging-*`) on the same file system and renamed into
//!   place (a whole directory, or entries of an existing one in a chosen
//!   order).
//! - **Durability** is off by default, as with build tools (cargo, ninja,
//!   pip): nothing is fsynced, and after a power failure (not after a crash
//!   of kpack) an output may be missing or incomplete. A command that wants
//!   its outputs to survive one opens a [`Durability`] (the `kpack`
//!   command's `--durable` flag, or `KPACK_DURABLE=1` for the command, the
//!   Python API and CMake's `kpack_offload_target`, [`DURABLE_ENV`]): every
//!   output file and directory renamed into place while it is open is
//!   recorded, and [`Durability::commit`], at the end of the command,
//!   fsyncs them all at once: the files in parallel, then each distinct
//!   directory they are in once. An output is durable once the command that
//!   wrote it has returned.
//! - **Leftovers.** Every hidden working directory kpack creates
//!   (`.kpack-staging-*`, and `.kpack-scratch-*` from [`ScratchDir`]), and
//!   every temporary file ([`Pending`], `.kpack-tmp-*`), is held under an
//!   advisory lock (`flock`) by the process using it. A run killed
//!   part-way leaves its directory behind, but the kernel releases the lock
//!   with the process; the next run that stages or scratches in the same
//!   directory (or offloads into it) takes the lock and removes the
//!   leftover ([`sweep_stale`]),
//!   while a directory of a run still in progress stays locked and is left
//!   alone (on a file system without locks, nothing is swept). The artifact
//!   tools skip hidden entries, so a leftover is never mistaken for output.
//!
//! An entry kpack may not open at all (its owner has neither read nor write
//! permission on it) cannot be fsynced; it is skipped.

use std::ffi::OsStr;
use std::fs::{self, File, TryLockError};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result, WithPath};

mod durability;

pub use durability::{durable_from_env, sync_calls, Durability, DURABLE_ENV};
use durability::{record_file, record_tree, recording};

/// Name prefix of staging directories ([`StagedDir`]).
pub const STAGING_PREFIX: &str = ".kpack-staging-";
/// Name prefix of scratch directories ([`ScratchDir`]).
pub const SCRATCH_PREFIX: &str = ".kpack-scratch-";
/// Name prefix of the temporary files of [`write_atomically`].
pub(crate) const TEMP_FILE_PREFIX: &str = ".kpack-tmp-";

/// The directory a path's file lives in (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Write `path` atomically: `f` fills a temporary file beside it, which is
/// renamed over `path` only if `f` succeeds (and recorded for an open
/// [`Durability`]). The file gets mode 0666 less the umask, like any newly
/// created file.
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
    write_atomically_as(path, mode, |file| f(file).with_path(path))
}

/// The one atomic write: `f` fills a temporary file beside `path` (mode
/// `mode`, or 0666 less the umask) and returns what it wants to; the file
/// is flushed and renamed over `path` only if `f` succeeds, then recorded
/// for an open [`Durability`].
pub(crate) fn write_atomically_as<T>(
    path: &Path,
    mode: Option<u32>,
    f: impl FnOnce(&mut File) -> Result<T>,
) -> Result<T> {
    let mut pending = Pending::create(path, mode)?;
    let value = f(pending.file())?;
    pending.commit()?;
    Ok(value)
}

/// A file being written beside `path` (a temporary file in its directory,
/// mode `mode` or 0666 less the umask), renamed over `path` by
/// [`Pending::commit`]; dropped without a commit, it is removed. What
/// [`write_atomically`] does in one call, for a writer that has more to do
/// between filling the file and naming it (offload writes the archives
/// after the binary's bytes are checked, and renames the binary last).
pub struct Pending {
    tmp: tempfile::NamedTempFile,
    path: PathBuf,
}

impl Pending {
    pub fn create(path: &Path, mode: Option<u32>) -> Result<Pending> {
        let tmp = tempfile::Builder::new()
            .prefix(TEMP_FILE_PREFIX)
            .permissions(fs::Permissions::from_mode(0o666))
            .tempfile_in(parent_dir(path))
            .with_path(path)?;
        if let Some(mode) = mode {
            fs::set_permissions(tmp.path(), fs::Permissions::from_mode(mode)).with_path(path)?;
        }
        // Held while it is written, so that a sweep ([`sweep_stale`]) tells
        // it from a killed run's leftover. Only a hint where there are no
        // locks.
        let _ = tmp.as_file().try_lock();
        Ok(Pending {
            tmp,
            path: path.to_path_buf(),
        })
    }

    /// The open file (read and write).
    pub fn file(&mut self) -> &mut File {
        self.tmp.as_file_mut()
    }

    /// Where it goes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flush and rename over the path; with durability on, the file is
    /// recorded, to be fsynced with its directory when the command's
    /// [`Durability`] commits.
    pub fn commit(mut self) -> Result<()> {
        let path = self.path;
        self.tmp.as_file_mut().flush().with_path(&path)?;
        self.tmp
            .persist(&path)
            .map_err(|e| Error::io(&path, e.error))?;
        record_file(&path);
        Ok(())
    }
}

/// Write bytes to `path` atomically.
pub fn write_file_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomically(path, |f| f.write_all(bytes))
}

/// A directory assembled under a hidden, locked staging name and moved into
/// place by one of its `commit` methods. Dropped without commit, it is
/// removed with everything in it.
///
/// - [`StagedDir::new`] stages a whole directory `dest`, beside it;
///   [`commit`](StagedDir::commit) renames it into place (or merges it into
///   an existing `dest`), [`commit_replace`](StagedDir::commit_replace)
///   replaces whatever `dest` was.
/// - [`StagedDir::in_dir`] stages entries for an existing directory, inside
///   it; [`retire`](StagedDir::retire) moves an existing entry out of the
///   way (it is deleted with the staging directory) and
///   [`commit_entries`](StagedDir::commit_entries) renames the staged entries
///   in, in the order given.
///
/// Creating one first removes the leftovers of killed runs in the directory
/// it stages in ([`sweep_stale`]); [`StagedDir::swept`] lists them.
pub struct StagedDir {
    work: WorkDir,
    dest: PathBuf,
    /// The directory the staging directory is in (and `dest`'s entries are
    /// renamed in).
    home: PathBuf,
    /// Entries moved out of the destination, deleted on drop.
    trash: Option<WorkDir>,
    swept: Vec<PathBuf>,
}

impl StagedDir {
    /// Stage a directory that will become `dest`, beside it (its parent is
    /// created if missing).
    pub fn new(dest: &Path) -> Result<Self> {
        Self::stage(dest, parent_dir(dest))
    }

    /// Stage entries that will be renamed into the directory `dir` (created
    /// if missing), inside it.
    pub fn in_dir(dir: &Path) -> Result<Self> {
        Self::stage(dir, dir)
    }

    fn stage(dest: &Path, home: &Path) -> Result<Self> {
        fs::create_dir_all(home).with_path(home)?;
        let swept = sweep_stale(home);
        let work = WorkDir::create(home, STAGING_PREFIX).with_path(home)?;
        Ok(StagedDir {
            work,
            dest: dest.to_path_buf(),
            home: home.to_path_buf(),
            trash: None,
            swept,
        })
    }

    /// Where to write the contents meanwhile.
    pub fn path(&self) -> &Path {
        &self.work.path
    }

    /// Leftover staging and scratch directories of killed runs that were
    /// removed when this one was created.
    pub fn swept(&self) -> &[PathBuf] {
        &self.swept
    }

    /// Move the existing entry `name` of the destination out of the way, to
    /// be deleted with the staging directory (after the commit, or on drop).
    pub fn retire(&mut self, name: impl AsRef<OsStr>) -> Result<()> {
        let from = self.dest.join(name.as_ref());
        let to = self.trash()?.join(name.as_ref());
        fs::rename(&from, &to).with_path(&from)
    }

    fn trash(&mut self) -> Result<&Path> {
        let trash = match self.trash.take() {
            Some(t) => t,
            None => WorkDir::create(&self.home, STAGING_PREFIX).with_path(&self.home)?,
        };
        Ok(&self.trash.insert(trash).path)
    }

    /// Move the staged contents to the destination. A destination that does
    /// not exist is created by one rename; into an existing directory each
    /// staged entry is renamed in turn (replacing files of the same name,
    /// merging directories).
    pub fn commit(mut self) -> Result<PathBuf> {
        if !self.dest.exists() {
            fs::rename(&self.work.path, &self.dest).with_path(&self.dest)?;
            self.work.moved = true;
            record_tree(&self.dest);
        } else {
            merge_into(&self.work.path, &self.dest)?;
        }
        Ok(self.dest.clone())
    }

    /// Move the staged contents to the destination, replacing whatever is
    /// there (moved aside first, deleted after the rename).
    pub fn commit_replace(mut self) -> Result<PathBuf> {
        if self.dest.symlink_metadata().is_ok() {
            let old = self.trash()?.join("old");
            fs::rename(&self.dest, &old).with_path(&self.dest)?;
        }
        fs::rename(&self.work.path, &self.dest).with_path(&self.dest)?;
        self.work.moved = true;
        record_tree(&self.dest);
        Ok(self.dest.clone())
    }

    /// Rename the staged entries `names` into the destination, one by one in
    /// this order (none of them may exist there: [`retire`](Self::retire)
    /// them first). Staged entries not named are deleted.
    pub fn commit_entries<S: AsRef<OsStr>>(self, names: &[S]) -> Result<()> {
        for name in names {
            let dest = self.dest.join(name.as_ref());
            fs::rename(self.work.path.join(name.as_ref()), &dest).with_path(&dest)?;
            record_entry(&dest);
        }
        Ok(())
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
            record_entry(&target);
        }
    }
    Ok(())
}

/// Record an entry renamed into place (a file, or a directory tree) for an
/// open [`Durability`].
fn record_entry(path: &Path) {
    if !recording() {
        return;
    }
    if path.symlink_metadata().is_ok_and(|m| m.is_dir()) {
        record_tree(path);
    } else {
        record_file(path);
    }
}

/// A hidden scratch directory (`.kpack-scratch-*`) for intermediate files:
/// locked while in use, removed on drop. Creating one first removes the
/// leftovers of killed runs in the same directory ([`sweep_stale`]).
pub struct ScratchDir {
    work: WorkDir,
}

impl ScratchDir {
    /// A new scratch directory in `parent` (created if missing).
    pub fn new(parent: &Path) -> Result<Self> {
        fs::create_dir_all(parent).with_path(parent)?;
        sweep_stale(parent);
        let work = WorkDir::create(parent, SCRATCH_PREFIX).with_path(parent)?;
        Ok(ScratchDir { work })
    }

    pub fn path(&self) -> &Path {
        &self.work.path
    }
}

/// A hidden working directory that this process holds locked while it
/// exists; removed on drop unless it was renamed into place.
struct WorkDir {
    path: PathBuf,
    /// The directory itself, opened and locked. Closing it (on drop, or by
    /// the kernel when the process dies) releases the lock.
    _lock: File,
    moved: bool,
}

impl WorkDir {
    fn create(parent: &Path, prefix: &str) -> io::Result<WorkDir> {
        // A sweeper of another run may lock and delete the new directory in
        // the instant before it is locked here: then try another name.
        for _ in 0..16 {
            let path = tempfile::Builder::new()
                .prefix(prefix)
                .tempdir_in(parent)?
                .keep();
            let lock = match claim(&path) {
                Ok(Claim::Locked(dir) | Claim::NoLocks(dir)) => dir,
                Ok(Claim::Busy) => {
                    let _ = fs::remove_dir(&path);
                    continue;
                }
                Err(e) => {
                    let _ = fs::remove_dir(&path);
                    return Err(e);
                }
            };
            return Ok(WorkDir {
                path,
                _lock: lock,
                moved: false,
            });
        }
        Err(io::Error::other(
            "cannot lock a new working directory: it is removed each time by another process",
        ))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.moved {
            let _ = remove_tree(&self.path);
        }
    }
}

/// What [`claim`] got.
enum Claim {
    /// The directory, locked by this process now.
    Locked(File),
    /// A live process holds it (or the name no longer leads to the
    /// directory that was opened).
    Busy,
    /// The file system does not support locks: nobody can tell a live
    /// run's directory from a leftover there, so none is swept.
    NoLocks(File),
}

/// Lock the working directory at `path`.
fn claim(path: &Path) -> io::Result<Claim> {
    let dir = match File::open(path) {
        Ok(d) => d,
        // Removed by a sweeper already.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Claim::Busy),
        Err(e) => return Err(e),
    };
    match dir.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(Claim::Busy),
        Err(TryLockError::Error(_)) => return Ok(Claim::NoLocks(dir)),
    }
    // Between the open and the lock, the directory may have been removed
    // by a sweeper (and the name even reused).
    let (locked, now) = (dir.metadata()?, fs::symlink_metadata(path));
    match now {
        Ok(m) if m.dev() == locked.dev() && m.ino() == locked.ino() => Ok(Claim::Locked(dir)),
        _ => Ok(Claim::Busy),
    }
}

fn is_work_dir_name(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with(STAGING_PREFIX) || name.starts_with(SCRATCH_PREFIX)
}

/// Whether a directory entry is a working directory or a temporary file
/// of [`Pending`] (a file kept by a killed run can be as large as the
/// binary it was becoming).
fn is_leftover_kind(e: &fs::DirEntry) -> bool {
    let Ok(t) = e.file_type() else {
        return false;
    };
    let name = e.file_name();
    (t.is_dir() && is_work_dir_name(&name))
        || (t.is_file() && name.to_string_lossy().starts_with(TEMP_FILE_PREFIX))
}

/// Remove the staging and scratch directories and the temporary files in
/// `dir` that no live process holds (left by killed runs). Returns those
/// removed. Best effort: what cannot be read or removed is left as it is.
pub fn sweep_stale(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        if !is_leftover_kind(&e) {
            continue;
        }
        let path = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        // Removed while holding the lock, so that no run can take it over.
        if let Ok(Claim::Locked(_lock)) = claim(&path) {
            let gone = match is_dir {
                true => remove_tree(&path),
                false => fs::remove_file(&path),
            };
            if gone.is_ok() {
                removed.push(path);
            }
        }
    }
    removed.sort();
    removed
}

/// Is `path` a working directory that a live process holds (a run in
/// progress, as opposed to a leftover of a killed one)?
pub fn in_use(path: &Path) -> bool {
    let Ok(dir) = File::open(path) else {
        return false;
    };
    match dir.try_lock_shared() {
        Ok(()) => false,
        Err(TryLockError::WouldBlock) => true,
        Err(TryLockError::Error(_)) => false,
    }
}

/// Remove a directory tree, making directories without write permission
/// writable first (kpack gives output directories the input's modes).
pub fn remove_tree(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(dir);
            fs::remove_dir_all(dir)
        }
    }
}

fn make_writable(dir: &Path) {
    if let Ok(m) = fs::symlink_metadata(dir) {
        if m.is_dir() {
            let mode = m.permissions().mode() | 0o700;
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(mode));
            for e in fs::read_dir(dir).into_iter().flatten().flatten() {
                make_writable(&e.path());
            }
        }
    }
}

/// Open `path` for fsync: read-only if its mode allows, else write-only;
/// `None` if neither is permitted.
fn open_for_sync(path: &Path) -> io::Result<Option<File>> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            Ok(fs::OpenOptions::new().write(true).open(path).ok())
        }
        Err(e) => Err(e),
    }
}

/// The files and directories below `dir` (symlinks are recorded in their
/// directories).
fn collect_tree(dir: &Path, files: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) -> Result<()> {
    for e in fs::read_dir(dir).with_path(dir)? {
        let e = e.with_path(dir)?;
        let ty = e.file_type().with_path(e.path())?;
        if ty.is_dir() {
            dirs.push(e.path());
            collect_tree(&e.path(), files, dirs)?;
        } else if ty.is_file() {
            files.push(e.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hidden entries of `dir`, sorted.
    fn hidden(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        v.sort();
        v
    }

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
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn staged_dir_merges_into_an_existing_one() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("d");
        fs::create_dir_all(dest.join("sub")).unwrap();
        fs::write(dest.join("keep"), b"k").unwrap();
        fs::write(dest.join("sub/old"), b"o").unwrap();
        let s = StagedDir::new(&dest).unwrap();
        fs::create_dir(s.path().join("sub")).unwrap();
        fs::write(s.path().join("sub/new"), b"n").unwrap();
        fs::write(s.path().join("keep"), b"replaced").unwrap();
        s.commit().unwrap();
        assert_eq!(fs::read(dest.join("keep")).unwrap(), b"replaced");
        assert_eq!(fs::read(dest.join("sub/old")).unwrap(), b"o");
        assert_eq!(fs::read(dest.join("sub/new")).unwrap(), b"n");
        assert!(hidden(dir.path()).is_empty());
    }

    #[test]
    fn commit_replace_swaps_the_whole_directory() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("d");
        fs::create_dir_all(dest.join("ro")).unwrap();
        fs::write(dest.join("ro/old"), b"o").unwrap();
        // Read-only directories in the old tree do not stop its removal.
        fs::set_permissions(dest.join("ro"), fs::Permissions::from_mode(0o555)).unwrap();
        let s = StagedDir::new(&dest).unwrap();
        fs::write(s.path().join("new"), b"n").unwrap();
        s.commit_replace().unwrap();
        assert_eq!(fs::read(dest.join("new")).unwrap(), b"n");
        assert!(!dest.join("ro").exists());
        assert!(hidden(dir.path()).is_empty());
    }

    #[test]
    fn commit_entries_in_order_after_retiring_old_ones() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        fs::create_dir_all(out.join("a")).unwrap();
        fs::write(out.join("a/old"), b"o").unwrap();
        fs::create_dir_all(out.join("gone")).unwrap();
        let mut s = StagedDir::in_dir(&out).unwrap();
        for n in ["a", "b", "unlisted"] {
            fs::create_dir(s.path().join(n)).unwrap();
            fs::write(s.path().join(n).join("new"), n).unwrap();
        }
        s.retire("a").unwrap();
        s.retire("gone").unwrap();
        assert!(!out.join("a").exists());
        s.commit_entries(&["b", "a"]).unwrap();
        let mut names: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(fs::read(out.join("a/new")).unwrap(), b"a");
        assert!(!out.join("a/old").exists());
    }

    /// Set in the child process of `durability_fsyncs_only_when_on`.
    const DURABILITY_CHILD: &str = "KPACK_TEST_DURABILITY_DIR";

    /// Files, a staged tree and entries merged into an existing directory:
    /// with durability off none is fsynced; on, each file and each distinct
    /// directory once, at the commit; a durability dropped without commit
    /// syncs nothing. (In a child process: the fsync count is the
    /// process's.)
    #[test]
    fn durability_fsyncs_only_when_on() {
        if let Some(dir) = std::env::var_os(DURABILITY_CHILD) {
            durability_child(Path::new(&dir));
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "output::tests::durability_fsyncs_only_when_on",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(DURABILITY_CHILD, dir.path())
            .env_remove(DURABLE_ENV)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&status.stderr);
        let out = String::from_utf8_lossy(&status.stdout);
        assert!(status.status.success(), "{out}\n{err}");
        assert!(out.contains("1 passed"), "{out}");
    }

    /// Writes the outputs of one command into `root/<name>`.
    fn write_outputs(root: &Path, name: &str) {
        let dir = root.join(name);
        fs::create_dir_all(dir.join("b")).unwrap();
        for f in ["a/1", "a/2", "b/3"] {
            let p = dir.join(f);
            fs::create_dir_all(parent_dir(&p)).unwrap();
            write_file_atomically(&p, f.as_bytes()).unwrap();
        }
        let s = StagedDir::new(&dir.join("tree")).unwrap();
        fs::create_dir(s.path().join("sub")).unwrap();
        fs::write(s.path().join("x"), b"x").unwrap();
        fs::write(s.path().join("sub/y"), b"y").unwrap();
        s.commit().unwrap();
        let mut s = StagedDir::in_dir(&dir.join("b")).unwrap();
        fs::write(s.path().join("4"), b"4").unwrap();
        s.retire("3").unwrap();
        fs::write(s.path().join("3"), b"new").unwrap();
        s.commit_entries(&["3", "4"]).unwrap();
    }

    fn durability_child(root: &Path) {
        let before = sync_calls();
        let off = Durability::begin(false);
        write_outputs(root, "off");
        assert_eq!(off.commit().unwrap(), 0);
        write_outputs(root, "none-open");
        assert_eq!(sync_calls(), before, "fsync with durability off");

        let on = Durability::begin(true);
        write_outputs(root, "on");
        // Files a/1 a/2 b/3 b/4 tree/x tree/sub/y; directories a, b, on
        // (tree's parent), tree, tree/sub.
        assert_eq!(on.commit().unwrap(), 11);
        assert_eq!(sync_calls(), before + 11);
        assert_eq!(fs::read(root.join("on/b/3")).unwrap(), b"new");

        let dropped = Durability::begin(true);
        write_outputs(root, "failed");
        drop(dropped);
        let again = Durability::begin(true);
        assert_eq!(again.commit().unwrap(), 0, "a dropped durability's outputs");
        assert_eq!(sync_calls(), before + 11);
    }

    /// Set in the child process of
    /// `leftovers_of_a_killed_run_are_removed_by_the_next_run`.
    const KILLED_CHILD: &str = "KPACK_TEST_KILLED_STAGING_DEST";

    /// A run that dies part-way (here: `exit`, which like SIGKILL runs no
    /// destructor) leaves its staging and scratch directories behind,
    /// unlocked; the next run that stages in the same directory removes
    /// them, leaves the directories of live runs alone, and writes its
    /// output as if nothing had been there.
    #[test]
    fn leftovers_of_a_killed_run_are_removed_by_the_next_run() {
        if let Some(dest) = std::env::var_os(KILLED_CHILD) {
            let dest = PathBuf::from(dest);
            let s = StagedDir::new(&dest).unwrap();
            fs::write(s.path().join("half"), b"partial").unwrap();
            let scratch = ScratchDir::new(parent_dir(&dest)).unwrap();
            fs::write(scratch.path().join("spill"), b"x").unwrap();
            std::process::exit(86);
        }
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        // A run in progress in the same directory.
        let live = StagedDir::new(&dir.path().join("other")).unwrap();
        let live_name = live
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(in_use(live.path()));

        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "output::tests::leftovers_of_a_killed_run_are_removed_by_the_next_run",
                "--test-threads=1",
            ])
            .env(KILLED_CHILD, &dest)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(86));
        let left: Vec<String> = hidden(dir.path())
            .into_iter()
            .filter(|n| *n != live_name)
            .collect();
        // Sorted: scratch before staging.
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left[0].starts_with(SCRATCH_PREFIX) && left[1].starts_with(STAGING_PREFIX));
        assert!(!in_use(&dir.path().join(&left[0])));
        assert!(dir.path().join(&left[1]).join("half").is_file());

        let s = StagedDir::new(&dest).unwrap();
        let swept: Vec<String> = s
            .swept()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(swept, left);
        fs::write(s.path().join("x"), b"1").unwrap();
        s.commit().unwrap();
        assert_eq!(hidden(dir.path()), [live_name]);
        assert!(live.path().is_dir());
        let names: Vec<String> = fs::read_dir(&dest)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["x"]);
        assert_eq!(fs::read(dest.join("x")).unwrap(), b"1");
    }

    /// Runs staging in the same directory at once each sweep it while the
    /// others create their directories: none loses its staging directory.
    #[test]
    fn concurrent_runs_in_one_directory_do_not_sweep_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        std::thread::scope(|s| {
            for t in 0..6 {
                s.spawn(move || {
                    for i in 0..25 {
                        let scratch = ScratchDir::new(out).unwrap();
                        fs::write(scratch.path().join("spill"), b"x").unwrap();
                        let stage = StagedDir::in_dir(out).unwrap();
                        let name = format!("a{t}-{i}");
                        fs::create_dir(stage.path().join(&name)).unwrap();
                        fs::write(stage.path().join(&name).join("f"), &name).unwrap();
                        assert!(scratch.path().join("spill").is_file());
                        stage.commit_entries(&[&name]).unwrap();
                    }
                });
            }
        });
        let mut names: Vec<String> = fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 150, "{names:?}");
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
        assert_eq!(fs::read(out.join("a3-7/f")).unwrap(), b"a3-7");
    }

    #[test]
    fn sweeping_leaves_locked_and_foreign_entries_alone() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let scratch = ScratchDir::new(d).unwrap();
        fs::create_dir(d.join(".kpack-staging-stale")).unwrap();
        fs::write(d.join(".kpack-staging-stale/f"), b"").unwrap();
        fs::write(d.join(".kpack-staging-a-file"), b"").unwrap();
        fs::create_dir(d.join(".other")).unwrap();
        fs::create_dir(d.join("visible")).unwrap();
        assert_eq!(sweep_stale(d), [d.join(".kpack-staging-stale")]);
        let scratch_name = scratch.path().file_name().unwrap().to_string_lossy();
        assert_eq!(
            hidden(d),
            [scratch_name.as_ref(), ".kpack-staging-a-file", ".other"]
        );
        drop(scratch);
        assert_eq!(hidden(d), [".kpack-staging-a-file", ".other"]);
        assert!(d.join("visible").is_dir());
    }

    #[test]
    fn sweeping_removes_a_killed_runs_temporary_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut live = Pending::create(&d.join("out.so"), Some(0o755)).unwrap();
        live.file().write_all(b"being written").unwrap();
        let stale = d.join(format!("{TEMP_FILE_PREFIX}killed"));
        fs::write(&stale, b"left by a killed run").unwrap();
        assert_eq!(sweep_stale(d), [stale]);
        live.commit().unwrap();
        assert_eq!(fs::read(d.join("out.so")).unwrap(), b"being written");
        assert_eq!(
            fs::metadata(d.join("out.so")).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert!(hidden(d).is_empty(), "{:?}", hidden(d));
    }
}
