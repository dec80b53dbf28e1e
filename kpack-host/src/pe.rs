//! PE/COFF host binaries (Windows DLLs and executables), read through
//! `object`'s PE header types over borrowed bytes: the DOS and NT headers,
//! the section table, the data directories, the base relocations, and what
//! a 64-bit pointer field of the loaded image resolves to.
//!
//! Only PE32+ images for x86-64 are read (what HIP builds on Windows);
//! PE32 images and other machines are refused by name. Addresses are RVAs
//! (relative to the image base, as ELF addresses of a shared object are
//! relative to its load base); file offsets are file offsets.

use object::pe::{
    ImageDataDirectory, ImageDosHeader, ImageFileHeader, ImageOptionalHeader64, ImageSectionHeader,
};
use object::read::pe::RelocationBlockIterator;
use object::LittleEndian as LE;
use object::ReadRef as _;

use crate::elf::{Pointer, PointerKind};

/// The section holding the offload bundles (`.hip_fatbin` cut to 8 bytes).
pub const FATBIN_SECTION: &str = ".hip_fat";
/// The section holding the `__CudaFatBinaryWrapper` array.
pub(crate) const WRAPPER_SECTION: &str = ".hipFatB";
/// The section holding the HIPK metadata of an offloaded binary.
pub(crate) const METADATA_SECTION: &str = ".kpackrf";

/// Size of a section header.
pub(crate) const SECTION_HEADER_SIZE: u64 = 40;
/// Offset of `CheckSum` in the optional header.
pub(crate) const CHECKSUM_OFFSET: u64 = 64;
/// Size of an `IMAGE_DEBUG_DIRECTORY` entry.
pub(crate) const DEBUG_ENTRY_SIZE: u64 = 28;

pub use object::pe::{
    IMAGE_DIRECTORY_ENTRY_BASERELOC, IMAGE_DIRECTORY_ENTRY_DEBUG, IMAGE_DIRECTORY_ENTRY_EXPORT,
    IMAGE_DIRECTORY_ENTRY_IMPORT, IMAGE_DIRECTORY_ENTRY_SECURITY, IMAGE_REL_BASED_ABSOLUTE,
    IMAGE_REL_BASED_DIR64, IMAGE_SCN_CNT_INITIALIZED_DATA, IMAGE_SCN_MEM_READ, IMAGE_SCN_MEM_WRITE,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeError {
    #[error("not a PE file")]
    NotPe,
    #[error("unsupported PE: {0} (kpack handles PE32+ images for x86-64)")]
    Unsupported(String),
    #[error("malformed PE: {0}")]
    Malformed(String),
    #[error("section {name}: {problem}")]
    BadSection { name: String, problem: String },
}

fn malformed(what: impl Into<String>) -> PeError {
    PeError::Malformed(what.into())
}

/// What kind of image a PE file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PeKind {
    /// `IMAGE_FILE_DLL` set.
    Dll,
    Exe,
}

/// One section, decoded: its memory range (RVA, `VirtualSize`) and its
/// bytes in the file (`PointerToRawData`, `SizeOfRawData`).
#[derive(Debug, Clone)]
pub struct PeSection<'a> {
    pub index: usize,
    pub name: String,
    pub rva: u64,
    pub virtual_size: u64,
    pub raw_offset: u64,
    pub raw_size: u64,
    pub characteristics: u32,
    /// The section's initialized bytes: the raw data, cut to
    /// `VirtualSize` (the loader zero-fills the rest).
    pub data: &'a [u8],
}

impl PeSection<'_> {
    /// The memory size: `VirtualSize`, or `SizeOfRawData` when that is 0.
    pub fn mem_size(&self) -> u64 {
        if self.virtual_size == 0 {
            self.raw_size
        } else {
            self.virtual_size
        }
    }

    pub(crate) fn contains_rva(&self, rva: u64) -> bool {
        (self.rva..self.rva + self.mem_size()).contains(&rva)
    }
}

/// One base relocation: the RVA it applies to, its type, and the file
/// offset of its 16-bit entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseReloc {
    pub rva: u64,
    pub typ: u16,
}

