//! What the ELF and PE rewrites both refuse in a binary's device code
//! sections, with the section's name as each container spells it.

use std::fmt;

use crate::bundle::BundleError;
use crate::offload::wrappers::WrapperError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SectionError {
    #[error("{section}: {source}")]
    Bundle {
        section: &'static str,
        source: BundleError,
    },
    #[error("no {section} section: not a fat binary")]
    NotFat { section: &'static str },
    #[error(transparent)]
    Wrapper(#[from] WrapperError),
    #[error("{reloc} {what} inside {section} [{start:#x}, {end:#x}), whose bytes are removed")]
    RelocationIntoRemoved {
        reloc: Reloc,
        what: &'static str,
        section: &'static str,
        start: u64,
        end: u64,
    },
}

/// A relocation as its container names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloc {
    /// An ELF dynamic relocation, by the address it applies to.
    Elf(u64),
    /// A PE base relocation, by the RVA it applies to.
    Pe(u64),
}

impl fmt::Display for Reloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reloc::Elf(at) => write!(f, "relocation at {at:#x}"),
            Reloc::Pe(rva) => write!(f, "base relocation at RVA {rva:#x}"),
        }
    }
}
