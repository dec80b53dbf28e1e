//! Binaries the reference tools offloaded, with the two defects they
//! shipped that still load and run (formats.md §4.3): a `.hip_fatbin` with
//! no whole page left PROGBITS with its bytes, and a `PT_PHDR` larger than
//! the program header table. kpack judges them as offloaded binaries:
//! `verify-elf` accepts them with a warning naming the quirk, `ls`, `why`
//! and `extract` resolve through the archives, and the runtime gets HIPK
//! wrappers. kpack's own outputs are still held to every rule, and damage
//! (a wrong magic, overwritten metadata) is still an error.
//!
//! The reference outputs are generated here, from the reference's
//! published behaviour (rocm-kpack's ELF offload, 2026): the metadata is
//! appended to the file as `.rocm_kpack_ref` in a new read-only `PT_LOAD`
//! above every other segment; the program header table, which must grow,
//! moves to the end of the file into a `PT_LOAD` of its own with room for
//! 16 entries, and `PT_PHDR` describes that whole room; in an executable
//! that segment is pinned to `p_vaddr == p_offset`; a new section header
//! table and `.shstrtab` are written at the end; each wrapper becomes HIPK,
//! its relocation's addend the metadata's address, `reserved1` the
//! wrapper's index; only whole pages of `.hip_fatbin` are removed, so a
//! section smaller than a page stays as it was.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use kpack_format::bytes::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use kpack_format::hipk::{HipkMetadata, HIPF_MAGIC, HIPK_MAGIC};
use serde_json::Value;

const PAGE: u64 = 4096;
const PHDR: usize = 56;
const SHDR: usize = 64;
const PT_LOAD: u32 = 1;
const PT_INTERP: u32 = 3;
const PT_PHDR: u32 = 6;
const PF_R: u32 = 4;

fn up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

fn u16a(b: &[u8], at: usize) -> u16 {
    u16_at(b, at as u64).unwrap()
}
fn u32a(b: &[u8], at: usize) -> u32 {
    u32_at(b, at as u64).unwrap()
}
fn u64a(b: &[u8], at: usize) -> u64 {
    u64_at(b, at as u64).unwrap()
}

/// A section header, as read.
struct Shdr {
    name: u32,
    typ: u32,
    addr: u64,
    offset: u64,
    size: u64,
}

fn shdr(b: &[u8], at: usize) -> Shdr {
    Shdr {
        name: u32a(b, at),
        typ: u32a(b, at + 4),
        addr: u64a(b, at + 16),
        offset: u64a(b, at + 24),
        size: u64a(b, at + 32),
    }
}