/// A parsed PE32+ image over borrowed bytes, bounds-checked.
#[derive(Clone, Copy)]
pub struct PeView<'a> {
    data: &'a [u8],
    /// File offset of the `PE\0\0` signature.
    nt_offset: u64,
    file: &'a ImageFileHeader,
    opt: &'a ImageOptionalHeader64,
    dirs: &'a [ImageDataDirectory],
    sections: &'a [ImageSectionHeader],
}

/// Does `data` start like a PE image (an `MZ` header)?
pub fn is_pe(data: &[u8]) -> bool {
    data.starts_with(b"MZ")
}

/// The name of a COFF machine, for messages.
pub(crate) fn machine_name(machine: u16) -> String {
    use object::pe::*;
    let name = match machine {
        IMAGE_FILE_MACHINE_I386 => "x86 (IMAGE_FILE_MACHINE_I386)",
        IMAGE_FILE_MACHINE_AMD64 => "x86-64 (IMAGE_FILE_MACHINE_AMD64)",
        IMAGE_FILE_MACHINE_ARM64 => "AArch64 (IMAGE_FILE_MACHINE_ARM64)",
        IMAGE_FILE_MACHINE_ARM64EC => "ARM64EC (IMAGE_FILE_MACHINE_ARM64EC)",
        IMAGE_FILE_MACHINE_ARMNT => "32-bit Arm (IMAGE_FILE_MACHINE_ARMNT)",
        _ => return format!("{machine:#06x}"),
    };
    format!("{name}, {machine:#06x}")
}

/// Where the NT headers of an image are: the offset of the `PE\0\0`
/// signature (checked) and the COFF file header after it.
fn nt_headers(data: &[u8]) -> Result<(u64, &ImageFileHeader), PeError> {
    let dos: &ImageDosHeader = data
        .read_at(0)
        .map_err(|_| malformed("truncated DOS header"))?;
    let nt_offset = u64::from(dos.e_lfanew.get(LE));
    let sig: &object::U32<LE> = data
        .read_at(nt_offset)
        .map_err(|_| malformed(format!("NT headers at {nt_offset:#x} lie outside the file")))?;
    if sig.get(LE) != object::pe::IMAGE_NT_SIGNATURE {
        return Err(malformed("no PE\\0\\0 signature"));
    }
    let file: &ImageFileHeader = data
        .read_at(nt_offset + 4)
        .map_err(|_| malformed("truncated COFF file header"))?;
    Ok((nt_offset, file))
}

/// Refuse all but PE32+ images for x86-64: the optional header's magic at
/// `opt_offset`, then the machine of `file`.
fn check_pe32_plus_amd64(
    data: &[u8],
    file: &ImageFileHeader,
    opt_offset: u64,
) -> Result<(), PeError> {
    let magic: &object::U16<LE> = data
        .read_at(opt_offset)
        .map_err(|_| malformed("truncated optional header"))?;
    match magic.get(LE) {
        object::pe::IMAGE_NT_OPTIONAL_HDR64_MAGIC => {}
        object::pe::IMAGE_NT_OPTIONAL_HDR32_MAGIC => {
            return Err(PeError::Unsupported("a PE32 (32-bit) image".into()))
        }
        m => return Err(malformed(format!("unknown optional header magic {m:#x}"))),
    }
    let machine = file.machine.get(LE);
    if machine != object::pe::IMAGE_FILE_MACHINE_AMD64 {
        return Err(PeError::Unsupported(format!(
            "machine {}",
            machine_name(machine)
        )));
    }
    Ok(())
}

/// The data directories after the fixed part of the optional header at
/// `opt_offset`: as many as it claims, fit in `SizeOfOptionalHeader`
/// (`opt_size`) and at most 16.
fn data_directories<'a>(
    data: &'a [u8],
    opt: &ImageOptionalHeader64,
    opt_offset: u64,
    opt_size: u64,
) -> Result<&'a [ImageDataDirectory], PeError> {
    let fixed = std::mem::size_of::<ImageOptionalHeader64>() as u64;
    let room = opt_size
        .checked_sub(fixed)
        .ok_or_else(|| malformed(format!("SizeOfOptionalHeader {opt_size} is too small")))?
        / 8;
    let ndirs = u64::from(opt.number_of_rva_and_sizes.get(LE))
        .min(room)
        .min(16);
    data.read_slice_at(opt_offset + fixed, ndirs as usize)
        .map_err(|_| malformed("data directories lie outside the file"))
}

