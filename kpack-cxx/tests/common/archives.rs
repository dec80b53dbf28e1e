//! Archives and metadata the runtime's C and C++ test programs read:
//! kpack-host and std only, so that kpack-e2e's CMake tests include this
//! file too (`#[path]`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kpack_format::hipk::HipkMetadata;
use kpack_format::msgpack::{self, Value};
use kpack_host::ArchiveWriter;

/// The code object the loader tests store for (key, target).
pub fn code(key: &str, target: &str) -> Vec<u8> {
    let mut v = format!("co {} {target} ", key.rsplit('#').next().unwrap_or("")).into_bytes();
    // Long enough that zstd has something to compress.
    v.extend(key.bytes().cycle().take(3000));
    v
}

/// Write an archive serving `arches` with `code(key, target)` for each
/// of `kernels`.
pub fn write_archive(path: &Path, arches: &[&str], kernels: &[(&str, &str)]) {
    let mut w = ArchiveWriter::new(
        "lib",
        arches[0],
        arches.iter().map(|a| a.to_string()).collect(),
    );
    for (k, t) in kernels {
        w.add(*k, *t, code(k, t), None).unwrap();
    }
    w.write(path).unwrap();
}

/// Write HIPK metadata to a file.
pub fn write_metadata(path: &Path, kernel_name: &str, search_paths: &[&str]) {
    let m = HipkMetadata::new(
        kernel_name,
        search_paths.iter().map(|s| s.to_string()).collect(),
    );
    std::fs::write(path, m.encode()).unwrap();
}

/// Damage the content checksum of zstd frame `index` of an archive
/// written by kpack (frames carry checksums), so that it fails to read.
pub fn damage_frame(bytes: &mut [u8], index: usize) {
    let mut pos = 68;
    for _ in 0..index {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        pos += 4 + len;
    }
    let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
    bytes[pos + 4 + len - 1] ^= 0xff;
}

/// Rewrite an archive's TOC with `edit`.
pub fn edit_toc(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let toc_offset = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let mut toc = msgpack::decode(&bytes[toc_offset..]).unwrap();
    edit(&mut toc);
    let mut out = bytes[..toc_offset].to_vec();
    out.extend(msgpack::encode(&toc));
    out
}

/// The value at `path` (map keys) inside `v`.
pub fn at<'a>(v: &'a mut Value, path: &[&str]) -> &'a mut Value {
    let mut cur = v;
    for key in path {
        let Value::Map(entries) = cur else {
            panic!("not a map at {key}")
        };
        cur = entries
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no {key}"));
    }
    cur
}

/// Files that are not usable archives, for the C and C++ test programs.
pub fn write_bad_archives(dir: &Path, fixtures: &Path) {
    let reference = std::fs::read(fixtures.join("test_zstd.kpack")).unwrap();
    let mut b = reference.clone();
    b[..4].copy_from_slice(b"KPAX");
    std::fs::write(dir.join("bad_magic.kpack"), b).unwrap();
    std::fs::write(dir.join("short.kpack"), &reference[..10]).unwrap();
    let mut b = reference.clone();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(dir.join("bad_version.kpack"), b).unwrap();
    let mut b = reference.clone();
    let past = reference.len() as u64 + 100;
    b[8..16].copy_from_slice(&past.to_le_bytes());
    std::fs::write(dir.join("toc_past_end.kpack"), b).unwrap();
    let toc_offset = u64::from_le_bytes(reference[8..16].try_into().unwrap()) as usize;
    let mut b = reference[..toc_offset].to_vec();
    b.push(0xc1);
    std::fs::write(dir.join("bad_toc.kpack"), b).unwrap();
    let mut b = reference[..toc_offset].to_vec();
    b.push(0x90);
    std::fs::write(dir.join("toc_not_a_map.kpack"), b).unwrap();
    let b = edit_toc(&reference, |t| {
        *at(t, &["compression_scheme"]) = Value::from("lz4")
    });
    std::fs::write(dir.join("unknown_scheme.kpack"), b).unwrap();
    let b = edit_toc(&reference, |t| *at(t, &["gfx_arches"]) = Value::from(5));
    std::fs::write(dir.join("wrong_type.kpack"), b).unwrap();
    std::fs::create_dir_all(dir.join("a_directory.kpack")).unwrap();

    // The reference's three kernels, written by kpack (with checksums),
    // the first frame damaged.
    let reference = kpack_loader::open_archive(fixtures.join("test_zstd.kpack")).unwrap();
    let mut w = ArchiveWriter::new("test", "gfx110X", reference.gfx_arches().to_vec());
    for (key, target, _) in reference.entries_by_ordinal() {
        w.add(key, target, reference.kernel(key, target).unwrap(), None)
            .unwrap();
    }
    let mut b = w.to_vec().unwrap();
    damage_frame(&mut b, 0);
    std::fs::write(dir.join("corrupt_zstd.kpack"), b).unwrap();
}