/// What the reference's ELF offload writes for `input` (an x86-64 ELF
/// whose wrapper pointers are set by `R_X86_64_RELATIVE` relocations) with
/// the metadata `meta`.
fn reference_offload(input: &[u8], meta: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    let (phoff, shoff) = (u64a(input, 32) as usize, u64a(input, 40) as usize);
    let (phnum, shnum, shstrndx) = (
        u16a(input, 56) as usize,
        u16a(input, 60) as usize,
        u16a(input, 62) as usize,
    );
    let mut phdrs: Vec<Vec<u8>> = (0..phnum)
        .map(|i| input[phoff + i * PHDR..phoff + (i + 1) * PHDR].to_vec())
        .collect();
    let is_exec = phdrs.iter().any(|p| u32a(p, 0) == PT_INTERP);
    let max_end = phdrs
        .iter()
        .filter(|p| u32a(p, 0) == PT_LOAD)
        .map(|p| u64a(p, 16) + u64a(p, 40))
        .max()
        .unwrap();
    let pad_to = |out: &mut Vec<u8>, a: u64| {
        let n = up(out.len() as u64, a) as usize;
        out.resize(n, 0);
    };

    // The metadata, in a read-only PT_LOAD above every segment.
    pad_to(&mut out, PAGE);
    let (meta_off, meta_addr) = (out.len() as u64, up(max_end, PAGE));
    out.extend_from_slice(meta);
    let load = |flags: u32, off: u64, addr: u64, size: u64| {
        let mut p = vec![0u8; PHDR];
        put_u32(&mut p, 0, PT_LOAD);
        put_u32(&mut p, 4, flags);
        put_u64(&mut p, 8, off);
        put_u64(&mut p, 16, addr);
        put_u64(&mut p, 24, addr);
        put_u64(&mut p, 32, size);
        put_u64(&mut p, 40, size);
        put_u64(&mut p, 48, PAGE);
        p
    };
    phdrs.push(load(PF_R, meta_off, meta_addr, meta.len() as u64));

    // The section: a new .shstrtab with its name, a new header table.
    let names = shdr(input, shoff + shstrndx * SHDR);
    let mut strtab = input[names.offset as usize..(names.offset + names.size) as usize].to_vec();
    let name_at = strtab.len() as u32;
    strtab.extend_from_slice(b".rocm_kpack_ref\0");
    let strtab_off = out.len() as u64;
    out.extend_from_slice(&strtab);
    pad_to(&mut out, 8);
    let new_shoff = out.len();
    out.extend_from_slice(&input[shoff..shoff + shnum * SHDR]);
    let at = new_shoff + shstrndx * SHDR;
    put_u64(&mut out, at + 24, strtab_off);
    put_u64(&mut out, at + 32, strtab.len() as u64);
    let mut sec = vec![0u8; SHDR];
    put_u32(&mut sec, 0, name_at);
    put_u32(&mut sec, 4, 1); // PROGBITS
    put_u64(&mut sec, 8, 2); // SHF_ALLOC
    put_u64(&mut sec, 16, meta_addr);
    put_u64(&mut sec, 24, meta_off);
    put_u64(&mut sec, 32, meta.len() as u64);
    put_u64(&mut sec, 48, 1);
    out.extend_from_slice(&sec);
    put_u64(&mut out, 40, new_shoff as u64);
    put_u16(&mut out, 60, (shnum + 1) as u16);

    // The program header table, moved to the end with room for 16 entries;
    // in an executable pinned to p_vaddr == p_offset above every segment.
    let capacity = (phdrs.len() + 1).div_ceil(16) * 16;
    let room = (capacity * PHDR) as u64;
    let ceiling = up(meta_addr + meta.len() as u64, PAGE);
    let table_off = if is_exec {
        up((out.len() as u64).max(ceiling), PAGE)
    } else {
        up(out.len() as u64, PAGE)
    };
    let table_addr = if is_exec { table_off } else { ceiling };
    out.resize(table_off as usize, 0);
    for p in phdrs.iter_mut().filter(|p| u32a(p, 0) == PT_PHDR) {
        put_u64(p, 8, table_off);
        put_u64(p, 16, table_addr);
        put_u64(p, 24, table_addr);
        put_u64(p, 32, room);
        put_u64(p, 40, room);
    }
    phdrs.push(load(PF_R, table_off, table_addr, room));
    for p in &phdrs {
        out.extend_from_slice(p);
    }
    out.resize(table_off as usize + room as usize, 0);
    put_u64(&mut out, 32, table_off);
    put_u16(&mut out, 56, phdrs.len() as u16);

    // The wrappers: HIPK, pointing at the metadata, reserved1 = index.
    let section = |name: &str| {
        (0..shnum)
            .map(|i| shdr(input, shoff + i * SHDR))
            .find(|s| {
                let n = &strtab[s.name as usize..];
                n.starts_with(name.as_bytes()) && n[name.len()] == 0
            })
            .unwrap()
    };
    let seg = section(".hipFatBinSegment");
    let rela = section(".rela.dyn");
    assert_eq!(rela.typ, 4);
    for i in 0..(seg.size / 24) as usize {
        let at = seg.offset as usize + i * 24;
        put_u32(&mut out, at, HIPK_MAGIC);
        put_u64(&mut out, at + 8, 0);
        put_u32(&mut out, at + 16, i as u32);
        let pointer = seg.addr + i as u64 * 24 + 8;
        let entry = (0..rela.size as usize / 24)
            .map(|k| rela.offset as usize + k * 24)
            .find(|&e| u64a(input, e) == pointer)
            .expect("the wrapper's relocation");
        assert_eq!(u32a(input, entry + 8), 8, "R_X86_64_RELATIVE");
        put_u64(&mut out, entry + 16, meta_addr);
    }
    out
}

