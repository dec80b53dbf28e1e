//! The benchmarks' inputs (`kpack_testkit::inputs`) read fat binaries on
//! their own: their code objects are clang-offload-bundler's, in the files
//! where they say; a copy differs from its library in one byte of each;
//! the device code file holds every code object by target, then bundle.

use kpack_testkit::inputs::rocm::{code_objects, write_copy, write_device_code, Mapped};

use crate::common::*;

/// libwide.so: a plain bundle of many targets.
const FIXTURE: &str = "libwide.so";

/// Compressed bundles are refused, the file named: the inputs are made
/// from plain ones.
#[test]
fn compressed_bundles_are_refused() {
    let f = fixture("libmulti.so");
    let map = Mapped::open(&f.path).unwrap();
    let e = code_objects(&f.path, &map).unwrap_err().to_string();
    assert!(
        e.contains("libmulti.so") && e.contains("is compressed"),
        "{e}"
    );
}

#[test]
fn code_objects_are_the_bundlers() {
    let f = fixture(FIXTURE);
    let map = Mapped::open(&f.path).unwrap();
    let (cos, bundles) = code_objects(&f.path, &map).unwrap();
    assert_eq!(bundles.len(), f.bundles);
    let want = kpack_testkit::oracle::code_objects(&f.path).unwrap();
    assert_eq!(cos.len(), want.len());
    for co in &cos {
        let bundle = &bundles[co.bundle];
        assert!(bundle.start <= co.range.start && co.range.end <= bundle.end);
        let bytes = &want[&(co.bundle, co.target().to_string())];
        assert_eq!(
            map.bytes(&co.range),
            &bytes[..],
            "{}#{}",
            co.target(),
            co.bundle
        );
    }
}

#[test]
fn a_copy_differs_in_the_middle_byte_of_each_code_object() {
    let f = fixture(FIXTURE);
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.so");
    write_copy(&f.path, &copy, 3).unwrap();
    let (orig, new) = (
        std::fs::read(&f.path).unwrap(),
        std::fs::read(&copy).unwrap(),
    );
    assert_eq!(orig.len(), new.len());
    let map = Mapped::open(&f.path).unwrap();
    let (cos, _) = code_objects(&f.path, &map).unwrap();
    let mut middles: Vec<usize> = cos
        .iter()
        .filter(|c| !c.range.is_empty())
        .map(|c| (c.range.start + (c.range.end - c.range.start) / 2) as usize)
        .collect();
    middles.sort();
    let changed: Vec<usize> = (0..orig.len()).filter(|&i| orig[i] != new[i]).collect();
    assert_eq!(changed, middles);
    assert!(changed.iter().all(|&i| orig[i] ^ new[i] == 3));
}

#[test]
fn device_code_is_every_code_object_by_target_then_bundle() {
    let f = fixture(FIXTURE);
    let dir = tempfile::tempdir().unwrap();
    let (out, files) = (dir.path().join("device.bin"), dir.path().join("files"));
    let (n, names) = write_device_code(&f.path, &out, &files).unwrap();
    let want = kpack_testkit::oracle::code_objects(&f.path).unwrap();
    let mut order: Vec<(&String, usize)> = want.keys().map(|(b, t)| (t, *b)).collect();
    order.sort();
    let all: Vec<u8> = order
        .iter()
        .flat_map(|(t, b)| want[&(*b, t.to_string())].clone())
        .collect();
    assert_eq!(std::fs::read(&out).unwrap(), all);
    assert_eq!(n, all.len() as u64);
    let expected: Vec<String> = order
        .iter()
        .map(|(t, b)| format!("{t}#{b}.hsaco"))
        .collect();
    assert_eq!(names, expected);
    for ((t, b), name) in order.iter().zip(&names) {
        assert_eq!(
            std::fs::read(files.join(name)).unwrap(),
            want[&(*b, t.to_string())]
        );
    }
}

/// The system's host-only libraries: as many as asked, sorted, each an
/// ELF shared library without device code.
#[test]
fn host_libraries_have_no_device_code() {
    let libs = kpack_testkit::inputs::rocm::host_libraries(12).unwrap();
    assert_eq!(libs.len(), 12, "{libs:?}");
    assert!(libs.windows(2).all(|w| w[0] < w[1]));
    let scratch = tempfile::tempdir().unwrap();
    for l in &libs {
        let head = std::fs::read(l).unwrap();
        assert_eq!(&head[..4], b"\x7fELF", "{}", l.display());
        let fatbin = objcopy_section(l, ".hip_fatbin", scratch.path());
        assert!(fatbin.is_empty(), "{}", l.display());
    }
}