/// The section table at `table`, `file`'s `NumberOfSections` entries.
fn section_table<'a>(
    data: &'a [u8],
    file: &ImageFileHeader,
    table: u64,
) -> Result<&'a [ImageSectionHeader], PeError> {
    let nsec = usize::from(file.number_of_sections.get(LE));
    data.read_slice_at(table, nsec).map_err(|_| {
        malformed(format!(
            "section table ({nsec} sections at {table:#x}) lies outside the file"
        ))
    })
}

impl<'a> PeView<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Self, PeError> {
        if !is_pe(data) {
            return Err(PeError::NotPe);
        }
        let (nt_offset, file) = nt_headers(data)?;
        let opt_offset = nt_offset + 4 + std::mem::size_of::<ImageFileHeader>() as u64;
        check_pe32_plus_amd64(data, file, opt_offset)?;
        let opt: &ImageOptionalHeader64 = data
            .read_at(opt_offset)
            .map_err(|_| malformed("truncated optional header"))?;
        let opt_size = u64::from(file.size_of_optional_header.get(LE));
        let dirs = data_directories(data, opt, opt_offset, opt_size)?;
        let sections = section_table(data, file, opt_offset + opt_size)?;
        Ok(PeView {
            data,
            nt_offset,
            file,
            opt,
            dirs,
            sections,
        })
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    pub fn file_header(&self) -> &'a ImageFileHeader {
        self.file
    }

    pub(crate) fn optional_header(&self) -> &'a ImageOptionalHeader64 {
        self.opt
    }

    /// File offset of the COFF file header.
    pub fn file_header_offset(&self) -> u64 {
        self.nt_offset + 4
    }

    /// File offset of the optional header.
    pub(crate) fn optional_header_offset(&self) -> u64 {
        self.file_header_offset() + std::mem::size_of::<ImageFileHeader>() as u64
    }

    /// File offset of the data directory array.
    pub(crate) fn directories_offset(&self) -> u64 {
        self.optional_header_offset() + std::mem::size_of::<ImageOptionalHeader64>() as u64
    }

    /// File offset of the section table.
    pub(crate) fn section_table_offset(&self) -> u64 {
        self.optional_header_offset() + u64::from(self.file.size_of_optional_header.get(LE))
    }

    pub fn kind(&self) -> PeKind {
        if self.file.characteristics.get(LE) & object::pe::IMAGE_FILE_DLL != 0 {
            PeKind::Dll
        } else {
            PeKind::Exe
        }
    }

    pub fn image_base(&self) -> u64 {
        self.opt.image_base.get(LE)
    }

    pub fn file_alignment(&self) -> u64 {
        u64::from(self.opt.file_alignment.get(LE))
    }

    pub(crate) fn section_alignment(&self) -> u64 {
        u64::from(self.opt.section_alignment.get(LE))
    }

    pub(crate) fn size_of_headers(&self) -> u64 {
        u64::from(self.opt.size_of_headers.get(LE))
    }

    /// The section headers, in table order.
    pub(crate) fn section_headers(&self) -> &'a [ImageSectionHeader] {
        self.sections
    }

    /// Data directory `i` as (RVA or file offset, size); (0, 0) when absent.
    pub fn directory(&self, i: usize) -> (u64, u64) {
        self.dirs.get(i).map_or((0, 0), |d| {
            (
                u64::from(d.virtual_address.get(LE)),
                u64::from(d.size.get(LE)),
            )
        })
    }

    pub fn directory_count(&self) -> usize {
        self.dirs.len()
    }

    /// All sections, decoded, in table order.
    pub fn sections(&self) -> Result<Vec<PeSection<'a>>, PeError> {
        (0..self.sections.len()).map(|i| self.describe(i)).collect()
    }

    /// Index of the first section with this (8-byte) name.
    pub fn section_index(&self, name: &str) -> Option<usize> {
        self.sections
            .iter()
            .position(|s| section_name(&s.name) == name)
    }

    /// The first section with this name.
    pub fn section(&self, name: &str) -> Result<Option<PeSection<'a>>, PeError> {
        self.section_index(name)
            .map(|i| self.describe(i))
            .transpose()
    }

    fn describe(&self, index: usize) -> Result<PeSection<'a>, PeError> {
        let s = &self.sections[index];
        let name = section_name(&s.name);
        let raw_offset = u64::from(s.pointer_to_raw_data.get(LE));
        let raw_size = u64::from(s.size_of_raw_data.get(LE));
        let virtual_size = u64::from(s.virtual_size.get(LE));
        let used = if virtual_size == 0 {
            raw_size
        } else {
            raw_size.min(virtual_size)
        };
        let data = if raw_size == 0 {
            &[][..]
        } else {
            self.data
                .read_bytes_at(raw_offset, raw_size)
                .map_err(|_| PeError::BadSection {
                    name: name.clone(),
                    problem: format!(
                        "its raw data ({raw_size:#x} bytes at {raw_offset:#x}) lies outside the file"
                    ),
                })?
        };
        Ok(PeSection {
            index,
            name,
            rva: u64::from(s.virtual_address.get(LE)),
            virtual_size,
            raw_offset,
            raw_size,
            characteristics: s.characteristics.get(LE),
            data: &data[..used as usize],
        })
    }

    /// Check that every section's raw data lies inside the file.
    pub(crate) fn check_sections(&self) -> Result<(), PeError> {
        self.sections().map(drop)
    }

    /// File offset of `len` bytes at `rva`, through the section whose raw
    /// data holds them.
    pub(crate) fn rva_to_offset(&self, rva: u64, len: u64) -> Option<u64> {
        self.sections.iter().find_map(|s| {
            let start = u64::from(s.virtual_address.get(LE));
            let raw = u64::from(s.size_of_raw_data.get(LE));
            let vsize = u64::from(s.virtual_size.get(LE));
            let filled = if vsize == 0 { raw } else { raw.min(vsize) };
            (rva >= start && rva.checked_add(len)? <= start + filled)
                .then(|| rva - start + u64::from(s.pointer_to_raw_data.get(LE)))
        })
    }

    /// Every base relocation (type `ABSOLUTE` padding left out).
    pub(crate) fn base_relocations(&self) -> Result<Vec<BaseReloc>, PeError> {
        let (rva, size) = self.directory(IMAGE_DIRECTORY_ENTRY_BASERELOC);
        if size == 0 {
            return Ok(Vec::new());
        }
        let bad = || malformed("the base relocation directory lies outside the file's sections");
        let off = self.rva_to_offset(rva, size).ok_or_else(bad)?;
        let bytes = self.data.read_bytes_at(off, size).map_err(|_| bad())?;
        let mut out = Vec::new();
        for block in RelocationBlockIterator::new(bytes) {
            let block = block.map_err(|e| malformed(format!("base relocations: {e}")))?;
            out.extend(
                block
                    .filter(|r| r.typ != IMAGE_REL_BASED_ABSOLUTE)
                    .map(|r| BaseReloc {
                        rva: u64::from(r.virtual_address),
                        typ: r.typ,
                    }),
            );
        }
        Ok(out)
    }

    /// The 64-bit pointer field at `rva`: its value at load time relative
    /// to the image base (an RVA), and whether a DIR64 base relocation
    /// rebases it.
    pub(crate) fn pointer_at(&self, relocs: &[BaseReloc], rva: u64) -> Result<Pointer, PeError> {
        let value = self
            .rva_to_offset(rva, 8)
            .and_then(|off| crate::bytes::u64_at(self.data, off))
            .ok_or_else(|| malformed(format!("pointer at RVA {rva:#x} lies outside the file")))?;
        let kind = match relocs.iter().find(|r| r.rva == rva) {
            Some(r) if r.typ == IMAGE_REL_BASED_DIR64 => PointerKind::BaseRelocDir64,
            Some(r) => {
                return Err(malformed(format!(
                    "pointer at RVA {rva:#x} has a base relocation of type {} (expected DIR64)",
                    r.typ
                )))
            }
            None => PointerKind::Absolute,
        };
        Ok(Pointer {
            value: value.wrapping_sub(self.image_base()),
            kind,
            rela: None,
        })
    }

    /// The PE checksum of `data` (the image's bytes with this layout),
    /// computed with the `CheckSum` field taken as zero.
    pub(crate) fn checksum_of(&self, data: &[u8]) -> u32 {
        checksum(data, self.optional_header_offset() + CHECKSUM_OFFSET)
    }
}

