//! The wrapper table as the rewrites (offload, prune, restore; ELF and PE
//! alike) take it: which wrapper they refuse and why, and the bundle each
//! fat wrapper's pointer names.

use crate::binary::{Address, BinaryError, WrapperSlot};
use crate::elf::Pointer;
use crate::hipk::{HIPF_MAGIC, HIPK_MAGIC};

/// Why a rewrite cannot take a binary's wrapper table as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WrapperError {
    /// The table cannot be read ([`crate::binary::HostBinary::wrappers`]).
    #[error(transparent)]
    Table(BinaryError),
    #[error("wrapper {index}: unknown magic {magic:#010x} (expected HIPF {HIPF_MAGIC:#010x})")]
    UnknownMagic { index: usize, magic: u32 },
    #[error("wrapper {index}: version {version} (expected 1)")]
    UnknownVersion { index: usize, version: u32 },
    #[error("wrappers mix HIPF and HIPK magics: a partly offloaded binary")]
    Mixed,
    /// The wrapper's `binary` pointer does not resolve: a layout the
    /// rewrites do not support.
    #[error("unsupported layout: {source}")]
    Pointer { index: usize, source: BinaryError },
    /// The image has base relocations, but none on this wrapper's pointer
    /// (it would not follow the image when Windows moves it).
    #[error("unsupported layout: wrapper {index}: the image has base relocations but none rebases its pointer")]
    NotRebased { index: usize },
    #[error("wrapper {index}: binary pointer {pointer} does not point at the start of a bundle in {section} [{start:#x}, {end:#x})")]
    PointerNotAtBundle {
        index: usize,
        pointer: Address,
        section: &'static str,
        start: u64,
        end: u64,
    },
}

/// A fat binary's wrapper is HIPF (a HIPK one: the binary is partly
/// offloaded).
pub(crate) fn check_hipf(slot: &WrapperSlot) -> Result<(), WrapperError> {
    match slot.wrapper.magic {
        HIPF_MAGIC => Ok(()),
        HIPK_MAGIC => Err(WrapperError::Mixed),
        magic => Err(WrapperError::UnknownMagic {
            index: slot.index,
            magic,
        }),
    }
}

/// The wrapper's `binary` pointer, resolved.
pub(crate) fn resolved(slot: &WrapperSlot) -> Result<&Pointer, WrapperError> {
    slot.pointer
        .as_ref()
        .map_err(|source| WrapperError::Pointer {
            index: slot.index,
            source: source.clone(),
        })
}

/// Where the bundles of the fat binary section are: its name, its address
/// range (ELF: virtual addresses; PE: RVAs) and each bundle's offset in it.
pub(crate) struct BundleRange<'s> {
    pub section: &'static str,
    pub start: u64,
    pub end: u64,
    /// `(offset in the section, bundle index)` of each bundle.
    pub starts: &'s [(usize, usize)],
    /// How the container names an address.
    pub address: fn(u64) -> Address,
}

/// The index of the bundle whose first byte `p` points at: the code object
/// index the wrapper keeps as `reserved1`.
pub(crate) fn bundle_index(
    slot: &WrapperSlot,
    p: &Pointer,
    range: &BundleRange,
) -> Result<u32, WrapperError> {
    p.value
        .checked_sub(range.start)
        .and_then(|rel| range.starts.iter().find(|&&(s, _)| s as u64 == rel))
        .map(|&(_, bundle)| bundle as u32)
        .ok_or(WrapperError::PointerNotAtBundle {
            index: slot.index,
            pointer: (range.address)(p.value),
            section: range.section,
            start: range.start,
            end: range.end,
        })
}
