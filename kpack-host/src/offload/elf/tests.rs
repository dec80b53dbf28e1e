//! Unit tests of each step of the transform on small ELF shared objects
//! built here (object's ELF writer, every part at an offset chosen here),
//! so that every layout case is set up exactly (the end-to-end tests run
//! the same code on compiled fixtures).

use object::elf;
use object::read::elf::{ProgramHeader as _, SectionHeader as _, Sym as _};
use object::write::elf::{FileHeader, ProgramHeader, Rel, SectionHeader, Sym, Writer};

use super::plan::plan;
use super::*;
use crate::binary::{classify, Class};
use crate::bundle::write_bundle;
use crate::elf::{ElfView, PhdrExt, PointerKind, EHDR_SIZE, LE, PHDR_SIZE};
use crate::hipk::{Wrapper, HIPF_MAGIC, HIPK_MAGIC};
use crate::offload::elf::verify::verify_elf;
use crate::offload::wrappers::WrapperError;

const PAGE: u64 = 0x1000;

/// Step 1 on a file's bytes.
fn analyze(b: &[u8]) -> Result<analyze::Input<'_>, TransformError> {
    analyze::analyze(ElfView::parse(b)?)
}

/// [`super::rewrite`] of a file's bytes.
fn rewrite<'a>(b: &'a [u8], request: &Request) -> Result<Transformed<'a>, TransformError> {
    super::rewrite(ElfView::parse(b)?, request)
}

/// What the synthetic binary looks like.
#[derive(Clone)]
struct Spec {
    /// Size of each bundle's device entry (one bundle per entry).
    bundles: Vec<usize>,
    /// For each wrapper, the bundle its pointer names (`None`: a pointer
    /// 16 bytes past the first bundle's start).
    wrappers: Vec<Option<usize>>,
    /// Page-align the end of `.hip_fatbin` (X then ends there).
    fatbin_ends_on_page: bool,
    /// Make the segment holding `.hip_fatbin` writable.
    writable: bool,
    /// Add a RELATIVE relocation of a data word pointing into the section.
    stray_reloc: bool,
    /// `p_align` of every segment (the read-write segment's address is its
    /// file offset plus this).
    align: u64,
    /// A GNU build-id note right after the program header table (with a
    /// PT_NOTE), as GNU ld and lld lay them out.
    note: bool,
    /// A small read-only section `.trailer` right after `.hip_fatbin`, in
    /// X: X goes on after the section (as when `.eh_frame` follows it).
    trailer: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            // With the entry page-aligned in its bundle: 3 pages + 100 bytes.
            bundles: vec![2 * PAGE as usize + 100],
            wrappers: vec![Some(0)],
            fatbin_ends_on_page: false,
            writable: false,
            stray_reloc: false,
            align: PAGE,
            note: false,
            trailer: true,
        }
    }
}

/// A segment (program header).
fn segment(p_type: u32, flags: u32, off: u64, addr: u64, size: u64, align: u64) -> ProgramHeader {
    ProgramHeader {
        p_type,
        p_flags: flags,
        p_offset: off,
        p_vaddr: addr,
        p_paddr: addr,
        p_filesz: size,
        p_memsz: size,
        p_align: align,
    }
}

/// Section indices of the synthetic binary.
const DYNSYM: usize = 1;
const FATBIN: usize = 4;

