//! Ground truth: for every target of every fixture, and of Debian's
//! librocrand, what `kpack extract` writes equals what LLVM's
//! `clang-offload-bundler --unbundle` writes, byte for byte.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;

fn check(binary: &Path) -> usize {
    let scratch = tempfile::tempdir().unwrap();
    let fatbin = objcopy_section(binary, ".hip_fatbin", scratch.path());
    assert!(!fatbin.is_empty(), "{}: no .hip_fatbin", binary.display());
    let several = split_bundles(&fatbin).len() > 1;
    let mut expected = BTreeMap::new();
    for ((i, target), bytes) in code_objects(binary) {
        let name = if several {
            format!("{target}#{i}.hsaco")
        } else {
            format!("{target}.hsaco")
        };
        assert!(expected.insert(name, bytes).is_none());
    }
    assert!(
        !expected.is_empty(),
        "{}: the bundler found no device code",
        binary.display()
    );
    let out = scratch.path().join("kpack-out");
    kpack_ok(&[&"extract", &binary, &"-o", &out]);
    let got: BTreeMap<String, Vec<u8>> = dir_files(&out).into_iter().collect();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "{}: different code objects",
        binary.display()
    );
    for (name, bytes) in &expected {
        assert!(
            got[name] == *bytes,
            "{}: {name} differs from clang-offload-bundler's",
            binary.display()
        );
    }
    expected.len()
}

/// One test per fixture, and the list of the fixtures covered.
macro_rules! ground_truth {
    ($($test:ident => $fixture:expr),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                let f = fixture($fixture);
                let n = check(&f.path);
                assert_eq!(n, f.code_objects(), "{}: code object count", f.name);
            }
        )*
        const COVERED: &[&str] = &[$($fixture),*];
    };
}

ground_truth! {
    libvadd => "libvadd.so",
    vadd_pie => "vadd_pie",
    vadd_nopie => "vadd_nopie",
    libvadd_compressed => "libvadd_compressed.so",
    librdc => "librdc.so",
    libvadd_newdriver => "libvadd_newdriver.so",
    librdc_newdriver => "librdc_newdriver.so",
    libmulti => "libmulti.so",
    libmixed => "libmixed.so",
    libwide => "libwide.so",
    libvadd_relr => "libvadd_relr.so",
    libvadd_dwarf4 => "libvadd_dwarf4.so",
    libvadd_after_bss_bfd => "libvadd_after_bss_bfd.so",
    libvadd_after_bss_lld => "libvadd_after_bss_lld.so",
    libvadd_fatbin_after_bss_bfd => "libvadd_fatbin_after_bss_bfd.so",
    libvadd_fatbin_after_bss_lld => "libvadd_fatbin_after_bss_lld.so",
    libvadd_before_data_bfd => "libvadd_before_data_bfd.so",
    libvadd_before_data_lld => "libvadd_before_data_lld.so",
    libvadd_two_loads_bfd => "libvadd_two_loads_bfd.so",
}

#[test]
fn librocrand() {
    let n = check(Path::new(LIBROCRAND));
    assert!(n >= 7, "librocrand: {n} code objects");
}

/// Every fixture in fixtures.json with device code is covered above.
#[test]
fn every_fixture_is_checked() {
    for f in fixtures() {
        if f.device_code() {
            assert!(
                COVERED.contains(&f.name.as_str()),
                "fixture {} has no ground-truth test",
                f.name
            );
        }
    }
}
