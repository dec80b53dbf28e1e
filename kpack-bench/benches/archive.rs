//! In-process micro-benchmarks of kpack-core's archives, through divan:
//! writing an archive (both schemes), opening one, reading (decompressing)
//! one kernel of it, and listing the code objects of a fat binary (a
//! compressed bundle: decompressed and split). The table of `cargo xtask
//! bench` measures whole processes; these measure the library calls
//! alone. `cargo bench -p kpack-bench --bench archive`.

use std::path::{Path, PathBuf};

use divan::{black_box, Bencher};
use kpack_format::archive::Scheme;
use kpack_host::ArchiveWriter;

fn main() {
    divan::main();
}

/// Kernel sizes: a small code object and a large one.
const SIZES: [usize; 2] = [64 << 10, 1 << 20];
/// Kernels per archive.
const KERNELS: usize = 16;

/// Code-object-like bytes: 4-byte words drawn from 256 "instructions"
/// (xorshift64), about as compressible as real code objects.
fn kernel(size: usize, seed: u64) -> Vec<u8> {
    let words: Vec<u32> = (0..256u32).map(|i| i.wrapping_mul(0x9E37_79B9)).collect();
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(size);
    while out.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend(words[(x % 256) as usize].to_le_bytes());
    }
    out.truncate(size);
    out
}

/// An archive of [`KERNELS`] kernels of `size` bytes.
fn writer(scheme: Scheme, size: usize) -> ArchiveWriter<'static> {
    let mut w = ArchiveWriter::new("bench", "gfx942", vec!["gfx942".into()]).scheme(scheme);
    for i in 0..KERNELS {
        let key = format!("lib/libbench.so#{i}");
        w.add(key, "gfx942", kernel(size, i as u64), None)
            .expect("a new kernel");
    }
    w
}

/// Write an archive to memory, scheme `zstd-per-kernel` (the default).
#[divan::bench(args = SIZES)]
fn write_zstd(bencher: Bencher, size: usize) {
    let w = writer(Scheme::ZstdPerKernel, size);
    bencher
        .counter(divan::counter::BytesCount::new(size * KERNELS))
        .bench_local(|| w.to_vec().expect("written"));
}

/// Write an archive to memory, scheme `none`.
#[divan::bench(args = SIZES)]
fn write_none(bencher: Bencher, size: usize) {
    let w = writer(Scheme::None, size);
    bencher
        .counter(divan::counter::BytesCount::new(size * KERNELS))
        .bench_local(|| w.to_vec().expect("written"));
}

/// An archive written to a temporary file.
fn archive_file(dir: &Path, size: usize) -> PathBuf {
    let path = dir.join(format!("bench-{size}.kpack"));
    writer(Scheme::ZstdPerKernel, size)
        .write(&path)
        .expect("written");
    path
}

/// Open an archive: map it, decode its TOC, index its frames.
#[divan::bench(args = SIZES)]
fn open(bencher: Bencher, size: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = archive_file(dir.path(), size);
    bencher.bench_local(|| kpack_loader::open_archive(&path).expect("opened"));
}

/// Read one kernel of an open archive: one zstd frame decompressed (and
/// its checksum verified).
#[divan::bench(args = SIZES)]
fn read_kernel(bencher: Bencher, size: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let archive = kpack_loader::open_archive(archive_file(dir.path(), size)).expect("opened");
    let entry = &archive.entries()[KERNELS / 2];
    bencher
        .counter(divan::counter::BytesCount::new(size))
        .bench_local(|| archive.read(black_box(entry)).expect("read").len());
}

/// The committed fat binary with a compressed bundle (the golden tests').
fn fat_binary() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/inputs/libvadd_compressed.so")
}

/// List the code objects of a fat binary: parse it, decompress its bundle,
/// split it.
#[divan::bench]
fn code_objects(bencher: Bencher) {
    let path = fat_binary();
    let bytes = std::fs::read(&path).expect("the golden input");
    bencher.bench_local(|| {
        kpack_host::offload::code_objects(&path, black_box(&bytes))
            .expect("code objects")
            .len()
    });
}
