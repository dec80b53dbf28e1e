//! A fat binary as a whole: the `.hip_fatbin` bundles of an ELF file (or a
//! raw bundle file), its wrappers, and, for an offloaded binary, its HIPK
//! metadata. The one place that finds device code in an input file.

use std::path::Path;

use crate::bundle::{parse_fatbin, Bundle};
use crate::elf::{ElfType, ElfView, Section, FATBIN_SECTION, METADATA_SECTION, WRAPPER_SECTION};
use crate::error::{Error, Result, WithPath};
use crate::hipk::{HipkMetadata, Wrapper, WRAPPER_SIZE};
use crate::input::{classify, FileKind};

/// Where the bundles came from.
#[derive(Debug, Clone)]
pub enum Container {
    /// A raw bundle file.
    Raw,
    /// An ELF file's `.hip_fatbin` section.
    Elf {
        elf_type: ElfType,
        section_offset: u64,
        section_addr: u64,
    },
}

/// The device code of a fat binary.
pub struct FatBinary<'a> {
    pub container: Container,
    /// The bytes the bundles were parsed from (the section, or the file).
    pub data: &'a [u8],
    pub bundles: Vec<Bundle<'a>>,
    /// The wrappers of `.hipFatBinSegment` (ELF only; may be empty).
    pub wrappers: Vec<Wrapper>,
}

/// An ELF host binary whose device code was offloaded: `.hip_fatbin` is
/// NOBITS (or gone) and `.rocm_kpack_ref` holds the HIPK metadata.
pub struct Offloaded {
    pub elf_type: ElfType,
    pub metadata: HipkMetadata,
    pub metadata_addr: u64,
    pub wrappers: Vec<Wrapper>,
}

/// What an ELF or bundle file holds.
pub enum DeviceCode<'a> {
    Fat(FatBinary<'a>),
    Offloaded(Offloaded),
}

/// Read the wrappers of `.hipFatBinSegment`, each `binary` pointer resolved
/// through its relocation (the value it has at load time, relative to the
/// load base).
pub fn read_wrappers(path: &Path, elf: &ElfView) -> Result<Vec<Wrapper>> {
    let Some(sec) = elf.section(WRAPPER_SECTION).with_path(path)? else {
        return Ok(Vec::new());
    };
    if sec.is_nobits() {
        return Ok(Vec::new());
    }
    if sec.data.len() % WRAPPER_SIZE != 0 {
        return Err(Error::Elf {
            path: path.into(),
            source: crate::elf::ElfError::BadSection {
                name: WRAPPER_SECTION.into(),
                problem: format!(
                    "size {} is not a multiple of {WRAPPER_SIZE}",
                    sec.data.len()
                ),
            },
        });
    }
    // Show the pointer as it is at load time (relative to the load base):
    // in a PIE or shared object a relocation supplies it.
    let bytes = elf.bytes();
    let headers = crate::elf::Headers::parse(bytes).with_path(path)?;
    let relas = crate::elf::read_relas(bytes, &headers).with_path(path)?;
    let relr = crate::elf::read_relr(bytes, &headers).with_path(path)?;
    Ok(sec
        .data
        .chunks_exact(WRAPPER_SIZE)
        .enumerate()
        .map(|(k, c)| {
            let mut w = Wrapper::parse(c.try_into().expect("wrapper size"));
            let at = (k * WRAPPER_SIZE + 8) as u64;
            if let Ok(p) = crate::elf::pointer_at(
                bytes,
                &headers,
                &relas,
                &relr,
                sec.addr + at,
                sec.offset + at,
            ) {
                w.binary = p.value;
            }
            w
        })
        .collect())
}

fn progbits<'a>(s: Option<Section<'a>>) -> Option<Section<'a>> {
    s.filter(|s| !s.is_nobits())
}

/// Find the device code of a file's bytes: a raw bundle file, an ELF fat
/// binary, or an offloaded ELF host binary. Anything else is an error that
/// says what the file is.
pub fn read_device_code<'a>(path: &Path, bytes: &'a [u8]) -> Result<DeviceCode<'a>> {
    match classify(bytes) {
        FileKind::Bundle => {
            let bundles = parse_fatbin(bytes).with_path(path)?;
            Ok(DeviceCode::Fat(FatBinary {
                container: Container::Raw,
                data: bytes,
                bundles,
                wrappers: Vec::new(),
            }))
        }
        FileKind::Elf => {
            let elf = ElfView::parse(bytes).with_path(path)?;
            let wrappers = read_wrappers(path, &elf)?;
            if let Some(meta) = elf.section(METADATA_SECTION).with_path(path)? {
                let metadata = HipkMetadata::decode(meta.data).with_path(path)?;
                if progbits(elf.section(FATBIN_SECTION).with_path(path)?).is_none() {
                    return Ok(DeviceCode::Offloaded(Offloaded {
                        elf_type: elf.elf_type(),
                        metadata,
                        metadata_addr: meta.addr,
                        wrappers,
                    }));
                }
            }
            let Some(sec) = progbits(elf.section(FATBIN_SECTION).with_path(path)?) else {
                return Err(Error::Unsupported {
                    path: path.into(),
                    what: format!("ELF file without device code (no {FATBIN_SECTION} section)"),
                });
            };
            let bundles = parse_fatbin(sec.data).with_path(path)?;
            Ok(DeviceCode::Fat(FatBinary {
                container: Container::Elf {
                    elf_type: elf.elf_type(),
                    section_offset: sec.offset,
                    section_addr: sec.addr,
                },
                data: sec.data,
                bundles,
                wrappers,
            }))
        }
        FileKind::Archive => Err(Error::Unsupported {
            path: path.into(),
            what: "a .kpack archive, not a binary".into(),
        }),
        FileKind::Other => Err(Error::Unsupported {
            path: path.into(),
            what: "neither an ELF binary, an offload bundle nor a .kpack archive".into(),
        }),
    }
}
