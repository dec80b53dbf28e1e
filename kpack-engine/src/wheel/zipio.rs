//! Reading and writing wheel files (zip archives), streaming: no member is
//! ever held in memory whole.
//!
//! - [`extract`] unpacks a `.whl` into a directory in parallel, checking
//!   every member's name (no absolute paths, no `..`, no duplicates) and
//!   restoring its Unix permission bits.
//! - [`write_wheel`] writes a list of [`Member`]s as a reproducible wheel:
//!   members in path-component order (`a/b` before `a-c`, as Python's
//!   `sorted(Path.rglob("*"))`), every entry time the same (from
//!   `SOURCE_DATE_EPOCH`, else 1980-01-01), modes kept, `.kpack` archives
//!   stored (already compressed), everything else deflated, and a RECORD
//!   as PEP 376/627 say (`sha256=` urlsafe base64 without padding, its own
//!   line `RECORD,,`), computed while the members are written and stored
//!   last. [`write_directory`] writes the same members as an unpacked tree.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipArchive, ZipWriter};

use super::{Result, WheelError};
use crate::Observer;

/// The variable that fixes entry times (reproducible builds).
pub const SOURCE_DATE_EPOCH: &str = "SOURCE_DATE_EPOCH";

/// Where a member's bytes come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A regular file (followed if it is a symlink).
    File(PathBuf),
    /// Bytes made here (`METADATA`, `WHEEL`...).
    Bytes(Vec<u8>),
}

/// One file of an output wheel.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// Path in the wheel, `/`-separated.
    pub name: String,
    /// Permission bits.
    pub mode: u32,
    pub source: Source,
}

impl Member {
    pub fn file(name: impl Into<String>, mode: u32, path: impl Into<PathBuf>) -> Member {
        Member {
            name: name.into(),
            mode,
            source: Source::File(path.into()),
        }
    }

    pub fn bytes(name: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Member {
        Member {
            name: name.into(),
            mode: 0o644,
            source: Source::Bytes(bytes.into()),
        }
    }

    /// The number of bytes of the member.
    pub(super) fn len(&self) -> Result<u64> {
        match &self.source {
            Source::File(p) => Ok(fs::metadata(p).map_err(|e| WheelError::io(p, e))?.len()),
            Source::Bytes(b) => Ok(b.len() as u64),
        }
    }

    fn open(&self) -> Result<Box<dyn Read + '_>> {
        match &self.source {
            Source::File(p) => Ok(Box::new(File::open(p).map_err(|e| WheelError::io(p, e))?)),
            Source::Bytes(b) => Ok(Box::new(b.as_slice())),
        }
    }
}

/// Path-component order (Python's `PurePath` ordering on POSIX).
pub(crate) fn component_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.split('/').cmp(b.split('/'))
}

/// Sort members by [`component_order`].
pub(crate) fn sort_members(members: &mut [Member]) {
    members.sort_by(|a, b| component_order(&a.name, &b.name));
}

/// The time stamped on every entry: `SOURCE_DATE_EPOCH` (UTC, clamped to
/// the zip range 1980–2107) when set to a number, else 1980-01-01 00:00:00.
pub(crate) fn entry_time() -> DateTime {
    let epoch = std::env::var(SOURCE_DATE_EPOCH)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok());
    epoch.map_or_else(DateTime::default, time_of)
}

fn time_of(epoch: i64) -> DateTime {
    let min = 315_532_800; // 1980-01-01T00:00:00Z
    let max = 4_354_819_198; // 2107-12-31T23:59:58Z
    let t = time::OffsetDateTime::from_unix_timestamp(epoch.clamp(min, max)).expect("in range");
    let p = time::PrimitiveDateTime::new(t.date(), t.time());
    DateTime::try_from(p).unwrap_or_default()
}

/// One line of a RECORD: `name,sha256=<urlsafe base64, no padding>,size`.
pub(crate) fn record_line(name: &str, sha256: &[u8], size: u64) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha256);
    format!("{name},sha256={b64},{size}")
}