/// Build the binary: ELF header, four program headers (PT_PHDR, R
/// PT_LOAD from 0 to the end of `.hip_fatbin`, RW PT_LOAD, PT_DYNAMIC),
/// `.dynsym`/`.dynstr`/`.rela.dyn` right after the table, `.hip_fatbin` at
/// the next page, then `.hipFatBinSegment` and `.dynamic` in the RW
/// segment, `.shstrtab` and the section headers.
///
/// object's ELF writer encodes the headers, symbols, relocations, dynamic
/// entries and names; the layout stays explicit, every part reserved in
/// file order at the offset the tests need (the writer's own placement
/// would not give the segments these exact offsets and addresses). Long on
/// purpose: one file layout written top to bottom, whose offsets tie every
/// part to the others.
fn build(spec: &Spec) -> Vec<u8> {
    let mut bundles = Vec::new();
    let mut starts = Vec::new();
    for (i, &size) in spec.bundles.iter().enumerate() {
        starts.push(bundles.len() as u64);
        let code = vec![0xc0 + i as u8; size];
        let triple = format!("hipv4-amdgcn-amd-amdhsa--gfx{}", 1100 + i);
        let host: &[u8] = &[];
        bundles.extend(write_bundle(
            &[("host-x86_64-unknown-linux-gnu-", host), (&triple, &code)],
            4096,
        ));
    }
    if spec.fatbin_ends_on_page {
        bundles.resize(bundles.len().div_ceil(PAGE as usize) * PAGE as usize, 0);
    }
    let nw = spec.wrappers.len();
    let nrel = nw + usize::from(spec.stray_reloc);

    let mut out = Vec::new();
    let mut w = Writer::new(object::Endianness::Little, true, &mut out);
    // Section indices and names, in section header order.
    w.reserve_null_section_index();
    assert_eq!(w.reserve_dynsym_section_index().0 as usize, DYNSYM);
    w.reserve_dynstr_section_index();
    let rela_name = w.add_section_name(b".rela.dyn");
    w.reserve_section_index();
    let fat_name = w.add_section_name(b".hip_fatbin");
    let fat_index = w.reserve_section_index();
    assert_eq!(fat_index.0 as usize, FATBIN);
    let wrap_name = w.add_section_name(b".hipFatBinSegment");
    w.reserve_section_index();
    w.reserve_dynamic_section_index();
    w.reserve_shstrtab_section_index();
    let note_name = w.add_section_name(b".note.gnu.build-id");
    if spec.note {
        w.reserve_section_index();
    }
    let trailer_name = w.add_section_name(b".trailer");
    if spec.trailer {
        w.reserve_section_index();
    }
    w.reserve_null_dynamic_symbol_index();
    let fatbin_sym = w.add_dynamic_string(b"__hip_fatbin");
    w.reserve_dynamic_symbol_index();

    // File ranges, in file order.
    w.reserve_file_header();
    let phnum = 4 + u32::from(spec.note);
    w.reserve_program_headers(phnum);
    let note_off = w.reserve(if spec.note { NOTE.len() } else { 0 }, 4) as u64;
    let dynsym_off = w.reserve_dynsym() as u64;
    let dynstr_off = w.reserve_dynstr() as u64;
    let rela_off = w.reserve_relocations(nrel, true) as u64;
    w.reserve_until(PAGE as usize);
    let fat_off = w.reserve(bundles.len(), 1) as u64;
    let fat_end = fat_off + bundles.len() as u64;
    let trailer_len = if spec.trailer { TRAILER.len() } else { 0 };
    let x_end = w.reserve(trailer_len, 1) as u64 + trailer_len as u64;
    let rw_off = x_end.div_ceil(PAGE) * PAGE;
    w.reserve_until(rw_off as usize);
    let wrap_off = w.reserve(24 * nw, 1) as u64;
    let data_off = w.reserve(8, 1) as u64;
    let dyn_off = w.reserve_dynamic(6) as u64;
    let dyn_len = 6 * 16;
    let rw_len = dyn_off + dyn_len - rw_off;
    w.reserve_shstrtab();
    w.reserve_section_headers();
    let rw = |off: u64| off + spec.align;

    w.write_file_header(&FileHeader {
        os_abi: 0,
        abi_version: 0,
        e_type: elf::ET_DYN,
        e_machine: elf::EM_X86_64,
        e_entry: 0,
        e_flags: 0,
    })
    .unwrap();
    w.write_align_program_headers();
    let x_flags = elf::PF_R | if spec.writable { elf::PF_W } else { 0 };
    let (phoff, table) = (EHDR_SIZE as u64, u64::from(phnum) * PHDR_SIZE as u64);
    let rw_flags = elf::PF_R | elf::PF_W;
    let a = spec.align;
    w.write_program_header(&segment(elf::PT_PHDR, elf::PF_R, phoff, phoff, table, 8));
    w.write_program_header(&segment(elf::PT_LOAD, x_flags, 0, 0, x_end, a));
    w.write_program_header(&segment(
        elf::PT_LOAD,
        rw_flags,
        rw_off,
        rw(rw_off),
        rw_len,
        a,
    ));
    let dynamic = segment(elf::PT_DYNAMIC, rw_flags, dyn_off, rw(dyn_off), dyn_len, 8);
    w.write_program_header(&dynamic);
    if spec.note {
        let n = NOTE.len() as u64;
        w.write_program_header(&segment(elf::PT_NOTE, elf::PF_R, note_off, note_off, n, 4));
        w.pad_until(note_off as usize);
        w.write(NOTE);
    }
    w.write_null_dynamic_symbol();
    w.write_dynamic_symbol(&Sym {
        name: Some(fatbin_sym),
        section: Some(fat_index),
        st_info: 0x11, // GLOBAL OBJECT
        st_other: 0,
        st_shndx: 0,
        st_value: fat_off,
        st_size: bundles.len() as u64,
    });
    w.write_dynstr();
    w.write_align_relocation();
    let relative = |at: u64, target: u64| Rel {
        r_offset: at,
        r_sym: 0,
        r_type: elf::R_X86_64_RELATIVE,
        r_addend: target as i64,
    };
    for (k, wrapper) in spec.wrappers.iter().enumerate() {
        let target = match wrapper {
            Some(b) => fat_off + starts[*b],
            None => fat_off + 16,
        };
        let at = rw(wrap_off + 24 * k as u64 + 8);
        w.write_relocation(true, &relative(at, target));
    }
    if spec.stray_reloc {
        w.write_relocation(true, &relative(rw(data_off), fat_off + 64));
    }
    w.pad_until(fat_off as usize);
    w.write(&bundles);
    if spec.trailer {
        w.write(TRAILER);
    }
    w.pad_until(rw_off as usize);
    for _ in 0..nw {
        let wrapper = Wrapper {
            magic: HIPF_MAGIC,
            version: 1,
            binary: 0,
            reserved1: 0,
        };
        w.write(&wrapper.to_bytes());
    }
    w.write(&[0u8; 8]);
    w.write_align_dynamic();
    w.write_dynamic(elf::DT_SYMTAB, dynsym_off);
    w.write_dynamic(elf::DT_STRTAB, dynstr_off);
    w.write_dynamic(elf::DT_RELA, rela_off);
    w.write_dynamic(elf::DT_RELASZ, 24 * nrel as u64);
    w.write_dynamic(elf::DT_RELAENT, 24);
    w.write_dynamic(elf::DT_NULL, 0);
    w.write_shstrtab();

    let alloc = u64::from(elf::SHF_ALLOC);
    let progbits = |name, flags, addr, offset, size, align| SectionHeader {
        name: Some(name),
        sh_type: elf::SHT_PROGBITS,
        sh_flags: flags,
        sh_addr: addr,
        sh_offset: offset,
        sh_size: size,
        sh_link: 0,
        sh_info: 0,
        sh_addralign: align,
        sh_entsize: 0,
    };
    w.write_null_section_header();
    w.write_dynsym_section_header(dynsym_off, 1);
    w.write_dynstr_section_header(dynstr_off);
    w.write_section_header(&SectionHeader {
        name: Some(rela_name),
        sh_type: elf::SHT_RELA,
        sh_flags: alloc,
        sh_addr: rela_off,
        sh_offset: rela_off,
        sh_size: 24 * nrel as u64,
        sh_link: DYNSYM as u32,
        sh_info: 0,
        sh_addralign: 8,
        sh_entsize: 24,
    });
    let fat_size = bundles.len() as u64;
    w.write_section_header(&progbits(fat_name, alloc, fat_off, fat_off, fat_size, PAGE));
    let wrap_flags = alloc | u64::from(elf::SHF_WRITE);
    let wrap_size = 24 * nw as u64;
    let wrap = progbits(wrap_name, wrap_flags, rw(wrap_off), wrap_off, wrap_size, 8);
    w.write_section_header(&wrap);
    w.write_dynamic_section_header(rw(dyn_off));
    w.write_shstrtab_section_header();
    if spec.note {
        w.write_section_header(&SectionHeader {
            name: Some(note_name),
            sh_type: elf::SHT_NOTE,
            ..progbits(note_name, alloc, note_off, note_off, NOTE.len() as u64, 4)
        });
    }
    if spec.trailer {
        let len = TRAILER.len() as u64;
        w.write_section_header(&progbits(trailer_name, alloc, fat_end, fat_end, len, 1));
    }
    assert_eq!(w.reserved_len(), w.len());
    out
}

