//! Archives over 4 GiB (formats.md §3.5: 64-bit offsets throughout), without 4 GiB
//! of real data: kernels of zeros from untouched zeroed memory, written
//! through a sink that leaves zero runs as holes of a sparse file, so the
//! archive takes a few kilobytes of disk. Read back by the library, the
//! loader, the C API and the CLI. A single kernel over 4 GiB is refused by
//! name. (A real archive over 4 GiB of incompressible kernels, both
//! schemes, is `cargo xtask bench`'s; see docs/performance.md.)

use std::ffi::{c_char, c_void, CString};
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use crate::common::*;
use kpack_format::archive::{ArchiveError, Scheme, MAX_KERNEL_SIZE};
use kpack_format::hipk::HipkMetadata;
use kpack_format::msgpack::{self, Value};
use kpack_host::ArchiveWriter;
use kpack_loader::{Config, Loader};
use rocm_kpack::*;

const GIB: u64 = 1 << 30;
/// Each of the two zero kernels: together they put the third past 4 GiB.
const ZERO_KERNEL: usize = (2 * GIB + 4096) as usize;
const KEY: &str = "lib/libbig.so";

/// A file written through `Write + Seek` where 64 KiB-aligned runs of
/// zeros are skipped (left as holes) instead of written.
struct SparseFile {
    file: File,
    pos: u64,
    len: u64,
}

const CHUNK: usize = 64 << 10;
static ZEROS: [u8; CHUNK] = [0; CHUNK];

impl Write for SparseFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(CHUNK - (self.pos % CHUNK as u64) as usize);
        let part = &buf[..n];
        if part != &ZEROS[..n] {
            self.file.seek(SeekFrom::Start(self.pos))?;
            self.file.write_all(part)?;
        }
        self.pos += n as u64;
        self.len = self.len.max(self.pos);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.set_len(self.len.max(self.file.metadata()?.len()))
    }
}

impl Seek for SparseFile {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.pos = match to {
            SeekFrom::Start(p) => p,
            SeekFrom::End(d) => self.len.checked_add_signed(d).unwrap(),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d).unwrap(),
        };
        Ok(self.pos)
    }
}

/// The small kernel past 4 GiB (not zeros: it is written, and read back).
fn tail_kernel() -> Vec<u8> {
    (0..10_000u32)
        .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
        .collect()
}

/// Kernels `#0` and `#1` (gfx1100, zeros; `#1` ends in a 1) and `#2` (gfx942, the tail), in
/// an archive of scheme `none` written by the library's writer: `#2`'s
/// blob starts past 4 GiB.
fn write_none_archive(path: &Path) {
    let zeros = vec![0u8; ZERO_KERNEL];
    // Not the same bytes as #0, or the writer would store it once (shared
    // code objects); one byte touched, the rest stays untouched memory.
    let mut other = vec![0u8; ZERO_KERNEL];
    other[ZERO_KERNEL - 1] = 1;
    let tail = tail_kernel();
    let mut w = ArchiveWriter::new("big", "gfx942", vec!["gfx1100".into(), "gfx942".into()])
        .scheme(Scheme::None);
    w.add(format!("{KEY}#0"), "gfx1100", &zeros[..], None)
        .unwrap();
    w.add(format!("{KEY}#1"), "gfx1100", &other[..], None)
        .unwrap();
    w.add(format!("{KEY}#2"), "gfx942", &tail[..], None)
        .unwrap();
    let mut sink = SparseFile {
        file: File::create(path).unwrap(),
        pos: 0,
        len: 0,
    };
    let s = w.write_to(&mut sink).unwrap();
    sink.flush().unwrap();
    assert!(s.bytes_out > 4 * GIB + tail.len() as u64);
}