/// A RECORD: `lines` (name, line) plus the RECORD's own line `name,,`,
/// sorted by name in component order, each ending in `\n`.
fn record(mut lines: Vec<(String, String)>, record_name: &str) -> String {
    lines.push((record_name.to_string(), format!("{record_name},,")));
    lines.sort_by(|a, b| component_order(&a.0, &b.0));
    lines.into_iter().map(|(_, l)| l + "\n").collect()
}

/// What was written.
#[derive(Debug, Clone, Default)]
pub(crate) struct Written {
    pub files: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Write `members` (sorted, without a RECORD) as the wheel file `path`,
/// with the RECORD `<dist_info>/RECORD` last.
pub(crate) fn write_wheel(
    path: &Path,
    members: &[Member],
    dist_info: &str,
    observer: &dyn Observer,
) -> Result<Written> {
    let mut wheel = WheelWriter::create(path, members.len())?;
    for m in members {
        wheel.add(m, observer)?;
    }
    wheel.finish(dist_info)
}

/// A wheel file being written: the zip archive, and the RECORD lines of
/// the members so far.
struct WheelWriter<'a> {
    path: &'a Path,
    zip: ZipWriter<BufWriter<File>>,
    time: DateTime,
    lines: Vec<(String, String)>,
    written: Written,
    buf: Vec<u8>,
}

impl<'a> WheelWriter<'a> {
    /// Create the wheel file `path`, for `members` members.
    fn create(path: &'a Path, members: usize) -> Result<Self> {
        let file = File::create(path).map_err(|e| WheelError::io(path, e))?;
        Ok(WheelWriter {
            path,
            zip: ZipWriter::new(BufWriter::with_capacity(1 << 20, file)),
            time: entry_time(),
            lines: Vec::with_capacity(members),
            written: Written::default(),
            buf: vec![0u8; 1 << 20],
        })
    }

    /// The options of an entry: `method`, Unix mode `mode`, the entry time.
    fn options(&self, method: CompressionMethod, mode: u32) -> SimpleFileOptions {
        SimpleFileOptions::default()
            .compression_method(method)
            .system(zip::System::Unix)
            .last_modified_time(self.time)
            .unix_permissions(mode)
    }

    /// Add the member `m` (`.kpack` archives stored, the rest deflated)
    /// and its RECORD line.
    fn add(&mut self, m: &Member, observer: &dyn Observer) -> Result<()> {
        let len = m.len()?;
        let method = if m.name.ends_with(".kpack") {
            CompressionMethod::Stored
        } else {
            CompressionMethod::Deflated
        };
        let options = self
            .options(method, m.mode)
            .large_file(len >= u32::MAX as u64);
        self.zip
            .start_file(m.name.as_str(), options)
            .map_err(|e| zip_error(self.path, e))?;
        let (hash, size) = self.copy(m, observer)?;
        self.lines
            .push((m.name.clone(), record_line(&m.name, &hash, size)));
        self.written.files += 1;
        self.written.bytes_in += size;
        Ok(())
    }

    /// Copy the bytes of `m` into the current entry; their SHA-256 and
    /// size.
    fn copy(
        &mut self,
        m: &Member,
        observer: &dyn Observer,
    ) -> Result<(sha2::digest::Output<Sha256>, u64)> {
        let mut hash = Sha256::new();
        let mut input = m.open()?;
        let mut size = 0u64;
        loop {
            let n = match input.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(WheelError::io(source_path(m, self.path), e)),
            };
            hash.update(&self.buf[..n]);
            self.zip
                .write_all(&self.buf[..n])
                .map_err(|e| WheelError::io(self.path, e))?;
            size += n as u64;
            observer.advance(n as u64);
        }
        Ok((hash.finalize(), size))
    }

    /// Add the RECORD `<dist_info>/RECORD` and finish the archive.
    fn finish(mut self, dist_info: &str) -> Result<Written> {
        let record_name = format!("{dist_info}/RECORD");
        let options = self.options(CompressionMethod::Deflated, 0o644);
        self.zip
            .start_file(record_name.as_str(), options)
            .map_err(|e| zip_error(self.path, e))?;
        let lines = std::mem::take(&mut self.lines);
        self.zip
            .write_all(record(lines, &record_name).as_bytes())
            .map_err(|e| WheelError::io(self.path, e))?;
        let mut out = self.zip.finish().map_err(|e| zip_error(self.path, e))?;
        out.flush().map_err(|e| WheelError::io(self.path, e))?;
        self.written.files += 1;
        self.written.bytes_out = out
            .stream_position()
            .map_err(|e| WheelError::io(self.path, e))?;
        Ok(self.written)
    }
}

