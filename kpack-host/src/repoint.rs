//! Re-pointing an offloaded binary (`kpack bundle`): its HIPK metadata
//! replaced in place by other metadata (other search paths) that fits in
//! the bytes the old one had, ELF and PE alike. The metadata section keeps
//! its address and file range; its size in the section header becomes the
//! new metadata's (the bytes after it zeroed), so readers that decode the
//! section whole (upstream's Python) see exactly the new map. A PE image
//! with a checksum gets its checksum computed again. Nothing else changes.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::binary::{HostBinary, Role};
use object::read::elf::{FileHeader as _, SectionHeader as _};

use crate::elf::LE;
use crate::error::{Error, Result, WithPath};
use crate::hipk::HipkMetadata;
use crate::offload::verify_shipped;

/// Where the metadata is and where its size is recorded.
struct Place {
    /// File offset of the metadata bytes, and how many there are.
    offset: u64,
    len: u64,
    /// File offset and width (4 or 8 bytes) of the size field.
    size_field: (u64, usize),
    /// PE: the checksum field, when the image has a checksum.
    checksum_at: Option<u64>,
}

/// How many bytes of metadata the offloaded binary `bytes` has room for.
pub fn room(path: &Path, bytes: &[u8]) -> Result<u64> {
    Ok(place(path, bytes)?.len)
}

/// Write the offloaded binary `bytes` (read from `path`) into `out` (an
/// empty file) with its metadata replaced by `metadata`, and check the
/// result as the binary verifier checks any offloaded binary. The new
/// metadata must fit in the old one's bytes.
pub fn repoint(path: &Path, bytes: &[u8], metadata: &HipkMetadata, out: &mut File) -> Result<()> {
    let p = place(path, bytes)?;
    let encoded = metadata.encode();
    if encoded.len() as u64 > p.len {
        return Err(Error::request(
            path,
            format!(
                "the new HIPK metadata needs {} bytes, the binary has room for {}",
                encoded.len(),
                p.len
            ),
        ));
    }
    out.write_all(bytes).with_path(path)?;
    let mut new = encoded.clone();
    new.resize(p.len as usize, 0);
    out.write_all_at(&new, p.offset).with_path(path)?;
    let size = encoded.len() as u64;
    let field = match p.size_field.1 {
        8 => size.to_le_bytes().to_vec(),
        _ => (size as u32).to_le_bytes().to_vec(),
    };
    out.write_all_at(&field, p.size_field.0).with_path(path)?;
    if let Some(at) = p.checksum_at {
        crate::pe::fill_checksum(out, at).with_path(path)?;
    }
    let written = crate::input::map_open(path, out)?;
    verify_shipped(&written).map_err(|source| Error::SelfCheck {
        path: path.into(),
        output: "re-pointed",
        source,
    })?;
    Ok(())
}

/// The metadata section of an offloaded binary.
fn place(path: &Path, bytes: &[u8]) -> Result<Place> {
    let bin = HostBinary::parse(bytes).with_path(path)?;
    let missing = || Error::request(path, "not an offloaded binary (no HIPK metadata section)");
    match bin {
        HostBinary::Elf(elf) => {
            let name = bin.section_name(Role::Metadata);
            let i = elf.section_index(name).ok_or_else(missing)?;
            let sh = &elf.shdrs()[i];
            let h = elf.header();
            let at = h.e_shoff(LE) + i as u64 * u64::from(h.e_shentsize(LE));
            Ok(Place {
                offset: sh.sh_offset(LE),
                len: sh.sh_size(LE),
                size_field: (at + 32, 8),
                checksum_at: None,
            })
        }
        HostBinary::Pe(pe) => {
            let name = bin.section_name(Role::Metadata);
            let s = pe.section(name).with_path(path)?.ok_or_else(missing)?;
            let header = pe.section_table_offset() + s.index as u64 * 40;
            let checksum = pe.optional_header().check_sum.get(LE);
            Ok(Place {
                offset: s.raw_offset,
                len: s.virtual_size.min(s.raw_size),
                size_field: (header + 8, 4),
                checksum_at: (checksum != 0).then(|| pe.optional_header_offset() + 64),
            })
        }
    }
}
