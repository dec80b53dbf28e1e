//! Path discovery: which file is mapped at an address of this process
//! (`kpack_discover_binary_path`), so the runtime can find an offloaded
//! binary's archives relative to it.

use std::path::PathBuf;

/// A file mapped into this process, as [`discover_binary_path`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    /// The file's path, without the ` (deleted)` suffix Linux appends to
    /// files removed or replaced since they were mapped.
    pub path: PathBuf,
    /// The address's offset in the file.
    pub offset: u64,
}

/// Why [`discover_binary_path`] failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("cannot read /proc/self/maps: {0}")]
    Io(#[from] std::io::Error),
    #[error("address {0:#x} is not in a file mapping")]
    NotMapped(usize),
    #[error("binary path discovery is not implemented on this platform")]
    Unsupported,
}

/// The file mapped at `address` in this process, and the address's offset
/// in it (Linux: from `/proc/self/maps`, which unlike `dladdr` also covers
/// data addresses). Elsewhere [`DiscoverError::Unsupported`]: on Windows
/// the C API (kpack-cxx, which holds the runtime's FFI) asks
/// `GetModuleHandleExW`/`GetModuleFileNameW` instead, behind
/// `cfg(windows)`, since this crate has no `unsafe` code.
pub fn discover_binary_path(address: usize) -> Result<MappedFile, DiscoverError> {
    if cfg!(target_os = "linux") {
        let maps = std::fs::read("/proc/self/maps")?;
        find_mapping(&maps, address as u64).ok_or(DiscoverError::NotMapped(address))
    } else {
        Err(DiscoverError::Unsupported)
    }
}

/// The file mapping of `/proc/<pid>/maps` text (`maps`) that contains
/// `address`; `None` when no mapping contains it or the one that does is
/// not a file (anonymous memory, `[heap]`, `[stack]`, ...).
pub fn find_mapping(maps: &[u8], address: u64) -> Option<MappedFile> {
    maps.split(|&b| b == b'\n')
        .filter_map(parse_maps_line)
        .find(|m| m.start <= address && address < m.end)
        .and_then(|m| {
            let path = m.path.strip_suffix(b" (deleted)").unwrap_or(m.path);
            if path.is_empty() || path.starts_with(b"[") {
                return None;
            }
            Some(MappedFile {
                path: bytes_to_path(path),
                offset: m.offset.checked_add(address - m.start)?,
            })
        })
}

struct MapsLine<'a> {
    start: u64,
    end: u64,
    offset: u64,
    path: &'a [u8],
}

/// `start-end perms offset dev inode [path]`; the path is the rest of the
/// line after the blanks that follow the inode (it may contain spaces).
fn parse_maps_line(line: &[u8]) -> Option<MapsLine<'_>> {
    fn field<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
        let s = rest.trim_ascii_start();
        let end = s.iter().position(|&b| b == b' ').unwrap_or(s.len());
        let (f, r) = s.split_at(end);
        *rest = r;
        (!f.is_empty()).then_some(f)
    }
    fn hex(b: &[u8]) -> Option<u64> {
        u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok()
    }
    let mut rest = line;
    let range = field(&mut rest)?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let (start, end) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
    let _perms = field(&mut rest)?;
    let offset = hex(field(&mut rest)?)?;
    let _dev = field(&mut rest)?;
    let _inode = field(&mut rest)?;
    Some(MapsLine {
        start,
        end,
        offset,
        path: rest.trim_ascii_start(),
    })
}

#[cfg(unix)]
fn bytes_to_path(b: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(b))
}

#[cfg(not(unix))]
fn bytes_to_path(b: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(b).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 1311 /usr/bin/cat
55d0c0a02000-55d0c0a07000 r-xp 00002000 08:01 1311 /usr/bin/cat
55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000010000 r--p 00010000 fd:00 42   /opt/rocm/lib/lib with space.so
7f0000010000-7f0000020000 r--p 00004000 fd:00 43   /tmp/replaced.so (deleted)
7f0000020000-7f0000030000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn maps_parsing() {
        let find = |a: u64| find_mapping(MAPS.as_bytes(), a);
        assert_eq!(
            find(0x55d0c0a03010),
            Some(MappedFile {
                path: "/usr/bin/cat".into(),
                offset: 0x3010
            })
        );
        assert_eq!(find(0x55d0c0a00000).unwrap().offset, 0);
        assert_eq!(
            find(0x7f000000ffff),
            Some(MappedFile {
                path: "/opt/rocm/lib/lib with space.so".into(),
                offset: 0x1ffff
            })
        );
        // " (deleted)" is not part of the path.
        assert_eq!(
            find(0x7f0000010008),
            Some(MappedFile {
                path: "/tmp/replaced.so".into(),
                offset: 0x4008
            })
        );
        // Heap, stack, anonymous memory, unmapped addresses.
        for a in [
            0x55d0c1000010,
            0x7ffd00000100,
            0x7f0000020000,
            0x1000,
            0x55d0c0a07000,
        ] {
            assert_eq!(find(a), None, "{a:#x}");
        }
        // Junk lines are skipped.
        let junk = b"garbage\n\nzz-10 r--p 0 0 0 /x\n1000-2000 r--p 0 08:01 1 /ok\n";
        assert_eq!(find_mapping(junk, 0x1800).unwrap().path, Path::new("/ok"));
    }

    #[test]
    fn discovers_own_binary() {
        static MARKER: u8 = 7;
        let m = discover_binary_path(&MARKER as *const u8 as usize).unwrap();
        assert_eq!(
            std::fs::canonicalize(&m.path).unwrap(),
            std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap()
        );
        let local = 0u8;
        assert!(matches!(
            discover_binary_path(&local as *const u8 as usize),
            Err(DiscoverError::NotMapped(_))
        ));
    }
}
