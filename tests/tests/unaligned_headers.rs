//! The reference implementation's tools write offloaded binaries whose
//! section header table is not 8-byte aligned; readelf, eu-elflint and
//! ld.so accept them, and so must `kpack ls`, `extract` and `verify-elf`.

use std::fs;
use std::process::Command;

use crate::common::*;

/// Move the section header table of an ELF file to an odd offset at its end.
fn unalign_section_headers(b: &[u8]) -> Vec<u8> {
    let shoff = u64::from_le_bytes(b[0x28..0x30].try_into().unwrap()) as usize;
    let shnum = u16::from_le_bytes(b[0x3c..0x3e].try_into().unwrap()) as usize;
    let table = b[shoff..shoff + shnum * 64].to_vec();
    let mut out = b.to_vec();
    out.resize(out.len().div_ceil(8) * 8 + 3, 0);
    let new_off = out.len() as u64;
    out.extend_from_slice(&table);
    out[0x28..0x30].copy_from_slice(&new_off.to_le_bytes());
    out
}

#[test]
fn offloaded_binary_with_unaligned_section_headers() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("lib/libvadd.so");
    kpack_ok(&[
        &"offload",
        &fixture("libvadd.so").path,
        &"-o",
        &lib,
        &"--archive-dir",
        &dir.path().join(".kpack"),
    ]);
    let odd = unalign_section_headers(&fs::read(&lib).unwrap());
    let shoff = u64::from_le_bytes(odd[0x28..0x30].try_into().unwrap());
    assert_eq!(shoff % 8, 3);
    fs::write(&lib, &odd).unwrap();
    // readelf agrees the file is fine.
    let re = Command::new("readelf")
        .arg("-SW")
        .arg(&lib)
        .output()
        .unwrap();
    assert!(re.status.success());
    assert!(String::from_utf8_lossy(&re.stderr).trim().is_empty());
    assert!(String::from_utf8_lossy(&re.stdout).contains(".rocm_kpack_ref"));

    let v = kpack_ok(&[&"verify-elf", &lib, &"--json"]);
    assert!(v.contains("kernel_name"), "{v}");
    let ls = kpack_ok(&[&"ls", &lib]);
    assert!(ls.contains("libvadd.so"), "{ls}");
    let out = dir.path().join("x");
    kpack_ok(&[&"extract", &lib, &"-o", &out]);
    let n = fs::read_dir(&out).unwrap().count();
    assert_eq!(n, fixture("libvadd.so").targets.len());
}
