//! Unit tests of each step of the PE transform on small PE32+ DLLs built
//! here (object's PE writer), so that every layout case is set up exactly
//! (the end-to-end tests run the same code on DLLs and EXEs clang builds,
//! under Wine).

use object::pe::{ImageFileHeader, ImageOptionalHeader64};
use object::write::pe::{NtHeaders, Writer};
use object::LittleEndian as LE;

use super::plan::plan;
use super::*;
use crate::binary::{classify, Address, Class, HostBinary};
use crate::bundle::{write_bundle, BUNDLE_MAGIC};
use crate::bytes::{put_u16, put_u32, put_u64, u32_at, u64_at};
use crate::hipk::{HipkMetadata, HIPF_MAGIC, HIPK_MAGIC};
use crate::offload::section::Reloc;
use crate::offload::wrappers::WrapperError;
use crate::pe::{checksum, PeView, CHECKSUM_OFFSET, IMAGE_REL_BASED_DIR64};

/// Step 1 on a file's bytes.
fn analyze(b: &[u8]) -> Result<analyze::Input<'_>, PeTransformError> {
    analyze::analyze(PeView::parse(b)?)
}

const BASE: u64 = 0x1_8000_0000;
const FA: u64 = 0x200;
const SA: u64 = 0x1000;
/// Offsets of the synthetic image's headers (after the DOS header and
/// stub).
const NT: u64 = 0x80;
const FILE_HEADER: u64 = NT + 4;
const OPT: u64 = FILE_HEADER + 20;
const TABLE: u64 = OPT + 240;
const HEADERS: u64 = 0x400;

/// What the synthetic DLL looks like.
#[derive(Clone)]
struct Spec {
    /// Size of each bundle's device entry (one bundle per entry).
    bundles: Vec<usize>,
    /// For each wrapper, the bundle its pointer names (`None`: 16 bytes
    /// past the first bundle's start).
    wrappers: Vec<Option<usize>>,
    /// A DIR64-relocated word in `.rdata` pointing into `.hip_fat`.
    stray_pointer: bool,
    /// A base relocation applied to a word of `.hip_fat`.
    reloc_in_fatbin: bool,
    /// A debug directory entry naming data in a section after `.hip_fat`.
    debug: bool,
    /// Data after the last section: overlay, COFF symbols, certificate.
    overlay: Vec<u8>,
    symbols: bool,
    certificate: bool,
    checksum: bool,
    /// `SizeOfHeaders` ends right after the section table.
    tight_headers: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            bundles: vec![3 * 4096],
            wrappers: vec![Some(0)],
            stray_pointer: false,
            reloc_in_fatbin: false,
            debug: false,
            overlay: Vec::new(),
            symbols: false,
            certificate: false,
            checksum: false,
            tight_headers: false,
        }
    }
}

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Section characteristics of initialized, readable data.
const DATA: u32 = 0x4000_0040;

/// The bundles of `spec` back to back, and where each starts.
fn bundles(spec: &Spec) -> (Vec<u8>, Vec<u64>) {
    let mut out = Vec::new();
    let mut starts = Vec::new();
    for (i, &size) in spec.bundles.iter().enumerate() {
        starts.push(out.len() as u64);
        let code = vec![0xc0 + i as u8; size];
        let triple = format!("hipv4-amdgcn-amd-amdhsa--gfx{}", 1100 + i);
        out.extend(write_bundle(
            &[("host-x86_64-pc-windows-msvc", &[]), (&triple, &code)],
            16,
        ));
    }
    (out, starts)
}