/// What `.trailer` holds.
const TRAILER: &[u8] = b"after the bundles";

/// A GNU build-id note: namesz 4, descsz 20, NT_GNU_BUILD_ID, "GNU\0".
const NOTE: &[u8] = b"\x04\0\0\0\x14\0\0\0\x03\0\0\0GNU\0ABCDEFGHIJKLMNOPQRST";

const META: &[u8] = b"\x82\xb2kpack_search_paths\x91\xa5x.kpk\xabkernel_name\xa3lib";

fn offload_request() -> Request<'static> {
    Request::Offload { metadata: META }
}

#[test]
fn synthetic_binary_is_a_fat_binary() {
    let b = build(&Spec::default());
    assert_eq!(classify(&b), Class::Fat);
    let input = analyze(&b).unwrap();
    assert_eq!(input.fatbin.index, FATBIN);
    assert_eq!(input.fatbin.addr, PAGE);
    assert_eq!(input.xi, 1);
    assert_eq!(input.unit, PAGE);
    assert_eq!(input.bundles, 1);
    assert_eq!(input.wrappers.changes[0].co_index, 0);
    assert_eq!(input.wrappers.changes[0].pointer, PointerKind::RelaRelative);
    assert_eq!(input.wrappers.relas, vec![Some(0)]);
}

