//! What a rewrite of a host binary produces, ELF and PE alike: the output
//! as pieces of its input, and what changed in it.

use crate::elf::PointerKind;
use crate::image::Image;

/// What the transform did to one wrapper.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WrapperChange {
    pub index: usize,
    /// The bundle index the wrapper pointed at: its `reserved1` now.
    pub co_index: u32,
    /// How the pointer is applied at load time.
    pub pointer: PointerKind,
}

/// The result of a rewrite (ELF: `offload::elf::rewrite`, PE:
/// `offload::pe::rewrite`): the output as pieces of
/// the input and new bytes ([`Image`]; [`Image::write_to`] streams it into
/// a file), and what changed.
#[derive(Debug, Clone)]
pub struct Transformed<'a> {
    pub image: Image<'a>,
    /// PE: where the image checksum goes, computed over the output once it
    /// is written (`offload::write_checked`; [`Transformed::to_vec`] in
    /// memory).
    pub checksum_at: Option<u64>,
    pub wrappers: Vec<WrapperChange>,
    /// Address of the payload: the metadata (offload) or the first bundle.
    pub metadata_addr: u64,
    /// Where the payload is in `bytes`.
    pub payload_off: u64,
    /// Number of bundles in the input's `.hip_fatbin` (0 for an offloaded
    /// input).
    pub bundles: usize,
    /// Bytes removed from the file (whole pages).
    pub removed: u64,
    /// Bytes put back into the file (restore: whole pages).
    pub inserted: u64,
    /// Whether the program header table moved.
    pub moved_phdrs: bool,
}

impl Transformed<'_> {
    /// The whole output in memory (tests, and small binaries), checksum
    /// included.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = self.image.to_vec();
        if let Some(at) = self.checksum_at {
            let sum = crate::pe::checksum(&out, at).to_le_bytes();
            if let Some(field) = usize::try_from(at)
                .ok()
                .and_then(|a| out.get_mut(a..a.checked_add(4)?))
            {
                field.copy_from_slice(&sum);
            }
        }
        out
    }

    /// The output's length.
    pub fn len(&self) -> u64 {
        self.image.len()
    }

    pub fn is_empty(&self) -> bool {
        self.image.is_empty()
    }
}