/// Build the DLL with object's PE writer: DOS header and stub, NT headers,
/// `.rdata` (RVA 0x1000: a stray pointer, a debug directory entry),
/// `.hipFatB` (0x2000), `.hip_fat` (0x3000), `.reloc` (base relocations in
/// page order), `.cv` (debug data); then the trailing data. What a linker
/// would not write (a COFF symbol table in an image, `SizeOfHeaders`
/// ending at the section table) is patched in afterwards.
fn build(spec: &Spec) -> Vec<u8> {
    let (fat, starts) = bundles(spec);
    let nw = spec.wrappers.len() as u32;
    let nsec = 4 + u16::from(spec.debug);

    let mut out = Vec::new();
    let mut w = Writer::new(true, SA as u32, FA as u32, &mut out);
    w.reserve_dos_header_and_stub();
    w.reserve_nt_headers(16);
    w.reserve_section_headers(nsec);
    let rdata = w.reserve_section(*b".rdata\0\0", DATA, 0x100, 0x100);
    let wrappers = w.reserve_section(*b".hipFatB", DATA, 24 * nw, 24 * nw);
    let fatbin = w.reserve_section(*b".hip_fat", DATA, fat.len() as u32, fat.len() as u32);
    assert_eq!(
        (
            w.nt_headers_offset(),
            rdata.file_offset,
            wrappers.file_offset
        ),
        (NT as u32, HEADERS as u32, (HEADERS + FA) as u32)
    );
    assert_eq!(
        (rdata.virtual_address, fatbin.virtual_address),
        (0x1000, 0x3000)
    );
    if spec.stray_pointer {
        w.add_reloc(0x1000, IMAGE_REL_BASED_DIR64);
    }
    for k in 0..nw {
        w.add_reloc(0x2000 + 24 * k + 8, IMAGE_REL_BASED_DIR64);
    }
    if spec.reloc_in_fatbin {
        w.add_reloc(0x3010, IMAGE_REL_BASED_DIR64);
    }
    w.reserve_reloc_section();
    let cv = spec
        .debug
        .then(|| w.reserve_section(*b".cv\0\0\0\0\0", DATA, 0x40, 0x40));
    if spec.debug {
        w.set_data_directory(6, 0x1040, 28);
    }
    let overlay = w.reserve(spec.overlay.len() as u32, 1);
    let symbols = spec.symbols.then(|| w.reserve(22, 1));
    if spec.certificate {
        w.reserve_certificate_table(16);
    }

    w.write_dos_header_and_stub().unwrap();
    w.write_nt_headers(NtHeaders {
        machine: object::pe::IMAGE_FILE_MACHINE_AMD64,
        time_date_stamp: 0,
        characteristics: 0x2022,
        major_linker_version: 0,
        minor_linker_version: 0,
        address_of_entry_point: 0,
        image_base: BASE,
        major_operating_system_version: 0,
        minor_operating_system_version: 0,
        major_image_version: 0,
        minor_image_version: 0,
        major_subsystem_version: 0,
        minor_subsystem_version: 0,
        subsystem: 2,
        dll_characteristics: 0,
        size_of_stack_reserve: 0,
        size_of_stack_commit: 0,
        size_of_heap_reserve: 0,
        size_of_heap_commit: 0,
    });
    w.write_section_headers();
    // .rdata: the stray pointer and the debug directory entry.
    let mut data = vec![0u8; 0x100];
    if spec.stray_pointer {
        put_u64(&mut data, 0, BASE + 0x3000 + 64);
    }
    if let Some(cv) = cv {
        put_u32(&mut data, 0x40 + 12, 2); // IMAGE_DEBUG_TYPE_CODEVIEW
        put_u32(&mut data, 0x40 + 16, 0x40);
        put_u32(&mut data, 0x40 + 20, cv.virtual_address);
        put_u32(&mut data, 0x40 + 24, cv.file_offset);
    }
    w.write_section(rdata.file_offset, &data);
    let mut data = vec![0u8; 24 * nw as usize];
    for (k, wrapper) in spec.wrappers.iter().enumerate() {
        let target = match wrapper {
            Some(b) => 0x3000 + starts[*b],
            None => 0x3000 + 16,
        };
        put_u32(&mut data, 24 * k, HIPF_MAGIC);
        put_u32(&mut data, 24 * k + 4, 1);
        put_u64(&mut data, 24 * k + 8, BASE + target);
    }
    w.write_section(wrappers.file_offset, &data);
    w.write_section(fatbin.file_offset, &fat);
    w.write_reloc_section();
    if let Some(cv) = cv {
        w.write_section(cv.file_offset, b"RSDS");
    }
    // Trailing data: overlay, COFF symbols, certificate.
    w.pad_until(overlay);
    w.write(&spec.overlay);
    if symbols.is_some() {
        w.write(&[b's'; 18]);
        w.write(&4u32.to_le_bytes());
    }
    if spec.certificate {
        let mut cert = 16u32.to_le_bytes().to_vec();
        cert.extend(0x200u16.to_le_bytes());
        cert.extend(2u16.to_le_bytes());
        cert.extend(*b"SIGNATUR");
        w.write_certificate_table(&cert);
    }

    let field = |header: u64, offset: usize| (header as usize) + offset;
    if let Some(at) = symbols {
        let pointer = std::mem::offset_of!(ImageFileHeader, pointer_to_symbol_table);
        put_u32(&mut out, field(FILE_HEADER, pointer), at);
        let count = std::mem::offset_of!(ImageFileHeader, number_of_symbols);
        put_u32(&mut out, field(FILE_HEADER, count), 1);
    }
    if spec.tight_headers {
        let headers = (TABLE + 40 * u64::from(nsec)) as u32;
        let at = std::mem::offset_of!(ImageOptionalHeader64, size_of_headers);
        put_u32(&mut out, field(OPT, at), headers);
    }
    if spec.checksum {
        let sum = checksum(&out, OPT + CHECKSUM_OFFSET);
        put_u32(&mut out, (OPT + CHECKSUM_OFFSET) as usize, sum);
    }
    out
}