/// A zip error writing the wheel file `path`.
fn zip_error(path: &Path, e: zip::result::ZipError) -> WheelError {
    WheelError::io(path, io::Error::other(e))
}

fn source_path<'a>(m: &'a Member, fallback: &'a Path) -> &'a Path {
    match &m.source {
        Source::File(p) => p,
        Source::Bytes(_) => fallback,
    }
}

/// Write `members` as an unpacked wheel in the new directory `dir`, with a
/// RECORD as [`write_wheel`] makes it.
pub(crate) fn write_directory(
    dir: &Path,
    members: &[Member],
    dist_info: &str,
    observer: &dyn Observer,
) -> Result<Written> {
    let mut lines = Vec::with_capacity(members.len());
    let mut written = Written::default();
    for m in members {
        let dst = dir.join(&m.name);
        if let Some(p) = dst.parent() {
            fs::create_dir_all(p).map_err(|e| WheelError::io(p, e))?;
        }
        let mut out = File::create(&dst).map_err(|e| WheelError::io(&dst, e))?;
        let mut hash = Sha256::new();
        let mut input = m.open()?;
        let mut tee = HashingWriter {
            out: &mut out,
            hash: &mut hash,
        };
        let size = io::copy(&mut input, &mut tee).map_err(|e| WheelError::io(&dst, e))?;
        fs::set_permissions(&dst, fs::Permissions::from_mode(m.mode & 0o7777))
            .map_err(|e| WheelError::io(&dst, e))?;
        observer.advance(size);
        lines.push((m.name.clone(), record_line(&m.name, &hash.finalize(), size)));
        written.files += 1;
        written.bytes_in += size;
        written.bytes_out += size;
    }
    let record_name = format!("{dist_info}/RECORD");
    let text = record(lines, &record_name);
    let dst = dir.join(&record_name);
    if let Some(p) = dst.parent() {
        fs::create_dir_all(p).map_err(|e| WheelError::io(p, e))?;
    }
    fs::write(&dst, &text).map_err(|e| WheelError::io(&dst, e))?;
    written.files += 1;
    written.bytes_out += text.len() as u64;
    Ok(written)
}

struct HashingWriter<'a> {
    out: &'a mut File,
    hash: &'a mut Sha256,
}

impl Write for HashingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A file read at independent positions by clones that share one
/// descriptor (`pread`), so that every thread gets its own view of the
/// zip archive without reopening or re-reading its central directory.
#[derive(Clone)]
struct SharedFile {
    file: Arc<File>,
    pos: u64,
    len: u64,
}

impl Read for SharedFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for SharedFile {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos =
            pos.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before start"))?;
        Ok(self.pos)
    }
}

/// One member of the input wheel, checked.
struct InputMember {
    index: usize,
    rel: PathBuf,
    dir: bool,
    mode: u32,
    size: u64,
}