/// A section name: the 8 bytes up to the first NUL.
pub fn section_name(raw: &[u8; 8]) -> String {
    let end = raw.iter().position(|&c| c == 0).unwrap_or(8);
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// The image checksum (as `IMAGEHLP`'s `CheckSumMappedFile`): the 16-bit
/// one's-complement-style sum of the file's words, the 4 bytes at
/// `checksum_at` taken as zero, plus the file's length.
pub fn checksum(data: &[u8], checksum_at: u64) -> u32 {
    let mut sum = Checksum::new(checksum_at);
    sum.update(data);
    sum.finish()
}

/// Compute the image checksum of the file `f` (read in bounded chunks)
/// and write it at `checksum_at`.
pub fn fill_checksum(f: &std::fs::File, checksum_at: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = f.metadata()?.len();
    let mut sum = Checksum::new(checksum_at);
    let mut buf = vec![0u8; (1 << 20).min(len as usize)];
    let mut pos = 0u64;
    while pos < len {
        let n = ((len - pos) as usize).min(buf.len());
        f.read_exact_at(&mut buf[..n], pos)?;
        sum.update(&buf[..n]);
        pos += n as u64;
    }
    f.write_all_at(&sum.finish().to_le_bytes(), checksum_at)
}

/// [`checksum`] over a file read in consecutive chunks.
#[derive(Debug, Clone)]
pub struct Checksum {
    skip: std::ops::Range<u64>,
    sum: u64,
    len: u64,
}

impl Checksum {
    pub fn new(checksum_at: u64) -> Checksum {
        Checksum {
            skip: checksum_at..checksum_at.saturating_add(4),
            sum: 0,
            len: 0,
        }
    }

    /// The next bytes of the file: every chunk but the last of an even
    /// length.
    pub fn update(&mut self, data: &[u8]) {
        for (i, pair) in data.chunks(2).enumerate() {
            let at = self.len + (i * 2) as u64;
            let word = if self.skip.contains(&at) {
                0
            } else {
                u64::from(pair[0]) | pair.get(1).map_or(0, |&b| u64::from(b) << 8)
            };
            self.sum += word;
            self.sum = (self.sum & 0xffff) + (self.sum >> 16);
        }
        self.len += data.len() as u64;
    }

    pub fn finish(&self) -> u32 {
        let sum = (self.sum & 0xffff) + (self.sum >> 16);
        (sum as u32).wrapping_add(self.len as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // By hand: headers cut after a few bytes, which object::write cannot make.
    #[test]
    fn refuses_what_is_not_pe32_plus() {
        assert_eq!(PeView::parse(b"\x7fELF").err(), Some(PeError::NotPe));
        assert!(matches!(
            PeView::parse(b"MZ\0\0"),
            Err(PeError::Malformed(_))
        ));
        assert!(is_pe(b"MZxx"));
        assert_eq!(machine_name(0x14c), "x86 (IMAGE_FILE_MACHINE_I386), 0x014c");
        assert_eq!(machine_name(0x1234), "0x1234");
    }

    #[test]
    fn checksum_matches_a_hand_sum() {
        // Word 0x0201, the 4 skipped bytes, the odd byte 0x07, plus the
        // length 7.
        let data = [1, 2, 0xaa, 0xbb, 5, 6, 7];
        assert_eq!(checksum(&data, 2), 0x0201 + 0x07 + 7);
        assert_eq!(checksum(&data, 100), 0x0201 + 0xbbaa + 0x0605 + 0x07 + 7);
        // Carries fold back into the low 16 bits.
        let ff = [0xff; 4];
        assert_eq!(checksum(&ff, 100), 0xffff + 4);
    }
}