fn meta() -> Vec<u8> {
    HipkMetadata::new("bin/foo.dll", vec!["../.kpack/foo_@GFXARCH@.kpack".into()]).encode()
}

/// The input (kept for the test's length), the transform and its output.
fn run(spec: &Spec) -> (&'static [u8], Transformed<'static>, Vec<u8>) {
    let b: &'static [u8] = Box::leak(build(spec).into_boxed_slice());
    let t = transform(b, &meta()).unwrap_or_else(|e| panic!("{e}"));
    let t_bytes = t.to_vec();
    verify_pe(&t_bytes, Some(t.bundles)).unwrap_or_else(|e| panic!("{e}"));
    (b, t, t_bytes)
}

fn section<'a>(pe: &PeView<'a>, name: &str) -> crate::pe::PeSection<'a> {
    pe.section(name)
        .unwrap()
        .unwrap_or_else(|| panic!("{name}"))
}

#[test]
fn synthetic_dll_reads_as_fat() {
    let b = build(&Spec::default());
    assert_eq!(classify(&b), Class::Fat);
    let bin = HostBinary::parse(&b).unwrap();
    let w = bin.wrappers().unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(w.slots[0].pointer.as_ref().unwrap().value, 0x3000);
    assert_eq!(
        w.slots[0].pointer.as_ref().unwrap().kind,
        crate::elf::PointerKind::BaseRelocDir64
    );
}

#[test]
fn analyze_takes_co_index_from_the_pointer() {
    let spec = Spec {
        bundles: vec![5000, 100, 7000],
        wrappers: vec![Some(2), Some(0), Some(1)],
        ..Spec::default()
    };
    let b = build(&spec);
    let input = analyze(&b).unwrap();
    assert_eq!(input.bundles, 3);
    let co: Vec<u32> = input.changes.iter().map(|c| c.co_index).collect();
    assert_eq!(co, [2, 0, 1]);
}