/// An archive of scheme `zstd-per-kernel` whose zstd blob starts past
/// 4 GiB: the writer's small archive with a hole before its blob (header
/// and TOC offsets moved accordingly).
fn write_zstd_archive(path: &Path) {
    let tail = tail_kernel();
    let mut w = ArchiveWriter::new("big", "gfx942", vec!["gfx942".into()]);
    w.add(format!("{KEY}#0"), "gfx942", &tail[..], None)
        .unwrap();
    w.add(format!("{KEY}#1"), "gfx942", &tail[..100], None)
        .unwrap();
    let small = w.to_vec().unwrap();
    let shift = 4 * GIB + 12_345;
    let toc_offset = u64::from_le_bytes(small[8..16].try_into().unwrap());
    let mut toc = msgpack::decode(&small[toc_offset as usize..]).unwrap();
    let Value::Map(fields) = &mut toc else {
        panic!("TOC is a map")
    };
    for (k, v) in fields.iter_mut() {
        if k.as_str() == Some("zstd_offset") {
            *v = Value::from(64 + shift);
        }
    }
    let mut f = File::create(path).unwrap();
    let mut header = small[..64].to_vec();
    header[8..16].copy_from_slice(&(toc_offset + shift).to_le_bytes());
    f.write_all(&header).unwrap();
    f.seek(SeekFrom::Start(64 + shift)).unwrap();
    f.write_all(&small[64..toc_offset as usize]).unwrap();
    f.write_all(&msgpack::encode(&toc)).unwrap();
}

/// The disk blocks a file takes, in bytes.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// `kpack_get_kernel` of (key, target) through the C API.
fn capi_kernel(path: &Path, key: &str, target: &str) -> Vec<u8> {
    let p = c(path.to_str().unwrap());
    let mut a: *mut KpackArchive = std::ptr::null_mut();
    // SAFETY: valid C strings and out-pointers; the buffer is freed with
    // kpack_free_kernel, the handle closed.
    unsafe {
        assert_eq!(kpack_open(p.as_ptr(), &mut a) as i32, 0);
        let (k, t) = (c(key), c(target));
        let mut data: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        let e = kpack_get_kernel(a, k.as_ptr(), t.as_ptr(), &mut data, &mut size);
        assert_eq!(e as i32, 0, "kpack_get_kernel {key} {target}");
        let v = std::slice::from_raw_parts(data.cast::<u8>(), size).to_vec();
        kpack_free_kernel(data);
        kpack_close(a);
        v
    }
}

/// `kpack_load_code_object` for a binary in `dir/lib` whose metadata names
/// `dir/.kpack/<archive>`.
fn capi_load(dir: &Path, archive: &str, co: u32, arch: &str) -> Vec<u8> {
    let metadata = HipkMetadata::new(KEY, vec![format!("../.kpack/{archive}")]);
    // The runtime may read up to 64 KiB at the metadata's address.
    let mut window = metadata.encode();
    window.resize(64 << 10, 0);
    let binary = c(dir.join("lib/libbig.so").to_str().unwrap());
    let arch = c(arch);
    let archs: [*const c_char; 1] = [arch.as_ptr()];
    // SAFETY: valid pointers for the duration of the calls; the cache and
    // the code object are released.
    unsafe {
        let mut cache: *mut KpackCache = std::ptr::null_mut();
        assert_eq!(kpack_cache_create(&mut cache) as i32, 0);
        let mut data: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        let e = kpack_load_code_object(
            cache,
            window.as_ptr().cast(),
            binary.as_ptr(),
            co,
            archs.as_ptr(),
            1,
            &mut data,
            &mut size,
        );
        assert_eq!(e as i32, 0, "kpack_load_code_object #{co} {arch:?}");
        let v = std::slice::from_raw_parts(data.cast::<u8>(), size).to_vec();
        kpack_free_code_object(data);
        kpack_cache_destroy(cache);
        v
    }
}

