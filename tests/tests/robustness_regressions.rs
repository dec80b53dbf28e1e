//! Regression tests for what fuzzing and the robustness work found (see
//! also `malformed.rs` and `robustness_paths.rs`). Each names the bug.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use kpack_format::archive::{Archive, Scheme};
use kpack_format::hipk::HipkMetadata;
use kpack_format::target::TargetId;
use kpack_host::elf::{ElfView, PhdrExt, LE, PHDR_SIZE, SHDR_SIZE};
use kpack_host::offload::{elf as offload_elf, TransformError};
use kpack_host::ArchiveWriter;
use kpack_loader::{Config, Loader};
use object::read::elf::{FileHeader as _, ProgramHeader as _};

fn meta() -> Vec<u8> {
    HipkMetadata::new(
        "lib/libfuzz.so",
        vec!["../.kpack/libfuzz_@GFXARCH@.kpack".into()],
    )
    .encode()
}

/// Fuzz inputs that once crashed the offload target (fuzz/regressions/).
fn regression_inputs(target: &str) -> Vec<PathBuf> {
    let dir = workspace().join("fuzz/regressions").join(target);
    let mut v: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// Why the transform refuses the saved fuzz input `fuzz/regressions/offload/{name}`.
fn refusal(name: &str) -> String {
    let b = fs::read(workspace().join("fuzz/regressions/offload").join(name)).unwrap();
    offload_elf::transform(&b, &meta()).unwrap_err().to_string()
}

/// Found by the `offload` fuzz target (an overflow, a panic in debug
/// builds): a section with an alignment of 2^64 - x among those the
/// program header table grows over. Now an error.
#[test]
fn transform_section_alignment_overflow() {
    let e = refusal("section-alignment-overflow.so");
    assert!(e.contains("unsupported alignment"), "{e}");
}

/// Every saved fuzz input: no panic in the transform or the verifier, and
/// the offload driver never writes an output that fails verification.
#[test]
fn transform_fuzz_regressions_never_panic() {
    let kpack_dir = tempfile::tempdir().unwrap();
    for p in regression_inputs("offload") {
        let b = fs::read(&p).unwrap();
        if let Ok(t) = offload_elf::transform(&b, &meta()) {
            let t_bytes = t.to_vec();
            let _ = kpack_host::offload::verify_elf(&t_bytes, Some(t.bundles));
        }
        let out = kpack_dir.path().join(p.file_name().unwrap());
        let o = kpack(&[
            &"offload",
            &p,
            &"-o",
            &out,
            &"--archive-dir",
            &kpack_dir.path().join(".kpack"),
        ]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!stderr.contains("panicked"), "{}: {stderr}", p.display());
        let host_only = kpack_host::binary::classify(&b) == kpack_host::binary::Class::HostOnly;
        if o.status.success() && host_only {
            assert_eq!(
                fs::read(&out).unwrap(),
                b,
                "{}: host code is copied",
                p.display()
            );
        } else if o.status.success() {
            kpack_ok(&[&"verify-elf", &out]);
        } else {
            assert!(!out.exists(), "{}: output written on failure", p.display());
        }
    }
}

/// Found by the `offload` fuzz target
/// (`regressions/offload/empty-section-in-removed-pages.so`): an empty
/// section whose offset lay among the pages the transform removes kept
/// that offset, past the end of the shorter output, which the verifier
/// then refused to parse. Now it is put where the removed pages were.
#[test]
fn transform_moves_empty_sections_out_of_the_removed_pages() {
    let mut b = fs::read(fixture("libvadd.so").path).unwrap();
    let h = ElfView::parse(&b).unwrap();
    let f = h.section(".hip_fatbin").unwrap().unwrap();
    let comment = h.section_index(".comment").unwrap();
    let inside = f.offset + f.size / 2;
    let at = h.header().e_shoff(LE) as usize + comment * SHDR_SIZE;
    b[at + 24..at + 32].copy_from_slice(&inside.to_le_bytes()); // sh_offset
    b[at + 32..at + 40].copy_from_slice(&0u64.to_le_bytes()); // sh_size
    let t = offload_elf::transform(&b, &meta()).unwrap();
    let t_bytes = t.to_vec();
    assert!(t.removed > 0, "the fixture's pages are cut");
    kpack_host::offload::verify_elf(&t_bytes, Some(t.bundles)).unwrap();
    let out = ElfView::parse(&t_bytes).unwrap();
    let moved = out.sections().unwrap()[comment].offset;
    assert!(
        moved < inside && moved <= t_bytes.len() as u64,
        "{moved:#x}"
    );
    // And (`null-section-header-in-removed-pages.so`) inactive SHT_NULL
    // headers, the first one included, whose fields point there: they mean
    // nothing, and are neither refused nor read.
    let first = at - comment * SHDR_SIZE;
    for at in [first, at] {
        b[at + 4..at + 8].copy_from_slice(&0u32.to_le_bytes()); // SHT_NULL
        b[at + 24..at + 32].copy_from_slice(&inside.to_le_bytes());
        b[at + 32..at + 40].copy_from_slice(&4096u64.to_le_bytes());
    }
    let t = offload_elf::transform(&b, &meta()).unwrap();
    let t_bytes = t.to_vec();
    kpack_host::offload::verify_elf(&t_bytes, Some(t.bundles)).unwrap();
    for p in regression_inputs("offload") {
        let b = fs::read(&p).unwrap();
        if let Ok(t) = offload_elf::transform(&b, &meta()) {
            let t_bytes = t.to_vec();
            if let Err(kpack_host::offload::VerifyError::Elf(e)) =
                kpack_host::offload::verify_elf(&t_bytes, Some(t.bundles))
            {
                panic!("{}: the output does not parse: {e}", p.display());
            }
        }
    }
}

/// Found by the `offload` fuzz target
/// (`regressions/offload/packed-relocation-of-the-elf-header.so`): packed
/// (RELR) relocations applying to the ELF header, which the transform
/// rewrites, gave an output whose relocated header words then pointed into
/// the removed pages. Now refused. And, looking at it, packed relocations
/// were not checked against the sections that move to make room for a
/// program header, as RELA ones were: a pointer to one is now refused too
/// instead of left pointing at the old place.
#[test]
fn transform_refuses_packed_relocations_of_rewritten_bytes() {
    let e = refusal("packed-relocation-of-the-elf-header.so");
    assert!(e.contains("applies to the ELF header"), "{e}");

    let mut b = fs::read(fixture("libvadd_relr.so").path).unwrap();
    let h = ElfView::parse(&b).unwrap();
    let relocated = h.relr().unwrap()[0];
    let sections = h.sections().unwrap();
    let data = sections
        .iter()
        .find(|s| s.size > 0 && (s.addr..s.addr + s.size).contains(&relocated))
        .unwrap();
    let dynsym = h.section(".dynsym").unwrap().unwrap().addr;
    let at = (relocated - data.addr + data.offset) as usize;
    drop(sections);
    let t = offload_elf::transform(&b, &meta()).unwrap();
    let t_bytes = t.to_vec();
    assert!(t_bytes.len() < b.len(), "the fixture's sections move");
    b[at..at + 8].copy_from_slice(&(dynsym + 8).to_le_bytes());
    let Err(e) = offload_elf::transform(&b, &meta()) else {
        panic!("a pointer to .dynsym, which moves, was left as it was");
    };
    assert!(e.to_string().contains("must move"), "{e}");
}

/// Found by the `offload` fuzz target (`regressions/offload/fatbin-of-zeros.so`):
/// a `.hip_fatbin` of zeros only is host code (`classify` says so, and the
/// commands copy such a binary), but the transform, called directly,
/// rewrote it. Now it refuses: there is no bundle to move.
#[test]
fn transform_refuses_a_fatbin_without_bundles() {
    let mut b = fs::read(fixture("libvadd.so").path).unwrap();
    let h = ElfView::parse(&b).unwrap();
    let f = h.section(".hip_fatbin").unwrap().unwrap();
    let range = f.offset as usize..(f.offset + f.size) as usize;
    b[range].fill(0);
    assert_eq!(
        kpack_host::binary::classify(&b),
        kpack_host::binary::Class::HostOnly
    );
    assert_eq!(
        offload_elf::transform(&b, &meta()).unwrap_err(),
        TransformError::NoBundles
    );
}

/// Found by the `offload` fuzz target
/// (`regressions/offload/moved-section-with-bytes-elsewhere.so`): a section
/// whose address lay among those that move to make room for a program
/// header, but whose bytes lay elsewhere, was moved by its address and its
/// offset sent past the end of the file. Now refused.
#[test]
fn transform_refuses_layouts_it_cannot_keep_sound() {
    let e = refusal("moved-section-with-bytes-elsewhere.so");
    assert!(
        e.contains(".gnu.hash is not laid out like its neighbours"),
        "{e}"
    );
    // (`empty-load-below-the-split.so`) An empty PT_LOAD after the one
    // holding `.hip_fatbin` but at a lower address: in order in the input
    // (empty), out of order once that segment is split.
    let e = refusal("empty-load-below-the-split.so");
    assert!(e.contains("starts below its end"), "{e}");
}

/// Found by the `offload` fuzz target: a fat binary whose `.hip_fatbin`
/// lies in a writable PT_LOAD (e.g. linked with `ld -N`) was rewritten with
/// the metadata there, which the verifier then rejected as an internal
/// error. Then the transform refused it; now the metadata goes into a
/// read-only segment (here, with the section in the middle of the segment,
/// one of its own after the others; see the transform's unit tests for
/// what is still refused).
#[test]
fn writable_fatbin_segment() {
    let mut b = fs::read(fixture("libvadd.so").path).unwrap();
    let h = ElfView::parse(&b).unwrap();
    let f = h.section(".hip_fatbin").unwrap().unwrap();
    let (i, _) = h
        .phdrs()
        .iter()
        .enumerate()
        .find(|(_, p)| p.is_load() && p.file_contains(f.offset, f.size))
        .unwrap();
    let at = h.header().e_phoff(LE) as usize + i * PHDR_SIZE + 4;
    b[at] |= 2; // PF_W
    let t = offload_elf::transform(&b, &meta()).unwrap();
    let v = kpack_host::offload::verify_elf(&t.to_vec(), Some(t.bundles)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("libw.so");
    fs::write(&input, &b).unwrap();
    let out = dir.path().join("out/libw.so");
    kpack_ok(&[
        &"offload",
        &input,
        &"-o",
        &out,
        &"--archive-dir",
        &dir.path().join("out/.kpack"),
    ]);
    kpack_ok(&[&"verify-elf", &"--offloaded", &out]);
    let written = fs::read(&out).unwrap();
    let o = ElfView::parse(&written).unwrap();
    let meta_seg = o
        .phdrs()
        .iter()
        .find(|p| p.is_load() && p.mem_contains(v.metadata_addr, 1))
        .unwrap();
    assert_eq!(
        meta_seg.p_flags.get(LE) & 2,
        0,
        "the metadata's segment is read-only"
    );
}

/// Found by the `offload` fuzz target: a fat binary without wrappers (an
/// empty `.hipFatBinSegment`) was offloaded, but the result was then seen
/// as "half offloaded" and a rerun failed. Now a rerun is a no-op. (And
/// found writing this test: copying an already offloaded binary into a
/// directory that did not exist yet failed.)
#[test]
fn offloaded_binary_without_wrappers_reruns() {
    // An executable: no relocation points at the bundle either.
    let mut b = fs::read(fixture("vadd_nopie").path).unwrap();
    let h = ElfView::parse(&b).unwrap();
    let i = h.section_index(".hipFatBinSegment").unwrap();
    let at = h.header().e_shoff(LE) as usize + i * SHDR_SIZE + 32; // sh_size
    b[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("libnowrap.so");
    fs::write(&input, &b).unwrap();
    let out = dir.path().join("lib/libnowrap.so");
    let ar = dir.path().join(".kpack");
    kpack_ok(&[&"offload", &input, &"-o", &out, &"--archive-dir", &ar]);
    kpack_ok(&[&"verify-elf", &out]);
    let again = dir.path().join("lib2/libnowrap.so");
    let o = kpack(&[&"offload", &out, &"-o", &again, &"--archive-dir", &ar]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already offloaded"));
    assert_eq!(fs::read(&again).unwrap(), fs::read(&out).unwrap());
}

/// Found by review while writing the `target_id` fuzz target (the runtime
/// expands every requested architecture into its 2^n compatible targets):
/// `gfx942:a+:b+:...` with 40 features made `kpack_load_code_object` try
/// 2^40 targets. Target IDs now have at most 8 features.
#[test]
fn target_ids_with_many_features_are_refused_quickly() {
    let many: String = std::iter::once("gfx942".to_string())
        .chain((0..40).map(|i| format!("f{i}+")))
        .collect::<Vec<_>>()
        .join(":");
    assert!(TargetId::parse(&many).is_err());
    let eight: String = std::iter::once("gfx942".to_string())
        .chain((0..8).map(|i| format!("f{i}+")))
        .collect::<Vec<_>>()
        .join(":");
    assert_eq!(
        TargetId::parse(&eight).unwrap().compatible_targets().len(),
        256
    );
    let loader = Loader::new(Config::default());
    let clock = Instant::now();
    let r = loader.load_code_object(&meta(), Path::new("/nonexistent/lib/x.so"), 0, &[&many]);
    assert!(r.is_err());
    assert!(clock.elapsed() < Duration::from_secs(5));
}

/// Found by the `hipk` fuzz target (1,200 executions a second): the C API
/// read metadata through a window that grew by the bytes the decoder said
/// it lacked, each step decoding everything again: 60 KB of valid metadata
/// (30,000 search paths) took 150 s to load. The metadata is now decoded
/// once, as a stream: every byte is read once.
#[test]
fn metadata_window_grows_in_few_steps() {
    struct Counting<'a>(&'a [u8], usize);
    impl std::io::Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1 += n;
            Ok(n)
        }
    }
    let m = HipkMetadata::new("k", vec!["a".into(); 30_000]).encode();
    assert!(m.len() > 60_000);
    let mut rd = Counting(&m, 0);
    let clock = Instant::now();
    let got = HipkMetadata::read(&mut rd).unwrap();
    assert_eq!(got.search_paths.len(), 30_000);
    assert_eq!(rd.1, m.len(), "bytes read");
    assert!(clock.elapsed() < Duration::from_secs(2));
}

/// Found by the malformed corpus: a TOC claiming a huge `original_size`
/// made `kpack_get_kernel` (and the loader) allocate that much before
/// checking the frame, and report OUT_OF_MEMORY for a corrupt archive. Now
/// `Archive::check` runs first: DECOMPRESSION_FAILED, nothing allocated.
/// Also for a frame that records no content size: its length bounds what
/// it can decompress to.
#[test]
fn claimed_sizes_are_checked_before_allocating() {
    // A zstd frame without a content size, 9 bytes of data.
    let mut frame = zstd::bulk::Compressor::new(3).unwrap();
    frame.include_contentsize(false).unwrap();
    let frame = frame.compress(b"123456789").unwrap();
    assert!(zstd::zstd_safe::get_frame_content_size(&frame)
        .unwrap()
        .is_none());
    let mut w =
        ArchiveWriter::new("g", "gfx1100", vec!["gfx1100".into()]).scheme(Scheme::ZstdPerKernel);
    w.add("k#0", "gfx1100", &b"123456789"[..], None).unwrap();
    let good = w.to_vec().unwrap();
    let toc_offset = u64::from_le_bytes(good[8..16].try_into().unwrap()) as usize;
    let mut toc = kpack_format::msgpack::decode(&good[toc_offset..]).unwrap();
    let mut b = good[..64].to_vec();
    b.extend(1u32.to_le_bytes());
    b.extend((frame.len() as u32).to_le_bytes());
    b.extend(&frame);
    let new_toc = b.len() as u64;
    b[8..16].copy_from_slice(&new_toc.to_le_bytes());
    set(&mut toc, &["zstd_size"], (8 + frame.len()) as u64);
    for (size, ok) in [(9u64, true), (3 << 30, false)] {
        set(&mut toc, &["toc", "k#0", "gfx1100", "original_size"], size);
        let mut bytes = b.clone();
        bytes.extend(kpack_format::msgpack::encode(&toc));
        let a = Archive::from_bytes(bytes.clone()).unwrap();
        let e = a.entry("k#0", "gfx1100").unwrap();
        assert_eq!(a.check(e).is_ok(), ok, "original_size {size}");
        if ok {
            assert_eq!(a.kernel("k#0", "gfx1100").unwrap(), b"123456789");
            continue;
        }
        let err = a.check(e).unwrap_err().to_string();
        assert!(err.contains("more than a"), "{err}");
        // Through the C API: DECOMPRESSION_FAILED, not OUT_OF_MEMORY.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.kpack");
        fs::write(&p, &bytes).unwrap();
        let c = cpath(&p);
        // SAFETY: valid strings and out-pointers; the handle is closed once.
        unsafe {
            use rocm_kpack::*;
            let mut h = std::ptr::null_mut();
            assert_eq!(kpack_open(c.as_ptr(), &mut h), KpackError::Success);
            let (mut data, mut n) = (std::ptr::null_mut(), 0usize);
            let e = kpack_get_kernel(h, c"k#0".as_ptr(), c"gfx1100".as_ptr(), &mut data, &mut n);
            assert_eq!(e, KpackError::DecompressionFailed);
            assert!(data.is_null());
            kpack_close(h);
        }
    }
}

fn set(v: &mut kpack_format::msgpack::Value, path: &[&str], n: u64) {
    use kpack_format::msgpack::Value;
    let mut cur = v;
    for key in path {
        let Value::Map(m) = cur else {
            panic!("not a map at {key}")
        };
        cur = &mut m
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))
            .unwrap()
            .1;
    }
    *cur = Value::from(n);
}

