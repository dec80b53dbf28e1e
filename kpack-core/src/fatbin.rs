//! The device code of a file as a whole: the bundles of a fat binary (or of
//! a raw bundle file) with its wrappers, or, for an offloaded binary, its
//! HIPK metadata. What `ls` and `extract` show; built on
//! [`crate::binary`]'s classification and wrapper reader.

use std::path::Path;

use crate::binary::{classify, Class, HostBinary};
use crate::bundle::{parse_fatbin, Bundle};
use crate::elf::{ElfType, FATBIN_SECTION};
use crate::error::{Error, Result, WithPath};
use crate::hipk::{HipkMetadata, Wrapper};

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
    /// The wrappers, each `binary` pointer at its load-time value (relative
    /// to the load base).
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

fn unsupported<T>(path: &Path, what: impl Into<String>) -> Result<T> {
    Err(Error::Unsupported {
        path: path.into(),
        what: what.into(),
    })
}

/// Find the device code of a file's bytes: a raw bundle file, an ELF fat
/// binary, or an offloaded ELF host binary. Anything else is an error that
/// says what the file is.
pub fn read_device_code<'a>(path: &Path, bytes: &'a [u8]) -> Result<DeviceCode<'a>> {
    match classify(bytes) {
        Class::Bundle => {
            let bundles = parse_fatbin(bytes).with_path(path)?;
            Ok(DeviceCode::Fat(FatBinary {
                container: Container::Raw,
                data: bytes,
                bundles,
                wrappers: Vec::new(),
            }))
        }
        Class::Archive => unsupported(path, "a .kpack archive, not a binary"),
        Class::StaticArchive => unsupported(path, "a static archive (a link input), not a binary"),
        Class::Other if !bytes.starts_with(&object::elf::ELFMAG) => unsupported(
            path,
            "neither an ELF binary, an offload bundle nor a .kpack archive",
        ),
        class => {
            // ELF: parse errors are reported as they are.
            let bin = HostBinary::parse(bytes).with_path(path)?;
            host_device_code(path, &bin, class)
        }
    }
}

fn host_device_code<'a>(path: &Path, bin: &HostBinary<'a>, class: Class) -> Result<DeviceCode<'a>> {
    bin.elf().check_sections().with_path(path)?;
    let fatbin = bin.fatbin().with_path(path)?.filter(|s| !s.is_nobits());
    let wrappers = bin.wrappers().with_path(path)?.loaded();
    if let (None, Some(meta)) = (&fatbin, bin.metadata().with_path(path)?) {
        // Offloaded, or inconsistent but still worth describing.
        return Ok(DeviceCode::Offloaded(Offloaded {
            elf_type: bin.elf_type(),
            metadata: HipkMetadata::decode(meta.data).with_path(path)?,
            metadata_addr: meta.addr,
            wrappers,
        }));
    }
    let Some(sec) = fatbin else {
        return unsupported(
            path,
            match class {
                Class::DebugOnly => format!(
                    "a debug-info file (NOBITS {FATBIN_SECTION}, no metadata): no device code"
                ),
                Class::Inconsistent(why) => why,
                _ => format!("ELF file without device code (no {FATBIN_SECTION} section)"),
            },
        );
    };
    Ok(DeviceCode::Fat(FatBinary {
        container: Container::Elf {
            elf_type: bin.elf_type(),
            section_offset: sec.offset,
            section_addr: sec.addr,
        },
        data: sec.data,
        bundles: parse_fatbin(sec.data).with_path(path)?,
        wrappers,
    }))
}