#[test]
fn archives_over_4_gib_both_schemes() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    std::fs::create_dir_all(dir.join(".kpack")).unwrap();
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    let none = dir.join(".kpack/big_none.kpack");
    let zstd = dir.join(".kpack/big_zstd.kpack");
    write_none_archive(&none);
    write_zstd_archive(&zstd);
    let tail = tail_kernel();
    for path in [&none, &zstd] {
        let len = std::fs::metadata(path).unwrap().len();
        assert!(len > 4 * GIB, "{}: {len} bytes", path.display());
        assert!(allocated(path) < 64 << 20, "{}: not sparse", path.display());
    }

    // The library.
    let a = kpack_loader::open_archive(&none).unwrap();
    assert_eq!(a.scheme(), Scheme::None);
    let e = a.entry(&format!("{KEY}#0"), "gfx1100").unwrap();
    assert_eq!(e.original_size, ZERO_KERNEL as u64);
    assert_eq!(a.kernel(&format!("{KEY}#2"), "gfx942").unwrap(), tail);
    let z = kpack_loader::open_archive(&zstd).unwrap();
    assert_eq!(z.scheme(), Scheme::ZstdPerKernel);
    assert_eq!(z.kernel(&format!("{KEY}#0"), "gfx942").unwrap(), tail);
    assert_eq!(
        z.kernel(&format!("{KEY}#1"), "gfx942").unwrap(),
        &tail[..100]
    );

    // The C API.
    assert_eq!(capi_kernel(&none, &format!("{KEY}#2"), "gfx942"), tail);
    assert_eq!(
        capi_kernel(&zstd, &format!("{KEY}#1"), "gfx942"),
        &tail[..100]
    );
    assert_eq!(capi_load(dir, "big_none.kpack", 2, "gfx942"), tail);
    assert_eq!(capi_load(dir, "big_zstd.kpack", 0, "gfx942"), tail);

    // The loader.
    let loader = Loader::new(Config::default());
    let metadata = HipkMetadata::new(KEY, vec!["../.kpack/big_zstd.kpack".into()]).encode();
    let binary = dir.join("lib/libbig.so");
    let got = loader
        .load_code_object(&metadata, &binary, 1, &["gfx942:sramecc+:xnack-"])
        .unwrap();
    assert_eq!(got, &tail[..100]);

    // The CLI.
    let listing = kpack_ok(&[&"ls", &none, &"--json"]);
    assert!(listing.contains(&ZERO_KERNEL.to_string()), "{listing}");
    let out = dir.join("extracted");
    kpack_ok(&[&"extract", &zstd, &"-o", &out, &"--target", &"gfx942"]);
    let files = dir_files(&out);
    assert_eq!(
        files.len(),
        2,
        "{:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    assert!(files.iter().any(|(_, b)| *b == tail));
    let out = dir.join("extracted-none");
    kpack_ok(&[&"extract", &none, &"-o", &out, &"--target", &"gfx942"]);
    assert_eq!(
        dir_files(&out).into_iter().map(|f| f.1).collect::<Vec<_>>(),
        [tail]
    );
}

/// One kernel over 4 GiB cannot be an archive entry (its zstd frame length
/// is a u32): refused with its key and target; 4 GiB itself is accepted.
#[test]
fn a_kernel_over_4_gib_is_refused_by_name() {
    let huge = vec![0u8; (MAX_KERNEL_SIZE + 1) as usize];
    for scheme in [Scheme::None, Scheme::ZstdPerKernel] {
        let mut w = ArchiveWriter::new("g", "gfx942", vec!["gfx942".into()]).scheme(scheme);
        let e = w
            .add("lib/libhuge.so#3", "gfx942", &huge[..], None)
            .unwrap_err();
        assert!(matches!(e, ArchiveError::KernelTooLarge { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("lib/libhuge.so#3 @ gfx942"), "{msg}");
        assert!(msg.contains(&(MAX_KERNEL_SIZE + 1).to_string()), "{msg}");
        assert!(w.is_empty());
        w.add(
            "lib/libhuge.so#3",
            "gfx942",
            &huge[..MAX_KERNEL_SIZE as usize],
            None,
        )
        .unwrap();
    }
}