/// A tree as the reference would install it: `lib/<name>` (its output)
/// and `.kpack/<stem>_<target>.kpack` (the archives, which kpack writes
/// in the same format), kernel name `lib/<name>`.
struct RefTree {
    _dir: tempfile::TempDir,
    root: PathBuf,
    binary: PathBuf,
    own: PathBuf,
}

fn reference_tree(input: &Path) -> RefTree {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let name = input.file_name().unwrap().to_string_lossy().into_owned();
    let stem = name.split('.').next().unwrap().to_string();
    let kernel_name = format!("lib/{name}");
    let search = format!("../.kpack/{stem}_@GFXARCH@.kpack");
    // kpack's own output, writing the archives.
    let own = root.join("own").join(&name);
    kpack_ok(&[
        &"offload",
        &input,
        &"-o",
        &own,
        &"--archive-dir",
        &root.join(".kpack"),
        &"--kernel-name",
        &kernel_name,
        &"--search-path",
        &search,
    ]);
    // The reference's metadata: its two keys, no `kpack_targets`.
    let meta = HipkMetadata::new(kernel_name, vec![search]).encode();
    let binary = root.join("lib").join(&name);
    std::fs::create_dir_all(binary.parent().unwrap()).unwrap();
    std::fs::write(
        &binary,
        reference_offload(&std::fs::read(input).unwrap(), &meta),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    RefTree {
        _dir: dir,
        root,
        binary,
        own,
    }
}

/// `kpack verify-elf` (with and without `--offloaded`): exit 0, and the
/// warnings on stderr.
fn verify_warnings(binary: &Path) -> String {
    let mut warnings = String::new();
    for args in [&["verify-elf"][..], &["verify-elf", "--offloaded"][..]] {
        let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|s| s as _).collect();
        a.push(&binary);
        let out = kpack(&a);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        warnings = err;
    }
    warnings
}

/// The runtime's view: the stand-in HIP runtime (preloaded) is handed
/// HIPK wrappers whose pointer reaches the metadata.
fn registered_meta(cmd: &mut Command) -> Vec<(u32, u64, HipkMetadata)> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    run_ok(cmd.env("LD_PRELOAD", shim()).env("KPACK_SHIM_LOG", &log));
    raw_registrations(&log)
        .into_iter()
        .map(|r| {
            (
                r.magic,
                r.reserved1,
                HipkMetadata::decode(&r.bytes).expect("the pointer reaches the metadata"),
            )
        })
        .collect()
}

