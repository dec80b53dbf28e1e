//! The crate-level error: a format error (or I/O error) tied to the file it
//! came from. Each format module has its own error enum that says what was
//! wrong in the bytes; this type adds the path.

use std::io;
use std::path::{Path, PathBuf};

use crate::archive::ArchiveError;
use crate::binary::{BinaryError, Inconsistency};
use crate::bundle::BundleError;
use crate::elf::ElfError;
use crate::hipk::HipkError;
use crate::offload::elf::TransformError;
use crate::offload::pe::PeTransformError;
use crate::offload::verify::VerifyError;
use crate::pe::PeError;
use crate::target::TargetError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {source}", path.display())]
    Bundle {
        path: PathBuf,
        #[source]
        source: BundleError,
    },
    #[error("{}: {source}", path.display())]
    Archive {
        path: PathBuf,
        #[source]
        source: ArchiveError,
    },
    #[error("{}: {source}", path.display())]
    Elf {
        path: PathBuf,
        #[source]
        source: ElfError,
    },
    #[error("{}: {source}", path.display())]
    Pe {
        path: PathBuf,
        #[source]
        source: PeError,
    },
    #[error("{}: {source}", path.display())]
    Hipk {
        path: PathBuf,
        #[source]
        source: HipkError,
    },
    /// A host binary whose device-code parts contradict each other.
    #[error("{}: {source}", path.display())]
    Inconsistent {
        path: PathBuf,
        #[source]
        source: Inconsistency,
    },
    /// The ELF transform (offload, prune, restore) cannot rewrite the
    /// binary.
    #[error("{}: {source}", path.display())]
    Transform {
        path: PathBuf,
        #[source]
        source: TransformError,
    },
    /// The PE transform cannot rewrite the image.
    #[error("{}: {source}", path.display())]
    PeTransform {
        path: PathBuf,
        #[source]
        source: PeTransformError,
    },
    /// The binary fails the verifier.
    #[error("{}: {source}", path.display())]
    Verify {
        path: PathBuf,
        #[source]
        source: VerifyError,
    },
    /// What kpack wrote for the binary (its `output`: rewritten, pruned,
    /// restored) fails the verifier: a bug in kpack, not in the input.
    #[error("{}: internal error: the {output} binary fails verification: {source}", path.display())]
    SelfCheck {
        path: PathBuf,
        output: &'static str,
        #[source]
        source: VerifyError,
    },
    /// The loader's search for the code object `key` of the binary failed.
    #[error("{}: {key}: {source}", path.display())]
    Load {
        path: PathBuf,
        key: String,
        #[source]
        source: Box<kpack_loader::LoadError>,
    },
    /// Compressing `what` (a bundle) for the binary failed.
    #[error("{}: compressing {what}: {source}", path.display())]
    Compress {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// A requested target (`--targets`) that is not a target ID.
    #[error("{}: --targets {target}: {source}", path.display())]
    Target {
        path: PathBuf,
        target: String,
        #[source]
        source: TargetError,
    },
    /// The file exists and is readable but is none of the kinds the operation
    /// accepts.
    #[error("{}: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },
    /// A request that does not fit the input (e.g. a target the file lacks).
    #[error("{}: {what}", path.display())]
    Request { path: PathBuf, what: String },
}

impl Error {
    pub fn io(path: impl AsRef<Path>, source: io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// A request that does not fit the input ([`Error::Request`]).
    pub fn request(path: impl AsRef<Path>, what: impl Into<String>) -> Self {
        Error::Request {
            path: path.as_ref().to_path_buf(),
            what: what.into(),
        }
    }

    /// Why a file is not a host binary kpack can read: the container's
    /// error ([`Error::Elf`], [`Error::Pe`]).
    pub fn binary(path: impl AsRef<Path>, e: BinaryError) -> Self {
        let path = path.as_ref().to_path_buf();
        match e {
            BinaryError::Elf(source) => Error::Elf { path, source },
            BinaryError::Pe(source) => Error::Pe { path, source },
        }
    }

    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Error::Io { path, .. }
            | Error::Bundle { path, .. }
            | Error::Archive { path, .. }
            | Error::Elf { path, .. }
            | Error::Pe { path, .. }
            | Error::Hipk { path, .. }
            | Error::Inconsistent { path, .. }
            | Error::Transform { path, .. }
            | Error::PeTransform { path, .. }
            | Error::Verify { path, .. }
            | Error::SelfCheck { path, .. }
            | Error::Load { path, .. }
            | Error::Compress { path, .. }
            | Error::Target { path, .. }
            | Error::Unsupported { path, .. }
            | Error::Request { path, .. } => path,
        }
    }
}

/// Attach a path to a format-level result.
pub trait WithPath<T> {
    fn with_path(self, path: impl AsRef<Path>) -> Result<T>;
}

macro_rules! with_path_impl {
    ($err:ty, $variant:ident) => {
        impl<T> WithPath<T> for std::result::Result<T, $err> {
            fn with_path(self, path: impl AsRef<Path>) -> Result<T> {
                self.map_err(|source| Error::$variant {
                    path: path.as_ref().to_path_buf(),
                    source,
                })
            }
        }
    };
}
with_path_impl!(io::Error, Io);
with_path_impl!(BundleError, Bundle);
with_path_impl!(ArchiveError, Archive);
with_path_impl!(ElfError, Elf);
with_path_impl!(HipkError, Hipk);
with_path_impl!(PeError, Pe);
with_path_impl!(Inconsistency, Inconsistent);
with_path_impl!(TransformError, Transform);
with_path_impl!(PeTransformError, PeTransform);
with_path_impl!(VerifyError, Verify);

impl<T> WithPath<T> for std::result::Result<T, BinaryError> {
    fn with_path(self, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| Error::binary(path, e))
    }
}

/// The loader's open errors keep their variants.
impl From<kpack_loader::OpenError> for Error {
    fn from(e: kpack_loader::OpenError) -> Self {
        match e {
            kpack_loader::OpenError::Io { path, source } => Error::Io { path, source },
            kpack_loader::OpenError::Archive { path, source } => Error::Archive { path, source },
        }
    }
}
