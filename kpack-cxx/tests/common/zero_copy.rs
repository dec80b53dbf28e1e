//! The scenario of the zero-copy tests (`zero_copy.rs`, `cxx_view.rs`):
//! an uncompressed archive `a_gfx1100.kpack` and a compressed one
//! `a_gfx1101.kpack` holding `app#0..app#4` (sizes [`SIZES`]), the HIPK
//! metadata `meta` (kernel `app`, search path `a_@GFXARCH@.kpack`), each
//! code object's bytes (`<target>_<i>.bin`) and, uncompressed, its offset
//! in the archive file (`gfx1100_<i>.off`). Included with `#[path]`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kpack_format::archive::Scheme;
use kpack_host::ArchiveWriter;

use super::write_metadata;

/// The code objects of the scenario, by size: two in one page, one across
/// pages, one of several pages, one empty.
pub const SIZES: [usize; 5] = [100, 200, 5000, 70_000, 0];

/// The bytes of `app#i` for `target`.
pub fn bytes(target: &str, i: usize) -> Vec<u8> {
    let salt = target.bytes().map(usize::from).sum::<usize>();
    (0..SIZES[i])
        .map(|j| ((j * 31 + i * 7 + salt) % 251) as u8)
        .collect()
}

/// Write the scenario of `zero_copy_test.c` into `dir` (canonical): the
/// two archives, the metadata, each code object's bytes and, for the
/// uncompressed archive, its offset in the file.
pub fn scenario(dir: &Path) {
    for (target, scheme) in [
        ("gfx1100", Scheme::None),
        ("gfx1101", Scheme::ZstdPerKernel),
    ] {
        let mut w = ArchiveWriter::new("a", target, vec![target.to_string()]).scheme(scheme);
        for i in 0..SIZES.len() {
            w.add(format!("app#{i}"), target, bytes(target, i), None)
                .unwrap();
        }
        let path = dir.join(format!("a_{target}.kpack"));
        w.write(&path).unwrap();
        let file = std::fs::read(&path).unwrap();
        for i in 0..SIZES.len() {
            let b = bytes(target, i);
            std::fs::write(dir.join(format!("{target}_{i}.bin")), &b).unwrap();
            if scheme == Scheme::None && !b.is_empty() {
                let at = file
                    .windows(b.len())
                    .position(|w| w == b.as_slice())
                    .expect("code object stored as it is");
                std::fs::write(dir.join(format!("{target}_{i}.off")), at.to_string()).unwrap();
            }
        }
    }
    write_metadata(&dir.join("meta"), "app", &["a_@GFXARCH@.kpack"]);
}

pub fn setup() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    scenario(&dir);
    (tmp, dir)
}