#[test]
fn analyze_derives_co_index_from_the_pointer() {
    // Two bundles; three wrappers, two of them at the first bundle (a
    // -fgpu-rdc link), as listed.
    let spec = Spec {
        bundles: vec![PAGE as usize, 2 * PAGE as usize],
        wrappers: vec![Some(1), Some(0), Some(0)],
        ..Spec::default()
    };
    let b = build(&spec);
    let input = analyze(&b).unwrap();
    let cos: Vec<u32> = input.wrappers.changes.iter().map(|c| c.co_index).collect();
    assert_eq!(cos, vec![1, 0, 0]);
    assert_eq!(input.bundles, 2);
}

/// The flags of the `PT_LOAD` of `out` whose memory holds `addr`.
fn flags_at(out: &ElfView, addr: u64) -> u32 {
    out.phdrs()
        .iter()
        .find(|p| p.is_load() && p.mem_contains(addr, 1))
        .map(|p| p.p_flags(LE))
        .unwrap()
}

/// The end of the last `PT_LOAD` in memory.
fn image_end(e: &ElfView) -> u64 {
    e.phdrs()
        .iter()
        .filter(|p| p.is_load())
        .map(|p| p.p_vaddr(LE) + p.p_memsz(LE))
        .max()
        .unwrap()
}

/// A writable segment ending with `.hip_fatbin` (what `INSERT AFTER .bss`
/// linker scripts make): its bytes before the section stay a segment of
/// their own, the metadata's pages become a read-only one.
#[test]
fn a_writable_segment_is_split_around_the_metadata() {
    let spec = Spec {
        writable: true,
        trailer: false,
        ..Spec::default()
    };
    let (b, t, t_bytes) = transformed(&spec);
    let before = ElfView::parse(b).unwrap();
    let out = ElfView::parse(&t_bytes).unwrap();
    assert_eq!(flags_at(&out, t.metadata_addr), elf::PF_R);
    // W1 holds no writable section here (the synthetic binary's dynamic
    // tables): it is not writable either (eu-elflint flags a writable
    // segment without one).
    assert_eq!(flags_at(&out, 0), elf::PF_R);
    // W1 and X1 (read-only).
    assert_eq!(out.phdrs().len(), before.phdrs().len() + 1);
    assert!(t.removed > 0);
    assert_eq!(image_end(&out), image_end(&before));
    // A section that does not start on a page boundary cannot have its
    // pages split off: refused, saying why.
    let mut input = analyze(b).unwrap();
    input.fatbin.addr += 16;
    input.fatbin.offset += 16;
    let e = plan(&input, &offload_request()).err();
    assert!(
        matches!(e, Some(TransformError::FatbinWritable { why }) if why.contains("page boundary")),
        "{e:?}"
    );
}

/// `.hip_fatbin` in the middle of a writable segment: the metadata (and
/// the moved block) go into a read-only segment of their own after every
/// other one (one among the segment's data would sit between relocated
/// words and the symbols they name); the section's range stays the
/// segment's, zero-filled or unmapped, the rest of the segment after it.
#[test]
fn a_writable_segment_keeps_its_range_and_the_metadata_goes_last() {
    let spec = Spec {
        writable: true,
        ..Spec::default()
    };
    let b = build(&spec);
    let t = super::transform(&b, META).unwrap();
    let t_bytes = t.to_vec();
    let v = verify_elf(&t_bytes, Some(t.bundles)).unwrap();
    let (before, out) = (
        ElfView::parse(&b).unwrap(),
        ElfView::parse(&t_bytes).unwrap(),
    );
    assert_eq!(v.metadata_addr, t.metadata_addr);
    assert!(t.metadata_addr >= image_end(&before));
    assert_eq!(flags_at(&out, t.metadata_addr), elf::PF_R);
    assert!(t.removed > 0);
    // X2 (`.trailer`) and N.
    assert_eq!(out.phdrs().len(), before.phdrs().len() + 2);
    let trailer = out.section(".trailer").unwrap().unwrap();
    assert_eq!(trailer.data, TRAILER);
}

#[test]
fn analyze_refuses_what_cannot_be_rewritten() {
    let err = |spec: Spec| analyze(&build(&spec)).err().unwrap();
    assert!(matches!(
        err(Spec {
            wrappers: vec![None],
            ..Spec::default()
        }),
        TransformError::Section(SectionError::Wrapper(WrapperError::PointerNotAtBundle {
            index: 0,
            ..
        }))
    ));
    assert!(matches!(
        err(Spec {
            stray_reloc: true,
            ..Spec::default()
        }),
        TransformError::Section(SectionError::RelocationIntoRemoved { what: "points", .. })
    ));
    // Without a wrapper table, a relocation into the section still counts.
    let mut b = build(&Spec {
        wrappers: vec![],
        stray_reloc: true,
        ..Spec::default()
    });
    let name = b".hipFatBinSegment\0";
    let at = b.windows(name.len()).position(|w| w == name).unwrap();
    b[at + 1] = b'X';
    assert!(matches!(
        analyze(&b).err().unwrap(),
        TransformError::Section(SectionError::RelocationIntoRemoved { what: "points", .. })
    ));
    // A wrapper that is already HIPK beside PROGBITS device code.
    let mut b = build(&Spec::default());
    let at = ElfView::parse(&b)
        .unwrap()
        .section(".hipFatBinSegment")
        .unwrap()
        .unwrap()
        .offset;
    crate::bytes::put_u32(&mut b, at as usize, HIPK_MAGIC);
    assert_eq!(
        analyze(&b).err().unwrap(),
        TransformError::Section(SectionError::Wrapper(WrapperError::Mixed))
    );
}