/// Found by the malformed corpus: an error whose message already contains
/// its cause printed the cause a second time.
#[test]
fn error_messages_do_not_repeat_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.kpack");
    let mut b = b"KPAK\x01\0\0\0".to_vec();
    b.extend(64u64.to_le_bytes());
    b.resize(64, 0);
    b.push(0xc1);
    fs::write(&p, b).unwrap();
    let err = kpack_fails(&[&"ls", &p]);
    assert_eq!(
        err.matches("is not a MessagePack type marker").count(),
        1,
        "{err}"
    );
}

/// Found by the `offload` fuzz target (`note-overlapping-the-moved-block.so`):
/// a note section overlapping the dynamic tables after it (its size
/// mutated) was placed apart from the moved block, taking those tables'
/// bytes with it as they were, while their rewritten copy moved with the
/// block: a wrapper's relocation then still pointed at the removed bytes.
/// Such a note now moves with the block; the output verifies.
#[test]
fn a_note_overlapping_other_sections_moves_with_the_block() {
    let b =
        fs::read(workspace().join("fuzz/regressions/offload/note-overlapping-the-moved-block.so"))
            .unwrap();
    let t = offload_elf::transform(&b, &meta()).unwrap();
    let v = kpack_host::offload::verify_elf(&t.to_vec(), Some(t.bundles)).unwrap();
    assert_eq!(v.metadata_addr, t.metadata_addr);
    assert_eq!(v.co_indices.len(), t.wrappers.len());
}

/// Found by the `offload` fuzz target
/// (`writable-segment-starting-with-the-section.so`): a writable segment
/// that starts with `.hip_fatbin` and goes on after it (the metadata then
/// goes into a segment of its own at the end) was left as an empty
/// `PT_LOAD` before the part after the section, sharing its file offset.
/// Now no segment is made of nothing; the output verifies.
#[test]
fn a_writable_segment_starting_with_the_section_leaves_no_empty_segment() {
    let b = fs::read(
        workspace().join("fuzz/regressions/offload/writable-segment-starting-with-the-section.so"),
    )
    .unwrap();
    let t = offload_elf::transform(&b, &meta()).unwrap();
    let out = t.to_vec();
    kpack_host::offload::verify_elf(&out, Some(t.bundles)).unwrap();
    let h = ElfView::parse(&out).unwrap();
    assert!(h.phdrs().iter().all(|p| !p.is_load() || p.p_memsz(LE) > 0));
}