/// Unpack the wheel file `wheel` into the existing empty directory `dest`
/// (in parallel on the current thread pool); returns the bytes written.
pub fn extract(wheel: &Path, dest: &Path, observer: &dyn Observer) -> Result<u64> {
    let file = File::open(wheel).map_err(|e| WheelError::io(wheel, e))?;
    let len = file.metadata().map_err(|e| WheelError::io(wheel, e))?.len();
    let reader = SharedFile {
        file: Arc::new(file),
        pos: 0,
        len,
    };
    let archive = ZipArchive::new(reader)
        .map_err(|e| WheelError::invalid(wheel, format!("not a wheel: not a zip archive ({e})")))?;
    let members = list_members(wheel, &archive)?;
    let total: u64 = members.iter().map(|m| m.size).sum();
    observer.add_work(total);
    for m in members.iter().filter(|m| m.dir) {
        let d = dest.join(&m.rel);
        fs::create_dir_all(&d).map_err(|e| WheelError::io(&d, e))?;
    }
    members
        .par_iter()
        .filter(|m| !m.dir)
        .map_init(
            || archive.clone(),
            |archive, m| extract_one(wheel, archive, m, dest, observer),
        )
        .collect::<Result<Vec<()>>>()?;
    // Directory modes last: a read-only directory would block its files.
    for m in members.iter().filter(|m| m.dir && m.mode != 0) {
        let d = dest.join(&m.rel);
        fs::set_permissions(&d, fs::Permissions::from_mode(m.mode | 0o700))
            .map_err(|e| WheelError::io(&d, e))?;
    }
    Ok(total)
}

/// Every member with a safe, unique name.
fn list_members(wheel: &Path, archive: &ZipArchive<SharedFile>) -> Result<Vec<InputMember>> {
    let mut archive = archive.clone();
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(archive.len());
    for index in 0..archive.len() {
        let f = archive
            .by_index_raw(index)
            .map_err(|e| WheelError::invalid(wheel, format!("member #{index}: {e}")))?;
        let name = String::from_utf8_lossy(f.name_raw()).into_owned();
        let plain =
            !name.starts_with('/') && !name.contains('\\') && name.split('/').all(|c| c != "..");
        let rel = f
            .enclosed_name()
            .filter(|p| plain && p.components().all(|c| matches!(c, Component::Normal(_))))
            .ok_or_else(|| {
                WheelError::invalid(
                    wheel,
                    format!("member {name:?}: an absolute path or one with `..`"),
                )
            })?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        if !seen.insert(rel.clone()) {
            return Err(WheelError::invalid(
                wheel,
                format!("member {name:?} appears twice"),
            ));
        }
        out.push(InputMember {
            index,
            dir: f.is_dir(),
            mode: f.unix_mode().map_or(0, |m| m & 0o7777),
            size: f.size(),
            rel,
        });
    }
    Ok(out)
}