#[test]
fn plan_cuts_whole_pages_and_moves_the_block_after_the_table() {
    let b = build(&Spec::default());
    let input = analyze(&b).unwrap();
    let p = plan(&input, &offload_request()).unwrap();
    // .hip_fatbin: 0x1000..0x4000 + tail. The first page is kept (metadata
    // and the moved block), pages 0x2000..0x4000 leave the file.
    assert!(p.split);
    assert_eq!(p.keep, PAGE);
    assert_eq!(p.cut.start, 2 * PAGE);
    assert_eq!(p.cut.end, 4 * PAGE);
    assert_eq!(p.cut.removed, 2 * PAGE);
    assert_eq!(p.cut_addr_end, 4 * PAGE);
    // X splits in two: the table grows by one entry over .dynsym, which
    // moves (with .dynstr and .rela.dyn) to after the metadata.
    assert_eq!(p.phdrs.len(), 5);
    let bl = p.block.expect("a block moves");
    assert_eq!(bl.start_off, EHDR_SIZE as u64 + 4 * PHDR_SIZE as u64);
    assert!(bl.start_addr.wrapping_add(bl.addr_delta) >= PAGE + META.len() as u64);
    let (x1, x2) = (p.phdrs[1], p.phdrs[2]);
    assert_eq!(x1.p_filesz(LE), 2 * PAGE);
    assert_eq!(x1.p_memsz(LE), 4 * PAGE);
    assert_eq!(x2.p_vaddr(LE), 4 * PAGE);
    assert_eq!(x2.p_offset(LE), 2 * PAGE);
    assert_eq!(p.phdrs[0].p_filesz(LE), 5 * PHDR_SIZE as u64);
    // File offsets after the cut move down by the removed size.
    assert_eq!(p.map_off(5 * PAGE), Some(3 * PAGE));
    assert_eq!(p.map_off(3 * PAGE), None);
    assert_eq!(p.map_off(PAGE), Some(PAGE));
}

/// `.hip_fatbin` ends X, its last page partial: no segment is made of
/// that page alone (strip and objcopy lay out a segment without sections
/// at an offset that breaks it); its bytes stay in the file, zeroed and
/// unmapped, and X1 ends with the removed pages.
#[test]
fn a_tail_of_nothing_but_the_section_makes_no_segment() {
    let spec = Spec {
        trailer: false,
        ..Spec::default()
    };
    let (b, t, t_bytes) = transformed(&spec);
    let before = ElfView::parse(b).unwrap();
    let out = ElfView::parse(&t_bytes).unwrap();
    assert_eq!(out.phdrs().len(), before.phdrs().len());
    let x1 = out.phdrs()[1];
    assert_eq!(x1.p_vaddr(LE) + x1.p_memsz(LE), 4 * PAGE);
    assert_eq!(t.removed, 2 * PAGE);
    // The last partial page: in the file, all zeros.
    let tail = &t_bytes[2 * PAGE as usize..2 * PAGE as usize + 100];
    assert!(tail.iter().all(|&c| c == 0));
}

#[test]
fn plan_without_a_tail_needs_no_new_segment() {
    let b = build(&Spec {
        fatbin_ends_on_page: true,
        trailer: false,
        ..Spec::default()
    });
    let input = analyze(&b).unwrap();
    let p = plan(&input, &offload_request()).unwrap();
    assert!(p.split);
    assert!(p.block.is_none());
    assert_eq!(p.phdrs.len(), 4);
    assert_eq!(p.cut.removed, 3 * PAGE);
}

#[test]
fn plan_for_a_small_section_cuts_nothing() {
    let b = build(&Spec {
        bundles: vec![600],
        ..Spec::default()
    });
    let input = analyze(&b).unwrap();
    let p = plan(&input, &offload_request()).unwrap();
    assert!(!p.split);
    assert_eq!(p.cut.removed, 0);
    assert!(p.block.is_none());
    assert_eq!(p.phdrs.len(), 4);
    // Metadata larger than the section: no room.
    assert!(matches!(
        plan(
            &input,
            &Request::Offload {
                metadata: &vec![0; 1 << 20]
            }
        ),
        Err(TransformError::NoRoom { .. })
    ));
}

