//! The device code of link inputs (`kpack ls`): a relocatable object or a
//! static archive, whose device code is in `.llvm.offloading` (clang's new
//! offload driver, `-fgpu-rdc`: LLVM offload binaries, one image per
//! target) or in `.hip_fatbin` (a bundle, the classic driver). Nothing is
//! offloaded from link inputs; this describes what is there.

use std::path::Path;

use object::read::archive::ArchiveFile;
use serde::Serialize;

use crate::bundle::list_fatbin;
use crate::elf::{ElfView, FATBIN_SECTION};
use crate::error::{Error, Result};
use kpack_format::offloading;

/// A link input's device code.
#[derive(Debug, Serialize)]
pub struct LinkInputListing {
    pub file: String,
    pub file_size: u64,
    /// `relocatable` (an object file) or `static_archive`.
    pub container: &'static str,
    /// Distinct device targets, sorted.
    pub targets: Vec<String>,
    /// The objects with device code (an object file: itself).
    pub members: Vec<MemberListing>,
}

/// One object with device code.
#[derive(Debug, Serialize)]
pub struct MemberListing {
    pub name: String,
    /// `.llvm.offloading` or `.hip_fatbin`.
    pub section: &'static str,
    pub images: Vec<ImageListing>,
}

/// One device image.
#[derive(Debug, Serialize)]
pub struct ImageListing {
    /// `llvm ir`, `elf` (a code object), ... (`llvm-objdump --offloading`'s
    /// names).
    pub kind: String,
    /// `hip`, `openmp`, ...
    pub producer: String,
    pub triple: String,
    pub target: String,
    pub size: u64,
}

/// Describe the link input `bytes` (a relocatable object or a static
/// archive) at `path`; an error naming it when no object in it carries
/// device code.
pub fn list(path: &Path, bytes: &[u8], archive: bool) -> Result<LinkInputListing> {
    let members = if archive {
        archive_members(path, bytes)?
    } else {
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        object_member(path, &name, bytes)?.into_iter().collect()
    };
    let what = if archive {
        "static archive"
    } else {
        "relocatable object"
    };
    if members.is_empty() {
        return Err(Error::Unsupported {
            path: path.into(),
            what: format!(
                "a {what} (a link input) without device code (no {} or {FATBIN_SECTION})",
                offloading::SECTION
            ),
        });
    }
    let mut targets: Vec<String> = members
        .iter()
        .flat_map(|m| m.images.iter().map(|i| i.target.clone()))
        .collect();
    targets.sort();
    targets.dedup();
    Ok(LinkInputListing {
        file: path.display().to_string(),
        file_size: bytes.len() as u64,
        container: if archive {
            "static_archive"
        } else {
            "relocatable"
        },
        targets,
        members,
    })
}

/// The members of a static archive that carry device code.
fn archive_members(path: &Path, bytes: &[u8]) -> Result<Vec<MemberListing>> {
    let bad = |e: object::Error| Error::Unsupported {
        path: path.into(),
        what: format!("a static archive that does not read: {e}"),
    };
    let ar = ArchiveFile::parse(bytes).map_err(bad)?;
    let mut out = Vec::new();
    for m in ar.members() {
        let m = m.map_err(bad)?;
        let data = m.data(bytes).map_err(bad)?;
        if !data.starts_with(&object::elf::ELFMAG) {
            continue;
        }
        let name = String::from_utf8_lossy(m.name()).into_owned();
        out.extend(object_member(path, &name, data)?);
    }
    Ok(out)
}

/// The device code of one ELF object `data` (named `name`), if it has any.
fn object_member(path: &Path, name: &str, data: &[u8]) -> Result<Option<MemberListing>> {
    let in_member = |what: String| Error::Unsupported {
        path: path.into(),
        what: format!("{name}: {what}"),
    };
    let elf = ElfView::parse(data).map_err(|e| in_member(e.to_string()))?;
    let section = |n: &str| elf.section(n).map_err(|e| in_member(e.to_string()));
    if let Some(s) = section(offloading::SECTION)?.filter(|s| !s.is_nobits()) {
        let images = offloading::parse(s.data).map_err(|e| in_member(e.to_string()))?;
        let images = images
            .into_iter()
            .map(|i| ImageListing {
                size: i.range.len() as u64,
                kind: i.kind,
                producer: i.producer,
                triple: i.triple,
                target: i.arch,
            })
            .collect();
        return Ok(Some(MemberListing {
            name: name.to_string(),
            section: offloading::SECTION,
            images,
        }));
    }
    let Some(s) = section(FATBIN_SECTION)?.filter(|s| !s.is_nobits()) else {
        return Ok(None);
    };
    let bundles = list_fatbin(s.data).map_err(|e| in_member(e.to_string()))?;
    let images = bundles
        .iter()
        .flat_map(|b| b.entries.iter().filter(|e| !e.is_host()))
        .map(|e| ImageListing {
            kind: "elf".into(),
            producer: "hip".into(),
            triple: e.triple.clone(),
            target: e.target().to_string(),
            size: e.size,
        })
        .collect();
    Ok(Some(MemberListing {
        name: name.to_string(),
        section: FATBIN_SECTION,
        images,
    }))
}