#[test]
fn plan_removes_whole_pages_and_appends_the_metadata() {
    let b = build(&Spec::default());
    let input = analyze(&b).unwrap();
    let f = input.fatbin().clone();
    let p = plan(&input, 70).unwrap();
    assert_eq!(p.removed, f.raw_size / 4096 * 4096);
    assert!(p.removed >= 3 * 4096);
    assert_eq!(p.fatbin_raw + p.removed, f.raw_size);
    assert_eq!(p.cut_start, f.raw_offset + p.fatbin_raw);
    assert_eq!(p.meta_off, input.tail_start - p.removed);
    assert_eq!((p.meta_raw, p.meta_len), (FA, 70));
    let reloc = &input.sections[3];
    assert_eq!(p.meta_rva, align(reloc.rva + reloc.virtual_size, SA));
    assert_eq!(u64::from(p.size_of_image), p.meta_rva + SA);
    // Offsets before the cut stay, inside it vanish, after it shift.
    assert_eq!(p.map_off(f.raw_offset), Some(f.raw_offset));
    assert_eq!(p.map_off(p.cut_start), None);
    assert_eq!(
        p.map_off(reloc.raw_offset),
        Some(reloc.raw_offset - p.removed)
    );
    assert_eq!(p.map_off(input.tail_start), Some(p.tail_out));
}

#[test]
fn transform_rewrites_headers_wrappers_and_keeps_addresses() {
    let spec = Spec {
        bundles: vec![6000, 9000],
        wrappers: vec![Some(1), Some(0)],
        ..Spec::default()
    };
    let (b, t, t_bytes) = run(&spec);
    let (old, new) = (PeView::parse(b).unwrap(), PeView::parse(&t_bytes).unwrap());
    assert_eq!(new.section_headers().len(), old.section_headers().len() + 1);
    assert_eq!(t_bytes.len() as u64, b.len() as u64 - t.removed + FA);
    let (of, nf) = (section(&old, ".hip_fat"), section(&new, ".hip_fat"));
    assert_eq!((nf.rva, nf.virtual_size), (of.rva, of.virtual_size));
    assert_eq!(nf.raw_size, of.raw_size - t.removed);
    assert!(t.removed > 0 && t.removed % 4096 == 0);
    for name in [".rdata", ".reloc"] {
        let (o, n) = (section(&old, name), section(&new, name));
        assert_eq!(
            (o.rva, o.virtual_size, o.data),
            (n.rva, n.virtual_size, n.data)
        );
    }
    let m = section(&new, ".kpackrf");
    assert_eq!(m.characteristics, 0x4000_0040);
    assert_eq!(
        HipkMetadata::decode(m.data).unwrap().kernel_name,
        "bin/foo.dll"
    );
    assert_eq!(t.metadata_addr, m.rva);
    let size_of_image = new.optional_header().size_of_image.get(LE);
    assert_eq!(u64::from(size_of_image), m.rva + SA);
    let init = |v: &PeView| v.optional_header().size_of_initialized_data.get(LE) as u64;
    assert_eq!(init(&new), init(&old) - t.removed + FA);
    // Wrappers: HIPK, absolute pointer at the preferred base, co_index.
    let w = section(&new, ".hipFatB");
    for (k, co) in [(0u64, 1u64), (1, 0)] {
        let at = 24 * k;
        assert_eq!(u32_at(w.data, at), Some(HIPK_MAGIC));
        assert_eq!(u64_at(w.data, at + 8), Some(BASE + m.rva));
        assert_eq!(u64_at(w.data, at + 16), Some(co));
    }
    // No bundle byte is left.
    let magic = BUNDLE_MAGIC;
    assert!(!t_bytes.windows(magic.len()).any(|x| x == magic));
    assert!(!t_bytes.windows(64).any(|x| x.iter().all(|&c| c == 0xc1)));
    assert_eq!(classify(&t_bytes), Class::Offloaded);
}

#[test]
fn fatbin_smaller_than_a_page_is_zeroed_not_cut() {
    let (b, t, t_bytes) = run(&Spec {
        bundles: vec![300],
        ..Spec::default()
    });
    assert_eq!(t.removed, 0);
    assert_eq!(t_bytes.len(), b.len() + FA as usize);
    let new = PeView::parse(&t_bytes).unwrap();
    let f = section(&new, ".hip_fat");
    assert!(f.raw_size > 0);
    assert!(f.data.iter().all(|&c| c == 0));
}

