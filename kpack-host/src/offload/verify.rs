//! What the verifiers of rewritten binaries (ELF: `offload::elf::verify`,
//! PE: `offload::pe::verify`) share: their error, what a valid offloaded
//! binary holds, and the checks of an offloaded wrapper.

use serde::Serialize;

use crate::binary::WrapperSlot;
use crate::elf::ElfError;
use crate::hipk::{HipkMetadata, HIPK_MAGIC};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error(transparent)]
    Pe(#[from] crate::pe::PeError),
    #[error("not a valid offloaded binary: {}", .0.join("; "))]
    Problems(Vec<String>),
    /// What the ELF verifier's `verify_fat` finds wrong: the rules of a fat binary.
    #[error("not a valid fat binary: {}", .0.join("; "))]
    FatProblems(Vec<String>),
}

/// What a valid offloaded binary holds.
#[derive(Debug, Clone, Serialize)]
pub struct Verified {
    pub metadata: HipkMetadata,
    pub metadata_addr: u64,
    /// `reserved1` (the code object index) of each wrapper.
    pub co_indices: Vec<u64>,
    /// The reference tools' defects found and accepted (`Rules::Shipped` of the ELF verifier),
    /// and the limits of ROCm's HRX runtime the metadata exceeds
    /// ([`kpack_format::hrx`]; `verify_shipped`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The checks of an offloaded wrapper that ELF and PE share: HIPK,
/// version 1, a code object index that names a bundle (of `bundles`, when
/// known). Returns that index.
pub(crate) fn check_hipk_wrapper(
    slot: &WrapperSlot,
    bundles: Option<usize>,
    bad: &mut Vec<String>,
) -> u64 {
    let (k, w) = (slot.index, slot.wrapper);
    if w.magic != HIPK_MAGIC {
        bad.push(format!("wrapper {k}: magic {:#010x} is not HIPK", w.magic));
    }
    if w.version != 1 {
        bad.push(format!("wrapper {k}: version {} is not 1", w.version));
    }
    if w.reserved1 > u64::from(u32::MAX) || bundles.is_some_and(|n| w.reserved1 >= n as u64) {
        bad.push(format!(
            "wrapper {k}: code object index {} names no bundle",
            w.reserved1
        ));
    }
    w.reserved1
}