/// A valid archive at `p` whose one kernel, `k#0` @ gfx1100, really is
/// 4 GiB (a frame of RLE blocks, 128 KiB on disk): only the allocation
/// fails. (A TOC that merely claims 4 GiB is a corrupt archive:
/// DECOMPRESSION_FAILED.)
pub fn write_huge_archive(p: &Path) {
    let mut w = ArchiveWriter::new("o", "gfx1100", vec!["gfx1100".into()]);
    w.add("k#0", "gfx1100", vec![1u8; 100], None).unwrap();
    let small = w.to_vec().unwrap();
    let toc_offset = u64::from_le_bytes(small[8..16].try_into().unwrap()) as usize;
    let frame = rle_frame(1 << 32);
    let mut b = small[..64].to_vec();
    b.extend(1u32.to_le_bytes());
    b.extend((frame.len() as u32).to_le_bytes());
    b.extend(&frame);
    let new_toc_offset = b.len() as u64;
    b[8..16].copy_from_slice(&new_toc_offset.to_le_bytes());
    b.extend(&small[toc_offset..]);
    let b = edit_toc(&b, |t| {
        *at(t, &["toc", "k#0", "gfx1100", "original_size"]) = Value::from(1u64 << 32);
        *at(t, &["zstd_size"]) = Value::from(8 + frame.len() as u64);
    });
    std::fs::write(p, b).unwrap();
}

/// A zstd frame of `size` zero bytes made of RLE blocks, with its content
/// size in the header.
pub fn rle_frame(size: u64) -> Vec<u8> {
    // Magic, descriptor (8-byte content size, window descriptor follows),
    // window 128 KiB, content size.
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0xc0, 0x38];
    f.extend(size.to_le_bytes());
    const BLOCK: u64 = 128 << 10;
    let blocks = size.div_ceil(BLOCK);
    for i in 0..blocks {
        let n = BLOCK.min(size - i * BLOCK) as u32;
        // last-block flag, block type 1 (RLE), size; then the byte.
        let h = u32::from(i + 1 == blocks) | (1 << 1) | (n << 3);
        f.extend(&h.to_le_bytes()[..3]);
        f.push(0);
    }
    f
}

/// The loader scenario of the C++ test program in `work`: app#0 in both
/// per-target archives, app#1 only for gfx1101, app#2 damaged. Returns the
/// metadata file and the binary path it belongs to.
pub fn loader_scenario(work: &Path) -> (PathBuf, PathBuf) {
    write_archive(
        &work.join("lib_gfx1100.kpack"),
        &["gfx1100"],
        &[("app#0", "gfx1100"), ("app#2", "gfx1100")],
    );
    let mut b = std::fs::read(work.join("lib_gfx1100.kpack")).unwrap();
    damage_frame(&mut b, 1);
    std::fs::write(work.join("lib_gfx1100.kpack"), b).unwrap();
    write_archive(
        &work.join("lib_gfx1101.kpack"),
        &["gfx1101"],
        &[("app#0", "gfx1101"), ("app#1", "gfx1101")],
    );
    let meta = work.join("app.meta");
    write_metadata(&meta, "app", &["lib_@GFXARCH@.kpack", "lib_gfx1100.kpack"]);
    (meta, work.join("app"))
}

/// Run `program oom ARCHIVE METADATA BINARY` on an archive whose kernel
/// needs 4 GiB, in a 1 GiB address space (`ulimit -v`): the program checks
/// that the load fails with KPACK_ERROR_OUT_OF_MEMORY and prints PASS.
pub fn run_out_of_memory_case(program: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("huge.kpack");
    write_huge_archive(&p);
    let meta = dir.path().join("m");
    write_metadata(&meta, "k", &[p.to_str().unwrap()]);
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
        .arg(program)
        .arg("oom")
        .arg(&p)
        .arg(&meta)
        .arg(dir.path().join("k"))
        .output()
        .expect("run the test program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "{}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