#[test]
fn trailing_data_and_file_offset_fields_move_with_the_sections() {
    let overlay: Vec<u8> = (0..777u32).map(|i| (i * 7) as u8).collect();
    let spec = Spec {
        debug: true,
        overlay: overlay.clone(),
        symbols: true,
        certificate: true,
        checksum: true,
        ..Spec::default()
    };
    let (b, t, t_bytes) = run(&spec);
    let (old, new) = (PeView::parse(b).unwrap(), PeView::parse(&t_bytes).unwrap());
    let (m, cv) = (section(&new, ".kpackrf"), section(&new, ".cv"));
    let tail = (m.raw_offset + m.raw_size) as usize;
    assert_eq!(&t_bytes[tail..tail + overlay.len()], &overlay[..]);
    // The debug entry names the moved CodeView data.
    let entry = new.rva_to_offset(0x1040, 28).unwrap();
    assert_eq!(u32_at(&t_bytes, entry + 24), Some(cv.raw_offset as u32));
    assert_eq!(&cv.data[..4], b"RSDS");
    assert_eq!(section(&old, ".cv").raw_offset - t.removed, cv.raw_offset);
    // COFF symbols and the certificate table: same bytes at the new offsets.
    let sym = |v: &PeView| v.file_header().pointer_to_symbol_table.get(LE) as usize;
    assert_eq!(
        &t_bytes[sym(&new)..sym(&new) + 22],
        &b[sym(&old)..sym(&old) + 22]
    );
    let (oc, _) = old.directory(4);
    let (nc, size) = new.directory(4);
    assert_eq!(size, 16);
    assert_eq!(nc % 8, 0);
    assert_eq!(&t_bytes[nc as usize..][..16], &b[oc as usize..][..16]);
    // A non-zero checksum is recomputed.
    let stored = new.optional_header().check_sum.get(LE);
    assert_ne!(stored, old.optional_header().check_sum.get(LE));
    assert_eq!(stored, new.checksum_of(&t_bytes));
}

#[test]
fn an_offloaded_image_is_not_transformed_again() {
    let (_, _, t_bytes) = run(&Spec::default());
    assert_eq!(
        transform(&t_bytes, &meta()).unwrap_err(),
        PeTransformError::HasMetadata
    );
}

fn refused(spec: &Spec) -> PeTransformError {
    transform(&build(spec), &meta()).unwrap_err()
}