fn extract_one(
    wheel: &Path,
    archive: &mut ZipArchive<SharedFile>,
    m: &InputMember,
    dest: &Path,
    observer: &dyn Observer,
) -> Result<()> {
    let dst = dest.join(&m.rel);
    if let Some(p) = dst.parent() {
        fs::create_dir_all(p).map_err(|e| WheelError::io(p, e))?;
    }
    let mut entry = archive
        .by_index(m.index)
        .map_err(|e| WheelError::invalid(wheel, format!("member {}: {e}", m.rel.display())))?;
    let file = File::create(&dst).map_err(|e| WheelError::io(&dst, e))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let n = io::copy(&mut entry, &mut out)
        .map_err(|e| WheelError::invalid(wheel, format!("member {}: {e}", m.rel.display())))?;
    out.flush().map_err(|e| WheelError::io(&dst, e))?;
    if m.mode != 0 {
        fs::set_permissions(&dst, fs::Permissions::from_mode(m.mode))
            .map_err(|e| WheelError::io(&dst, e))?;
    }
    observer.advance(n);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Silent;

    #[test]
    fn component_order_is_pathlibs() {
        let mut v = vec![
            "a-c",
            "a/b",
            "torch-1.dist-info/RECORD",
            "torch/x",
            "torchgen/y",
        ];
        v.sort_by(|a, b| component_order(a, b));
        assert_eq!(
            v,
            [
                "a/b",
                "a-c",
                "torch/x",
                "torch-1.dist-info/RECORD",
                "torchgen/y"
            ]
        );
    }

    #[test]
    fn record_lines_are_pep_376() {
        let h = Sha256::digest(b"hello");
        assert_eq!(
            record_line("a/b.py", &h, 5),
            "a/b.py,sha256=LPJNul-wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ,5"
        );
        let r = record(
            vec![("z".into(), "z,x,1".into()), ("a".into(), "a,y,2".into())],
            "d.dist-info/RECORD",
        );
        assert_eq!(r, "a,y,2\nd.dist-info/RECORD,,\nz,x,1\n");
    }

    #[test]
    fn times() {
        assert_eq!(time_of(0), DateTime::default());
        let t = time_of(1_700_000_000); // 2023-11-14T22:13:20Z
        assert_eq!(
            (
                t.year(),
                t.month(),
                t.day(),
                t.hour(),
                t.minute(),
                t.second()
            ),
            (2023, 11, 14, 22, 13, 20)
        );
    }

    #[test]
    fn writes_and_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("big.bin");
        fs::write(&src, vec![7u8; 3 << 20]).unwrap();
        fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
        let mut members = vec![
            Member::bytes("p-1.dist-info/METADATA", "Name: p\n"),
            Member::file("p/lib/big.bin", 0o755, &src),
            Member::bytes("p/.kpack/p_gfx942.kpack", "KPAK"),
        ];
        sort_members(&mut members);
        let whl = d.path().join("p-1-py3-none-any.whl");
        let w = write_wheel(&whl, &members, "p-1.dist-info", &Silent).unwrap();
        assert_eq!(w.files, 4);
        let mut a = ZipArchive::new(File::open(&whl).unwrap()).unwrap();
        let names: Vec<String> = a.file_names().map(|n| n.unwrap().into_owned()).collect();
        assert_eq!(
            names,
            [
                "p/.kpack/p_gfx942.kpack",
                "p/lib/big.bin",
                "p-1.dist-info/METADATA",
                "p-1.dist-info/RECORD"
            ]
        );
        assert_eq!(
            a.by_name("p/.kpack/p_gfx942.kpack").unwrap().compression(),
            CompressionMethod::Stored
        );
        assert_eq!(
            a.by_name("p/lib/big.bin").unwrap().unix_mode().unwrap() & 0o777,
            0o755
        );
        let mut rec = String::new();
        a.by_name("p-1.dist-info/RECORD")
            .unwrap()
            .read_to_string(&mut rec)
            .unwrap();
        assert!(rec.ends_with("p-1.dist-info/RECORD,,\n"), "{rec}");
        assert_eq!(rec.lines().count(), 4);

        let out = d.path().join("x");
        fs::create_dir(&out).unwrap();
        extract(&whl, &out, &Silent).unwrap();
        assert_eq!(
            fs::read(out.join("p/lib/big.bin")).unwrap(),
            fs::read(&src).unwrap()
        );
        assert_eq!(
            fs::metadata(out.join("p/lib/big.bin"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o755
        );
        let dir = d.path().join("dir");
        write_directory(&dir, &members, "p-1.dist-info", &Silent).unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("p-1.dist-info/RECORD")).unwrap(),
            rec
        );
    }

    #[test]
    fn refuses_unsafe_and_duplicate_names() {
        let d = tempfile::tempdir().unwrap();
        for (names, want) in [
            (vec!["../evil"], "absolute path or one with `..`"),
            (vec!["/etc/x"], "absolute path or one with `..`"),
        ] {
            let whl = d.path().join("t.whl");
            let mut z = ZipWriter::new(File::create(&whl).unwrap());
            for n in &names {
                z.start_file(*n, SimpleFileOptions::default()).unwrap();
                z.write_all(b"x").unwrap();
            }
            z.finish().unwrap();
            let out = tempfile::tempdir().unwrap();
            let e = extract(&whl, out.path(), &Silent).unwrap_err().to_string();
            assert!(e.contains(want), "{names:?}: {e}");
        }
        fs::write(d.path().join("n.whl"), b"not a zip").unwrap();
        let e = extract(&d.path().join("n.whl"), d.path(), &Silent)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a wheel"), "{e}");
    }
}