/// The whole transform, checked by the verifier and field by field.
/// The input (kept for the test's length), the transform and its output.
fn transformed(spec: &Spec) -> (&'static [u8], Transformed<'static>, Vec<u8>) {
    let b: &'static [u8] = Box::leak(build(spec).into_boxed_slice());
    let t = transform(b, META).unwrap();
    let t_bytes = t.to_vec();
    let v = verify_elf(&t_bytes, Some(t.bundles)).unwrap();
    assert_eq!(v.metadata_addr, PAGE);
    assert_eq!(v.co_indices.len(), spec.wrappers.len());
    assert_eq!(classify(&t_bytes), Class::Offloaded);
    (b, t, t_bytes)
}

#[test]
fn write_removes_the_pages_and_points_wrappers_at_the_metadata() {
    let (b, t, t_bytes) = transformed(&Spec::default());
    assert_eq!(t.removed, 2 * PAGE);
    let out = ElfView::parse(&t_bytes).unwrap();
    let fat = out.section(".hip_fatbin").unwrap().unwrap();
    assert!(fat.is_nobits());
    let meta = out.section(".rocm_kpack_ref").unwrap().unwrap();
    assert_eq!((meta.addr, meta.offset, meta.data), (PAGE, PAGE, META));
    // Wrapper: HIPK, co_index 0; its relocation now names the metadata.
    let w = out.section(".hipFatBinSegment").unwrap().unwrap();
    let wrapper = Wrapper::parse(w.data.try_into().unwrap());
    assert_eq!((wrapper.magic, wrapper.reserved1), (HIPK_MAGIC, 0));
    assert_eq!(out.relas().unwrap()[0].r_addend, PAGE as i64);
    // The moved .dynsym: DT_SYMTAB and its section header follow, and the
    // fatbin symbol now names the metadata section.
    let dynsym = &out.shdrs()[DYNSYM];
    assert!(dynsym.sh_addr(LE) > PAGE);
    let syms: &[crate::elf::Sym] = dynsym.data_as_array(LE, &t_bytes[..]).unwrap();
    assert_eq!(syms[1].st_value(LE), PAGE);
    assert_eq!(usize::from(syms[1].st_shndx(LE)), out.shdrs().len() - 1);
    let dynamic = out.section(".dynamic").unwrap().unwrap();
    let symtab = crate::bytes::u64_at(dynamic.data, 8).unwrap();
    assert_eq!(symtab, dynsym.sh_addr(LE));
    // The RW segment moved down by the removed pages, its bytes unchanged
    // but for the wrapper and the three dynamic entries of moved sections.
    let rw = |e: &ElfView| {
        let p = e
            .phdrs()
            .iter()
            .find(|p| p.is_load() && p.p_flags(LE) & elf::PF_W != 0);
        let p = p.unwrap();
        (p.p_offset(LE) as usize, p.p_filesz(LE) as usize)
    };
    let (in_off, len) = rw(&ElfView::parse(b).unwrap());
    let (out_off, out_len) = rw(&out);
    assert_eq!((in_off - out_off, len), (2 * PAGE as usize, out_len));
    let differ: Vec<usize> = (0..len)
        .filter(|&k| b[in_off + k] != t_bytes[out_off + k])
        .collect();
    let dyn_rel = (dynamic.offset as usize) - out_off;
    let allowed = |k: usize| {
        k < 24
            || [8, 24, 40]
                .iter()
                .any(|d| (dyn_rel + d..dyn_rel + d + 8).contains(&k))
    };
    assert!(differ.iter().all(|&k| allowed(k)), "{differ:?}");
    assert!(!differ.is_empty());
    let x1 = out.phdrs()[1];
    assert!(x1.is_load() && x1.p_memsz(LE) == 4 * PAGE);
}

#[test]
fn write_small_section_in_place() {
    let (b, t, t_bytes) = transformed(&Spec {
        bundles: vec![600],
        ..Spec::default()
    });
    assert_eq!(t.removed, 0);
    // Nothing of the bundle stays: the section's old bytes are zero after
    // the metadata.
    let out = ElfView::parse(&t_bytes).unwrap();
    let fat_in = ElfView::parse(b)
        .unwrap()
        .section(".hip_fatbin")
        .unwrap()
        .unwrap();
    let start = (fat_in.offset as usize) + META.len();
    let end = (fat_in.offset + fat_in.size) as usize;
    assert!(t_bytes[start..end].iter().all(|&c| c == 0));
    assert!(out.section(".hip_fatbin").unwrap().unwrap().is_nobits());
    assert_eq!(out.phdrs().len(), 4);
}

