//! What the ELF and PE rewrites both refuse in a binary's device code
//! sections, with the section's name as each container spells it.

use std::fmt;

use crate::bundle::BundleError;
use crate::offload::wrappers::WrapperError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SectionError {
    #[error("{}: {source}", .container.fatbin_section())]
    Bundle {
        container: Container,
        source: Box<BundleError>,
    },
    #[error("no {} section: not a fat binary", .0.fatbin_section())]
    NotFat(Container),
    #[error(transparent)]
    Wrapper(#[from] WrapperError),
    #[error("{reloc} {what} inside {} [{start:#x}, {end:#x}), whose bytes are removed", .reloc.container().fatbin_section())]
    RelocationIntoRemoved {
        reloc: Reloc,
        what: &'static str,
        start: u64,
        end: u64,
    },
}

/// The container of a host binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    Elf,
    Pe,
}

impl Container {
    /// The name of its section of bundles.
    pub fn fatbin_section(self) -> &'static str {
        match self {
            Container::Elf => crate::elf::FATBIN_SECTION,
            Container::Pe => crate::pe::FATBIN_SECTION,
        }
    }
}

/// A relocation as its container names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloc {
    /// An ELF dynamic relocation, by the address it applies to.
    Elf(u64),
    /// A PE base relocation, by the RVA it applies to.
    Pe(u64),
}

impl Reloc {
    fn container(self) -> Container {
        match self {
            Reloc::Elf(_) => Container::Elf,
            Reloc::Pe(_) => Container::Pe,
        }
    }
}

impl fmt::Display for Reloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reloc::Elf(at) => write!(f, "relocation at {at:#x}"),
            Reloc::Pe(rva) => write!(f, "base relocation at RVA {rva:#x}"),
        }
    }
}

/// `From` a bundle error and a wrapper error for a rewrite's error `$error`
/// (which has a `Section(SectionError)` variant), for binaries of
/// `$container`: `?` on either names the container's section.
macro_rules! from_section_errors {
    ($error:ty, $container:expr) => {
        impl From<$crate::bundle::BundleError> for $error {
            fn from(source: $crate::bundle::BundleError) -> Self {
                let container = $container;
                let source = Box::new(source);
                $crate::offload::section::SectionError::Bundle { container, source }.into()
            }
        }

        impl From<$crate::offload::wrappers::WrapperError> for $error {
            fn from(e: $crate::offload::wrappers::WrapperError) -> Self {
                $crate::offload::section::SectionError::Wrapper(e).into()
            }
        }
    };
}
pub(crate) use from_section_errors;