#[test]
fn reference_library_with_its_fatbin_left_is_offloaded() {
    let f = fixture("libvadd_compressed.so");
    let t = reference_tree(&f.path);
    let b = std::fs::read(&t.binary).unwrap();

    // It is what the issue describes: PROGBITS .hip_fatbin with its
    // bundle, PT_PHDR larger than the table.
    let elf = kpack_host::elf::ElfView::parse(&b).unwrap();
    let fat = elf.section(".hip_fatbin").unwrap().unwrap();
    assert!(!fat.is_nobits() && fat.size < PAGE);
    assert!(fat.data.starts_with(b"CCOB"));

    // Loads, and the runtime sees HIPK wrappers.
    let mut c = Command::new(fixtures_dir().join(manifest().dlcheck));
    let regs = registered_meta(c.arg(&t.binary).arg("vadd_host_check"));
    assert_eq!(regs.len(), 1);
    assert_eq!((regs[0].0, regs[0].1), (HIPK_MAGIC, 0));
    assert_eq!(regs[0].2.kernel_name, "lib/libvadd_compressed.so");

    // verify-elf: accepted, warning about both quirks, by name.
    let warnings = verify_warnings(&t.binary);
    assert!(
        warnings.contains("kpack: warning:")
            && warnings.contains(".hip_fatbin is left in the file with its device code")
            && warnings.contains("PT_PHDR covers 0x380 bytes"),
        "{warnings}"
    );
    let json: Value =
        serde_json::from_str(&kpack_ok(&[&"verify-elf", &t.binary, &"--json"])).unwrap();
    assert_eq!(json["warnings"].as_array().unwrap().len(), 2, "{json}");
    // kpack's own output of the same input: no warning at all, and its
    // own rules refuse the reference's output.
    assert_eq!(verify_warnings(&t.own), "");
    let strict = kpack_host::offload::verify_elf(&b, None)
        .unwrap_err()
        .to_string();
    assert!(
        strict.starts_with("not a valid offloaded binary:")
            && strict.contains("still holds device code")
            && strict.contains("does not describe the program header table"),
        "{strict}"
    );

    // ls: offloaded; why: resolves through the archives; extract: through
    // the archives, not the leftover bytes (only the gfx1100 archive is
    // kept: the leftover bundle still has code for every target).
    let ls: Value = serde_json::from_str(&kpack_ok(&[&"ls", &t.binary, &"--json"])).unwrap();
    assert_eq!(ls["kind"], "offloaded", "{ls}");
    let why = kpack_ok(&[&"why", &t.binary, &"--arch", &"gfx1100"]);
    assert!(why.contains("=> loads gfx1100"), "{why}");
    for other in ["gfx942", "gfx1101"] {
        std::fs::remove_file(
            t.root
                .join(format!(".kpack/libvadd_compressed_{other}.kpack")),
        )
        .unwrap();
    }
    let ex = tempfile::tempdir().unwrap();
    kpack_ok(&[&"extract", &t.binary, &"-o", &ex.path()]);
    let files = dir_files(ex.path());
    assert_eq!(
        files.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["gfx1100.hsaco"]
    );
    assert!(files[0].1 == code_objects(&f.path)[&(0, "gfx1100".to_string())]);
    // Offloading it again is a no-op, as for any offloaded binary.
    let again = t.root.join("again.so");
    let out = kpack(&[
        &"offload",
        &t.binary,
        &"-o",
        &again,
        &"--archive-dir",
        &t.root.join("k2"),
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already offloaded"));
}

#[test]
fn reference_pie_runs_and_verifies_with_a_warning() {
    // A PIE whose .hip_fatbin is smaller than a page (one compressed
    // target).
    let dir = tempfile::tempdir().unwrap();
    let hip = workspace().join("integration/hip");
    let pie = dir.path().join("vadd_small_pie");
    run_ok(
        Command::new("clang++-19")
            .args(["-O2", "-fPIE", "-pie", "-fuse-ld=lld", "-x", "hip"])
            .args([
                "-nogpulib",
                "-nogpuinc",
                "--offload-arch=gfx1100",
                "--offload-compress",
            ])
            .arg("-I")
            .arg(&hip)
            .arg(hip.join("vadd.hip"))
            .args(["-x", "c++"])
            .arg(hip.join("vadd_main.cpp"))
            .arg("-lamdhip64")
            .arg("-o")
            .arg(&pie),
    );
    let t = reference_tree(&pie);
    let regs = registered_meta(&mut Command::new(&t.binary));
    assert_eq!(regs.len(), 1);
    assert_eq!(regs[0].0, HIPK_MAGIC);
    let warnings = verify_warnings(&t.binary);
    assert!(warnings.contains("PT_PHDR covers"), "{warnings}");
    assert!(warnings.contains(".hip_fatbin is left"), "{warnings}");
    let why = kpack_ok(&[&"why", &t.binary, &"--arch", &"gfx1100"]);
    assert!(why.contains("=> loads gfx1100"), "{why}");
}

/// Accepting the quirks is not accepting damage.
#[test]
fn damaged_reference_outputs_still_fail() {
    let f = fixture("libvadd_compressed.so");
    let t = reference_tree(&f.path);
    let b = std::fs::read(&t.binary).unwrap();
    let elf = kpack_host::elf::ElfView::parse(&b).unwrap();
    let seg = elf.section(".hipFatBinSegment").unwrap().unwrap().offset as usize;
    let meta = elf.section(".rocm_kpack_ref").unwrap().unwrap();
    let phdr_at = {
        let (phoff, phnum) = (u64a(&b, 32) as usize, u16a(&b, 56) as usize);
        (0..phnum)
            .map(|i| phoff + i * PHDR)
            .find(|&p| u32a(&b, p) == PT_PHDR)
            .unwrap()
    };
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage, &str)> = vec![
        (
            "magic",
            Box::new(move |b| b[seg..seg + 4].copy_from_slice(b"XXXX")),
            "wrapper 0: magic 0x58585858 is not HIPK",
        ),
        (
            "metadata",
            Box::new(move |b| {
                b[meta.offset as usize..(meta.offset + meta.size) as usize].fill(0xc1)
            }),
            ".rocm_kpack_ref does not decode",
        ),
        (
            "PT_PHDR elsewhere",
            Box::new(move |b| {
                let off = u64a(b, phdr_at + 8);
                put_u64(b, phdr_at + 8, off + 56);
            }),
            "does not describe the program header table",
        ),
    ];
    for (what, damage, needle) in cases {
        let mut d = b.clone();
        damage(&mut d);
        let path = t.root.join("lib/damaged.so");
        std::fs::write(&path, d).unwrap();
        let err = kpack_fails(&[&"verify-elf", &path]);
        assert!(
            err.contains("not a valid offloaded binary") && err.contains(needle),
            "{what}: {err}"
        );
        assert!(
            !err.contains("HIPF") && !err.contains("fat binary"),
            "{what}: {err}"
        );
    }
}

/// Without `--offloaded`, verify-elf judges a binary by the rules of the
/// kind it is: a damaged fat binary fails with fat-binary reasons only, a
/// damaged offloaded one with offloaded reasons only.
#[test]
fn verify_elf_names_the_rules_of_the_kind_found() {
    let f = fixture("libvadd.so");
    let dir = tempfile::tempdir().unwrap();
    let mut b = std::fs::read(&f.path).unwrap();
    let elf = kpack_host::elf::ElfView::parse(&b).unwrap();
    let seg = elf.section(".hipFatBinSegment").unwrap().unwrap().offset as usize;
    b[seg + 4..seg + 8].copy_from_slice(&2u32.to_le_bytes());
    let fat = dir.path().join("libfat.so");
    std::fs::write(&fat, &b).unwrap();
    let err = kpack_fails(&[&"verify-elf", &fat]);
    assert!(
        err.contains("not a valid fat binary: wrapper 0: version 2 is not 1"),
        "{err}"
    );
    assert!(!err.contains("offloaded") && !err.contains("HIPK"), "{err}");
    // With --offloaded, a fat binary fails as not offloaded.
    let err = kpack_fails(&[&"verify-elf", &"--offloaded", &f.path]);
    assert!(err.contains("not a valid offloaded binary"), "{err}");

    let out = dir.path().join("lib/libvadd.so");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &out,
        &"--archive-dir",
        &dir.path().join(".kpack"),
    ]);
    let mut b = std::fs::read(&out).unwrap();
    let elf = kpack_host::elf::ElfView::parse(&b).unwrap();
    let seg = elf.section(".hipFatBinSegment").unwrap().unwrap().offset as usize;
    b[seg + 4..seg + 8].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&out, &b).unwrap();
    let err = kpack_fails(&[&"verify-elf", &out]);
    assert!(
        err.contains("not a valid offloaded binary: wrapper 0: version 2 is not 1"),
        "{err}"
    );
    assert!(!err.contains("fat") && !err.contains("HIPF"), "{err}");
    assert_eq!(
        u32::from_le_bytes(b[seg..seg + 4].try_into().unwrap()),
        HIPK_MAGIC
    );
    let _ = HIPF_MAGIC;
}
