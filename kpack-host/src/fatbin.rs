//! The device code of a file as a whole: the bundles of a fat binary (or of
//! a raw bundle file) with its wrappers, or, for an offloaded binary, its
//! HIPK metadata. What `ls` and `extract` show; built on
//! [`crate::binary`]'s classification and wrapper reader. Bundles are
//! listed from their headers and entry tables (`kpack_bundle::list_fatbin`):
//! a compressed bundle is not decompressed whole here; [`FatBinary::stream`]
//! reads the code objects.

use std::path::Path;

use crate::binary::{
    classify_parsed, could_be_binary, BinaryKind, Class, Classified, HostBinary, Role,
};
use crate::bundle::{list_fatbin, BundleInfo, FatbinStream};
use crate::error::{Error, Result, WithPath};
use crate::hipk::{HipkMetadata, Wrapper};

/// Where the bundles came from.
#[derive(Debug, Clone)]
pub enum Container {
    /// A raw bundle file.
    Raw,
    /// A host binary's bundle section (ELF `.hip_fatbin`, PE `.hip_fat`).
    Host {
        kind: BinaryKind,
        section_name: &'static str,
        section_offset: u64,
        section_addr: u64,
    },
}

/// The device code of a fat binary.
pub struct FatBinary<'a> {
    pub container: Container,
    /// The bytes the bundles were parsed from (the section, or the file).
    pub data: &'a [u8],
    /// The bundles, from their headers and entry tables.
    pub bundles: Vec<BundleInfo>,
    /// The wrappers, each `binary` pointer at its load-time value (relative
    /// to the load base).
    pub wrappers: Vec<Wrapper>,
}

impl<'a> FatBinary<'a> {
    /// The code objects, read in order with bounded memory.
    pub fn stream(&self) -> FatbinStream<'a> {
        FatbinStream::new(self.data)
    }
}

/// A host binary whose device code was offloaded: the bundle section is
/// NOBITS (or gone; PE: zero-filled) and the metadata section
/// (`.rocm_kpack_ref`, `.kpackrf`) holds the HIPK metadata.
pub struct Offloaded {
    pub kind: BinaryKind,
    pub metadata: HipkMetadata,
    pub metadata_addr: u64,
    pub wrappers: Vec<Wrapper>,
}

/// What a host binary or bundle file holds.
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

/// Find the device code of a file's bytes: a raw bundle file, an ELF or PE
/// fat binary, or an offloaded host binary. Anything else is an error that
/// says what the file is.
pub fn read_device_code<'a>(path: &Path, bytes: &'a [u8]) -> Result<DeviceCode<'a>> {
    device_code(path, &classify_parsed(bytes))
}

/// [`read_device_code`] of a file classified already.
pub fn device_code<'a>(path: &Path, file: &Classified<'a>) -> Result<DeviceCode<'a>> {
    let bytes = file.bytes;
    match &file.class {
        Class::Bundle => {
            let bundles = list_fatbin(bytes).with_path(path)?;
            Ok(DeviceCode::Fat(FatBinary {
                container: Container::Raw,
                data: bytes,
                bundles,
                wrappers: Vec::new(),
            }))
        }
        Class::Archive => unsupported(path, "a .kpack archive, not a binary"),
        Class::StaticArchive => unsupported(path, "a static archive (a link input), not a binary"),
        Class::Other if !could_be_binary(bytes) => unsupported(
            path,
            "neither an ELF or PE binary, an offload bundle nor a .kpack archive",
        ),
        class => {
            // ELF or PE: parse errors are reported as they are.
            let bin = file.binary.clone().with_path(path)?;
            host_device_code(path, &bin, class)
        }
    }
}

fn host_device_code<'a>(
    path: &Path,
    bin: &HostBinary<'a>,
    class: &Class,
) -> Result<DeviceCode<'a>> {
    bin.check_sections().with_path(path)?;
    let fatbin_name = bin.section_name(Role::Fatbin);
    let fatbin = bin.fatbin().with_path(path)?.filter(|s| !s.is_nobits());
    let wrappers = bin.wrappers().with_path(path)?.loaded();
    let offloaded = fatbin.is_none() || *class == Class::Offloaded;
    if let (true, Some(meta)) = (offloaded, bin.metadata().with_path(path)?) {
        // Offloaded, or inconsistent but still worth describing.
        return Ok(DeviceCode::Offloaded(Offloaded {
            kind: bin.kind(),
            metadata: HipkMetadata::decode(meta.data).with_path(path)?,
            metadata_addr: meta.addr,
            wrappers,
        }));
    }
    let Some(sec) = fatbin else {
        return match class {
            Class::DebugOnly => unsupported(
                path,
                format!("a debug-info file (NOBITS {fatbin_name}, no metadata): no device code"),
            ),
            Class::Inconsistent(why) => Err(why.clone()).with_path(path),
            _ if bin.pe().is_some() => unsupported(
                path,
                format!("PE file without device code (no {fatbin_name} section)"),
            ),
            _ => unsupported(
                path,
                format!("ELF file without device code (no {fatbin_name} section)"),
            ),
        };
    };
    Ok(DeviceCode::Fat(FatBinary {
        container: Container::Host {
            kind: bin.kind(),
            section_name: fatbin_name,
            section_offset: sec.offset,
            section_addr: sec.addr,
        },
        data: sec.data,
        bundles: list_fatbin(sec.data).with_path(path)?,
        wrappers,
    }))
}