#[test]
fn refuses_pointers_and_relocations_into_the_removed_bytes() {
    let e = refused(&Spec {
        wrappers: vec![None],
        ..Spec::default()
    });
    assert!(
        matches!(
            e,
            PeTransformError::Section(SectionError::Wrapper(WrapperError::PointerNotAtBundle {
                index: 0,
                pointer: Address::Rva(0x3010),
                ..
            }))
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("wrapper 0: binary pointer RVA 0x3010 does not point at the start of a bundle in .hip_fat ["),
        "{e}"
    );
    let e = refused(&Spec {
        stray_pointer: true,
        ..Spec::default()
    });
    assert!(
        matches!(
            e,
            PeTransformError::Section(SectionError::RelocationIntoRemoved {
                reloc: Reloc::Pe(0x1000),
                what: "points",
                ..
            })
        ),
        "{e}"
    );
    let e = refused(&Spec {
        reloc_in_fatbin: true,
        ..Spec::default()
    });
    assert!(
        e.to_string()
            .contains("base relocation at RVA 0x3010 applies to bytes"),
        "{e}"
    );
}

#[test]
fn refuses_a_wrapper_pointer_outside_the_section() {
    let mut b = build(&Spec::default());
    let at = (HEADERS + FA + 8) as usize;
    put_u64(&mut b, at, BASE + 0x1000);
    let e = transform(&b, &meta()).unwrap_err();
    assert!(
        e.to_string()
            .contains("RVA 0x1000 does not point at the start of a bundle"),
        "{e}"
    );
    // A pointer no base relocation rebases, in an image that has some: the
    // wrappers' block now names another page.
    let mut b = build(&Spec {
        stray_pointer: true,
        ..Spec::default()
    });
    let pe = PeView::parse(&b).unwrap();
    let mut block = pe.rva_to_offset(pe.directory(5).0, 8).unwrap();
    while u32_at(&b, block) != Some(0x2000) {
        block += u64::from(u32_at(&b, block + 4).unwrap());
    }
    put_u32(&mut b, block as usize, 0x4000);
    let e = transform(&b, &meta()).unwrap_err();
    assert!(e.to_string().contains("none rebases its pointer"), "{e}");
}

#[test]
fn refuses_mixed_wrappers_and_a_full_header() {
    let mut b = build(&Spec {
        bundles: vec![100, 100],
        wrappers: vec![Some(0), Some(1)],
        ..Spec::default()
    });
    put_u32(&mut b, (HEADERS + FA + 24) as usize, HIPK_MAGIC);
    assert_eq!(
        transform(&b, &meta()).unwrap_err(),
        PeTransformError::Section(SectionError::Wrapper(WrapperError::Mixed))
    );
    put_u32(&mut b, (HEADERS + FA + 24) as usize, HIPF_MAGIC);
    put_u32(&mut b, (HEADERS + FA + 4) as usize, 7);
    assert_eq!(
        transform(&b, &meta()).unwrap_err(),
        PeTransformError::Section(SectionError::Wrapper(WrapperError::UnknownVersion {
            index: 0,
            version: 7
        }))
    );
    let e = refused(&Spec {
        tight_headers: true,
        ..Spec::default()
    });
    assert!(matches!(e, PeTransformError::NoRoomForHeader { .. }), "{e}");
}

#[test]
fn refuses_pe32_other_machines_and_truncated_headers() {
    let b = build(&Spec::default());
    let mut pe32 = b.clone();
    put_u16(
        &mut pe32,
        OPT as usize,
        object::pe::IMAGE_NT_OPTIONAL_HDR32_MAGIC,
    );
    let e = transform(&pe32, &meta()).unwrap_err();
    assert!(e.to_string().contains("PE32 (32-bit)"), "{e}");
    let mut arm = b.clone();
    put_u16(
        &mut arm,
        FILE_HEADER as usize,
        object::pe::IMAGE_FILE_MACHINE_ARM64,
    );
    let e = transform(&arm, &meta()).unwrap_err();
    assert!(e.to_string().contains("AArch64"), "{e}");
    for cut in [0x20, 0x50, 0x100, 0x1a0] {
        let e = transform(&b[..cut], &meta()).unwrap_err();
        assert!(e.to_string().contains("malformed PE"), "{cut:#x}: {e}");
    }
    let mut many = b.clone();
    put_u16(&mut many, FILE_HEADER as usize + 2, 0xfff0);
    let e = transform(&many, &meta()).unwrap_err();
    assert!(e.to_string().contains("section table"), "{e}");
    assert_eq!(classify(&pe32), Class::Other);
}

#[test]
fn verifier_names_what_is_wrong() {
    let (_, _, t_bytes) = run(&Spec {
        checksum: true,
        ..Spec::default()
    });
    let new = PeView::parse(&t_bytes).unwrap();
    let f = section(&new, ".hip_fat");
    let w = section(&new, ".hipFatB");
    let mut bad = t_bytes.clone();
    bad[f.raw_offset as usize] = 1;
    put_u64(&mut bad, w.raw_offset as usize + 8, BASE + 0x1000);
    put_u64(&mut bad, w.raw_offset as usize + 16, 9);
    let e = verify_pe(&bad, Some(1)).unwrap_err().to_string();
    for want in [
        "bytes of .hip_fat remain",
        "resolves to RVA 0x1000",
        "code object index 9",
        "CheckSum",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
}