#[test]
fn write_several_bundles_and_page_aligned_end() {
    let (_, t, t_bytes) = transformed(&Spec {
        bundles: vec![PAGE as usize, 2 * PAGE as usize],
        wrappers: vec![Some(0), Some(1)],
        fatbin_ends_on_page: true,
        ..Spec::default()
    });
    let cos: Vec<u32> = t.wrappers.iter().map(|w| w.co_index).collect();
    assert_eq!(cos, vec![0, 1]);
    assert!(t.removed >= 4 * PAGE);
    // Transforming the output again is refused: it is offloaded.
    assert_eq!(
        analyze(&t_bytes).err().unwrap(),
        TransformError::HalfOffloaded
    );
}

/// GNU ld on AArch64 (and ppc64le) aligns segments to 64 KiB but
/// `.hip_fatbin` only to 4 KiB: pages are removed from the first 64 KiB
/// boundary after the metadata to the last one inside the section.
#[test]
fn large_page_unit_with_a_section_off_the_boundary() {
    const UNIT: u64 = 0x10000;
    let spec = Spec {
        // 0x1000 + 7 pages of 64 KiB and a bit: six whole units inside.
        bundles: vec![7 * UNIT as usize - 2 * PAGE as usize],
        align: UNIT,
        ..Spec::default()
    };
    let b = build(&spec);
    let input = analyze(&b).unwrap();
    assert_eq!((input.unit, input.fatbin.addr), (UNIT, PAGE));
    let p = plan(&input, &offload_request()).unwrap();
    assert!(p.split);
    // Kept: up to the first unit boundary; removed: whole units up to the
    // last boundary inside the section.
    assert_eq!(PAGE + p.keep, UNIT);
    assert_eq!(p.cut.start, UNIT);
    assert_eq!(p.cut_addr_end, (input.fatbin.end() / UNIT) * UNIT);
    assert_eq!(p.cut.removed % UNIT, 0);
    assert_eq!(p.cut.removed, 6 * UNIT);
    let t = transform(&b, META).unwrap();
    let t_bytes = t.to_vec();
    assert_eq!(t.removed, 6 * UNIT);
    assert!(t_bytes.len() < b.len() - 5 * UNIT as usize);
    let v = verify_elf(&t_bytes, Some(t.bundles)).unwrap();
    assert_eq!(v.metadata_addr, PAGE);
    let out = ElfView::parse(&t_bytes).unwrap();
    for ph in out.phdrs().iter().filter(|p| p.is_load()) {
        assert_eq!(ph.p_offset(LE) % UNIT, ph.p_vaddr(LE) % UNIT);
    }
}

/// A note right after the table stays at the start of its segment (moved
/// only as far as the grown table needs) while the rest of the block moves
/// to the kept page: `objcopy --only-keep-debug` keeps notes' bytes and
/// cannot lay out a segment where they come after sections it empties.
#[test]
fn notes_stay_ahead_of_the_moved_block() {
    let b = build(&Spec {
        note: true,
        ..Spec::default()
    });
    let input = analyze(&b).unwrap();
    let p = plan(&input, &offload_request()).unwrap();
    let new_table_end = EHDR_SIZE as u64 + 6 * PHDR_SIZE as u64;
    assert!(p.split);
    assert_eq!(p.phdrs.len(), 6);
    assert_eq!(p.notes.len(), 1);
    assert_eq!(p.notes[0].new_off, new_table_end);
    let (_, _, t_bytes) = transformed(&Spec {
        note: true,
        ..Spec::default()
    });
    let out = ElfView::parse(&t_bytes).unwrap();
    let note = out.section(".note.gnu.build-id").unwrap().unwrap();
    assert_eq!(
        (note.offset, note.addr, note.data),
        (new_table_end, new_table_end, NOTE)
    );
    let pt_note = out
        .phdrs()
        .iter()
        .find(|p| p.p_type(LE) == elf::PT_NOTE)
        .unwrap();
    assert_eq!(
        (pt_note.p_offset(LE), pt_note.p_vaddr(LE)),
        (new_table_end, new_table_end)
    );
    // Every other allocated section of the first segment comes after it.
    let dynsym = out.section(".dynsym").unwrap().unwrap();
    assert!(dynsym.addr > PAGE);
    for s in out.sections().unwrap().iter().skip(1) {
        if s.flags & u64::from(elf::SHF_ALLOC) != 0 && s.addr < PAGE && s.name != note.name {
            panic!("{} at {:#x} stays before the kept page", s.name, s.addr);
        }
    }
}

/// The bundles of a fat binary's `.hip_fatbin`, as they are: what a prune
/// that keeps everything writes back.
fn section_bundles(b: &[u8]) -> Vec<u8> {
    let sec = ElfView::parse(b)
        .unwrap()
        .section(".hip_fatbin")
        .unwrap()
        .unwrap();
    let end = crate::bundle::parse_fatbin(sec.data)
        .unwrap()
        .last()
        .unwrap()
        .range
        .end;
    sec.data[..end].to_vec()
}

