//! `kpack ls` and `kpack extract` on the reference implementation's
//! archives give exactly the documented contents.

use crate::common::*;

fn bytes(head: &[u8], tail: &[(usize, u8)]) -> Vec<u8> {
    let mut v = head.to_vec();
    for &(n, b) in tail {
        v.extend(std::iter::repeat_n(b, n));
    }
    v
}

#[test]
fn noop_reference_archive() {
    let p = reference_archive("test_noop.kpack");
    let v: serde_json::Value = serde_json::from_str(&kpack_ok(&[&"ls", &p, &"--json"])).unwrap();
    assert_eq!(v["kind"], "archive");
    assert_eq!(v["group_name"], "test");
    assert_eq!(v["gfx_arch_family"], "gfx900X");
    assert_eq!(v["gfx_arches"], serde_json::json!(["gfx900", "gfx906"]));
    assert_eq!(v["compression_scheme"], "none");
    assert_eq!(v["kernels"].as_array().unwrap().len(), 3);
    let dir = tempfile::tempdir().unwrap();
    kpack_ok(&[&"extract", &p, &"-o", &dir.path()]);
    let files = dir_files(dir.path());
    let want = vec![
        (
            "bin%2Ftestapp#0@gfx900.hsaco".to_string(),
            bytes(b"KERNEL3_APP_GFX900", &[(150, 0xff)]),
        ),
        (
            "lib%2Flibtest.so#0@gfx900.hsaco".to_string(),
            bytes(b"KERNEL1_GFX900_DATA", &[(100, 0)]),
        ),
        (
            "lib%2Flibtest.so#0@gfx906.hsaco".to_string(),
            bytes(b"KERNEL2_GFX906_DATA", &[(200, 0)]),
        ),
    ];
    assert_eq!(files, want);
}

#[test]
fn zstd_reference_archive() {
    let p = reference_archive("test_zstd.kpack");
    let text = kpack_ok(&[&"ls", &p]);
    assert!(
        text.contains("zstd-per-kernel") && text.contains("gfx110X"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    kpack_ok(&[&"extract", &p, &"-o", &dir.path(), &"--target", &"gfx1100"]);
    let files = dir_files(dir.path());
    let want = vec![
        (
            "bin%2Fhiptest#0@gfx1100.hsaco".to_string(),
            bytes(b"TEST_APP_KERNEL___", &[(1000, 0x42)]),
        ),
        (
            "lib%2Flibhip.so#0@gfx1100.hsaco".to_string(),
            bytes(b"HIP_KERNEL_GFX1100_", &[(500, b'A'), (500, b'B')]),
        ),
    ];
    assert_eq!(files, want);
    let dir2 = tempfile::tempdir().unwrap();
    kpack_ok(&[&"extract", &p, &"-o", &dir2.path()]);
    let all = dir_files(dir2.path());
    assert_eq!(all.len(), 3);
    assert_eq!(all[2].0, "lib%2Flibhip.so#0@gfx1101.hsaco");
    assert_eq!(
        all[2].1,
        bytes(b"HIP_KERNEL_GFX1101_", &[(300, b'X'), (300, b'Y')])
    );
}
