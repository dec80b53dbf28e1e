//! What `kpack ls` shows: a description of a fat binary, an archive or an
//! offloaded host binary, as plain data (serializable to JSON).

use std::path::Path;

use serde::Serialize;

use crate::binary::{classify_parsed, BinaryKind, Class};
use crate::bundle::Method;
use crate::elf::ElfType;
use crate::error::{Result, WithPath};
use crate::fatbin::{device_code, Container, DeviceCode, FatBinary};
use crate::hipk::{Wrapper, HIPF_MAGIC, HIPK_MAGIC};
use crate::input::map_file;
use crate::pe::PeKind;

#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Listing {
    FatBinary(FatBinaryListing),
    Archive(ArchiveListing),
    Offloaded(OffloadedListing),
    /// A relocatable object or static archive with device code.
    LinkInput(crate::link_input::LinkInputListing),
    CodeObject(CodeObjectListing),
}

/// An AMDGPU code object on its own (device code, not a host binary: wheels
/// such as amd-aiter ship thousands of `.co` files).
#[derive(Debug, Serialize)]
pub struct CodeObjectListing {
    pub file: String,
    pub file_size: u64,
    /// The target ID its metadata note records; `None` without one.
    pub target: Option<String>,
    /// The kernels it defines (its `*.kd` symbols), sorted.
    pub kernels: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct FatBinaryListing {
    pub file: String,
    pub file_size: u64,
    /// `bundle` for a raw bundle file, else the ELF type or the PE kind
    /// (`dll`, `exe`).
    pub container: String,
    /// The bundle section's name (`.hip_fatbin`, PE: `.hip_fat`); none for
    /// a raw bundle file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// The bundle section's offset in the file (host binaries only).
    pub section_offset: Option<u64>,
    pub section_size: u64,
    pub bundles: Vec<BundleListing>,
    /// Distinct device targets, sorted.
    pub targets: Vec<String>,
    pub wrappers: Vec<WrapperListing>,
}

#[derive(Debug, Serialize)]
pub struct BundleListing {
    pub index: usize,
    /// Offset of the bundle (or of the compressed bundle holding it) in the
    /// section.
    pub offset: usize,
    pub stored_size: usize,
    pub compressed: Option<CompressedListing>,
    /// Its device targets, sorted (bundles of one binary need not all hold
    /// the same).
    pub targets: Vec<String>,
    pub entries: Vec<EntryListing>,
}

/// The targets one code object index of an offloaded binary was built for
/// (`kpack_co_targets`).
#[derive(Debug, Serialize)]
pub struct CoTargetsListing {
    pub co_index: u64,
    pub targets: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct CompressedListing {
    pub version: u16,
    pub method: Method,
    pub uncompressed_size: u64,
    /// Whether the header's hash matches the decompressed data; `null` when
    /// not checked: a compressed bundle larger than
    /// `kpack_bundle::LIST_CHECK_LIMIT` is listed from its entry tables,
    /// without decompressing it whole.
    pub hash_matches: Option<bool>,
    /// Position of this bundle inside the compressed bundle.
    pub inner_index: usize,
}

#[derive(Debug, Serialize)]
pub struct EntryListing {
    pub triple: String,
    pub target: Option<String>,
    pub size: u64,
}

#[derive(Debug, Serialize)]
pub struct WrapperListing {
    pub index: usize,
    pub magic: String,
    pub version: u32,
    pub binary: u64,
    pub reserved1: u64,
}

#[derive(Debug, Serialize)]
pub struct ArchiveListing {
    pub file: String,
    pub file_size: u64,
    pub format_version: u32,
    pub group_name: String,
    pub gfx_arch_family: String,
    pub gfx_arches: Vec<String>,
    pub compression_scheme: String,
    pub kernels: Vec<KernelListing>,
}

#[derive(Debug, Serialize)]
pub struct KernelListing {
    pub key: String,
    pub target: String,
    pub ordinal: u64,
    pub original_size: u64,
    /// The digest of its code object (`code_object_sha256`), if recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_object_sha256: Option<String>,
    /// The device digest of the binary it was split from
    /// (`binary_sha256`), if recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binary_sha256: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct OffloadedListing {
    pub file: String,
    pub file_size: u64,
    /// ELF files: the ELF type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elf_type: Option<ElfType>,
    /// PE files: `dll` or `exe`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pe_kind: Option<PeKind>,
    pub kernel_name: String,
    pub search_paths: Vec<String>,
    /// The targets its code objects were split for (`kpack_targets`);
    /// `null` when the metadata does not record them (the reference tools,
    /// older kpack).
    pub targets: Option<Vec<String>>,
    /// The digest of the device code it was split from
    /// (`kpack_device_sha256`), when the metadata records it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_sha256: Option<String>,
    /// When its bundles did not all hold the same targets
    /// (`kpack_co_targets`): each code object index its wrappers name,
    /// with its bundle's targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle_targets: Option<Vec<CoTargetsListing>>,
    pub metadata_address: u64,
    pub wrappers: Vec<WrapperListing>,
}

fn magic_name(m: u32) -> String {
    match m {
        HIPF_MAGIC => "HIPF".into(),
        HIPK_MAGIC => "HIPK".into(),
        m => format!("{m:#010x}"),
    }
}

fn wrappers(ws: &[Wrapper]) -> Vec<WrapperListing> {
    ws.iter()
        .enumerate()
        .map(|(index, w)| WrapperListing {
            index,
            magic: magic_name(w.magic),
            version: w.version,
            binary: w.binary,
            reserved1: w.reserved1,
        })
        .collect()
}

/// Describe a file for `kpack ls`.
pub fn list(path: &Path) -> Result<Listing> {
    let mapped = map_file(path)?;
    let file = path.display().to_string();
    let file_size = mapped.len() as u64;
    let classified = classify_parsed(&mapped);
    if classified.class == Class::Archive {
        return Ok(Listing::Archive(archive_listing(path, file, file_size)?));
    }
    if classified.class == Class::CodeObject {
        let kernels = crate::kernels::defined_kernels(&mapped).with_path(path)?;
        return Ok(Listing::CodeObject(CodeObjectListing {
            file,
            file_size,
            target: crate::kernels::code_object_target(&mapped),
            kernels: kernels.into_iter().collect(),
        }));
    }
    if link_input_without_bundle(&classified) {
        let archive = classified.class == Class::StaticArchive;
        let l = crate::link_input::list(path, &mapped, archive)?;
        return Ok(Listing::LinkInput(l));
    }
    Ok(match device_code(path, &classified)? {
        DeviceCode::Fat(fat) => Listing::FatBinary(fat_listing(&fat, file, file_size)),
        DeviceCode::Offloaded(o) => Listing::Offloaded(OffloadedListing {
            file,
            file_size,
            elf_type: match o.kind {
                BinaryKind::Elf(t) => Some(t),
                BinaryKind::Pe(_) => None,
            },
            pe_kind: match o.kind {
                BinaryKind::Pe(k) => Some(k),
                BinaryKind::Elf(_) => None,
            },
            kernel_name: o.metadata.kernel_name.clone(),
            search_paths: o.metadata.search_paths.clone(),
            targets: o.metadata.targets.clone(),
            device_sha256: o.metadata.device_digest.clone(),
            bundle_targets: co_targets_listing(&o.metadata, &o.wrappers),
            metadata_address: o.metadata_addr,
            wrappers: wrappers(&o.wrappers),
        }),
    })
}

/// Each code object index of `wrappers` with its bundle's targets, when
/// the metadata records that they differ.
fn co_targets_listing(
    metadata: &crate::hipk::HipkMetadata,
    wrappers: &[Wrapper],
) -> Option<Vec<CoTargetsListing>> {
    metadata.co_targets.as_ref()?;
    let cos: std::collections::BTreeSet<u64> = wrappers.iter().map(|w| w.reserved1).collect();
    let listed = cos
        .into_iter()
        .map(|co| CoTargetsListing {
            co_index: co,
            targets: (metadata.co_index_targets(co).unwrap_or_default())
                .into_iter()
                .map(str::to_owned)
                .collect(),
        })
        .collect();
    Some(listed)
}

/// A static archive, or a relocatable object without a `.hip_fatbin` (its
/// device code, if any, in `.llvm.offloading`): listed as a link input.
fn link_input_without_bundle(file: &crate::binary::Classified) -> bool {
    match (&file.class, &file.binary) {
        (Class::StaticArchive, _) => true,
        (Class::Relocatable { .. }, Ok(bin)) => {
            !matches!(bin.fatbin(), Ok(Some(s)) if !s.is_nobits())
        }
        _ => false,
    }
}

fn archive_listing(path: &Path, file: String, file_size: u64) -> Result<ArchiveListing> {
    let a = kpack_loader::open_archive(path)?;
    let kernels = a
        .entries_by_ordinal()
        .map(|(key, target, e)| {
            let d = kpack_format::provenance::EntryDigests::of(e);
            KernelListing {
                key: key.to_string(),
                target: target.to_string(),
                ordinal: e.ordinal.into(),
                original_size: e.original_size,
                code_object_sha256: d.code_object,
                binary_sha256: d.binary,
            }
        })
        .collect();
    Ok(ArchiveListing {
        file,
        file_size,
        format_version: a.format_version(),
        group_name: a.group_name().to_string(),
        gfx_arch_family: a.gfx_arch_family().to_string(),
        gfx_arches: a.gfx_arches().to_vec(),
        compression_scheme: a.scheme().name().to_string(),
        kernels,
    })
}

fn fat_listing(fat: &FatBinary, file: String, file_size: u64) -> FatBinaryListing {
    let mut targets: Vec<String> = fat
        .bundles
        .iter()
        .flat_map(|b| b.device_entries().map(|e| e.target().to_string()))
        .collect();
    targets.sort();
    targets.dedup();
    let (container, section_name, section_offset) = match &fat.container {
        Container::Raw => ("bundle".to_string(), None, None),
        Container::Host {
            kind,
            section_name,
            section_offset,
            ..
        } => (
            kind.name(),
            Some(section_name.to_string()),
            Some(*section_offset),
        ),
    };
    FatBinaryListing {
        file,
        file_size,
        container,
        section_name,
        section_offset,
        section_size: fat.data.len() as u64,
        bundles: fat.bundles.iter().map(bundle_listing).collect(),
        targets,
        wrappers: wrappers(&fat.wrappers),
    }
}

fn bundle_listing(b: &crate::bundle::BundleInfo) -> BundleListing {
    BundleListing {
        index: b.index,
        offset: b.range.start,
        stored_size: b.range.len(),
        compressed: b.compressed.as_ref().map(|(c, i)| CompressedListing {
            version: c.version,
            method: c.method,
            uncompressed_size: c.uncompressed_size,
            hash_matches: c.hash_matches,
            inner_index: *i,
        }),
        targets: {
            let t: std::collections::BTreeSet<String> =
                b.device_entries().map(|e| e.target().to_string()).collect();
            t.into_iter().collect()
        },
        entries: b
            .entries
            .iter()
            .map(|e| EntryListing {
                triple: e.triple.clone(),
                target: (!e.is_host()).then(|| e.target().to_string()),
                size: e.size,
            })
            .collect(),
    }
}