#[test]
fn prune_keeps_the_bundles_and_removes_the_pages_after_them() {
    let spec = Spec {
        bundles: vec![PAGE as usize, 2 * PAGE as usize],
        wrappers: vec![Some(0), Some(1)],
        ..Spec::default()
    };
    let b = build(&spec);
    let all = section_bundles(&b);
    // Only the first bundle is kept; the second wrapper points at it too.
    let first = crate::bundle::parse_fatbin(&all).unwrap()[0].range.clone();
    let second = crate::bundle::parse_fatbin(&all).unwrap()[1].range.start as u64;
    let kept = all[first.clone()].to_vec();
    let req = Request::Prune {
        bundles: &kept,
        starts: vec![(0, 0), (second, 0)],
    };
    let t = rewrite(&b, &req).unwrap();
    let t_bytes = t.to_vec();
    let v = crate::offload::elf::verify::verify_fat(&t_bytes).unwrap();
    assert_eq!((v.bundles, v.wrapper_bundles.clone()), (1, vec![0, 0]));
    assert_eq!(classify(&t_bytes), Class::Fat);
    assert!(t.removed > 0 && t.removed.is_multiple_of(PAGE));
    let out = ElfView::parse(&t_bytes).unwrap();
    let sec = out.section(".hip_fatbin").unwrap().unwrap();
    assert_eq!(sec.addr, PAGE);
    assert_eq!(sec.data, &kept[..]);
    // A payload larger than the section has no room.
    let big = vec![0u8; 1 << 20];
    let req = Request::Prune {
        bundles: &big,
        starts: vec![(0, 0), (second, 0)],
    };
    assert!(matches!(
        rewrite(&b, &req),
        Err(TransformError::NoRoom { .. })
    ));
}

#[test]
fn restore_puts_the_pages_back() {
    let spec = Spec {
        bundles: vec![PAGE as usize, 2 * PAGE as usize],
        wrappers: vec![Some(0), Some(1)],
        trailer: false,
        ..Spec::default()
    };
    let b = build(&spec);
    let all = section_bundles(&b);
    let starts: Vec<(u32, u64)> = crate::bundle::parse_fatbin(&all)
        .unwrap()
        .iter()
        .map(|x| (x.index as u32, x.range.start as u64))
        .collect();
    let (_, t, t_bytes) = transformed(&spec);
    // More than the range holds (up to the next section): a clear error.
    let mut too_big = all.clone();
    too_big.resize(all.len() + 2 * PAGE as usize, 0);
    let req = Request::Restore {
        bundles: Payload::Bytes(&too_big),
        starts: starts.clone(),
        align: PAGE,
    };
    assert!(matches!(
        rewrite(&t_bytes, &req),
        Err(TransformError::RangeTooSmall { .. })
    ));
    // The whole section back: every page, X1 and X2 one segment again
    // (the input's program headers).
    let req = Request::Restore {
        bundles: Payload::Bytes(&all),
        starts: starts.clone(),
        align: PAGE,
    };
    let r = rewrite(&t_bytes, &req).unwrap();
    let r_bytes = r.to_vec();
    assert_eq!(r.inserted, t.removed);
    // The pages back, one section header (the metadata's) less.
    assert_eq!(r_bytes.len() as u64, t_bytes.len() as u64 + r.inserted - 64);
    let v = crate::offload::elf::verify::verify_fat(&r_bytes).unwrap();
    assert_eq!(v.wrapper_bundles, vec![0, 1]);
    let out = ElfView::parse(&r_bytes).unwrap();
    assert!(out.section(".rocm_kpack_ref").unwrap().is_none());
    assert_eq!(out.phdrs().len(), ElfView::parse(&b).unwrap().phdrs().len());
    // One small bundle for both: only the pages it needs come back, and
    // the segments stay as offload left them.
    let first = crate::bundle::parse_fatbin(&all).unwrap()[0].range.clone();
    let one = all[first].to_vec();
    let req = Request::Restore {
        bundles: Payload::Bytes(&one),
        starts: vec![(0, 0), (1, 0)],
        align: PAGE,
    };
    let r = rewrite(&t_bytes, &req).unwrap();
    let r_bytes = r.to_vec();
    assert!(r.inserted < t.removed && r.inserted.is_multiple_of(PAGE));
    let v = crate::offload::elf::verify::verify_fat(&r_bytes).unwrap();
    assert_eq!(v.wrapper_bundles, vec![0, 0]);
    let out = ElfView::parse(&r_bytes).unwrap();
    assert_eq!(
        out.phdrs().len(),
        ElfView::parse(&t_bytes).unwrap().phdrs().len()
    );
    // A fat binary is not restorable.
    assert!(matches!(
        rewrite(&b, &req),
        Err(TransformError::NotRestorable(_))
    ));
}
