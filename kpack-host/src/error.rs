//! The crate-level error: a format error (or I/O error) tied to the file it
//! came from. Each format module has its own error enum that says what was
//! wrong in the bytes; this type adds the path.

use std::io;
use std::path::{Path, PathBuf};

use crate::archive::ArchiveError;
use crate::binary::BinaryError;
use crate::bundle::BundleError;
use crate::elf::ElfError;
use crate::hipk::HipkError;
use crate::pe::PeError;

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

    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Error::Io { path, .. }
            | Error::Bundle { path, .. }
            | Error::Archive { path, .. }
            | Error::Elf { path, .. }
            | Error::Pe { path, .. }
            | Error::Hipk { path, .. }
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

impl<T> WithPath<T> for std::result::Result<T, BinaryError> {
    fn with_path(self, path: impl AsRef<Path>) -> Result<T> {
        let path = path.as_ref().to_path_buf();
        self.map_err(|e| match e {
            BinaryError::Elf(source) => Error::Elf { path, source },
            BinaryError::Pe(source) => Error::Pe { path, source },
        })
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
