//! The loader's errors and their one mapping to the C API's
//! `kpack_error_t` ([`ErrorCode`]): opening an archive ([`OpenError`]),
//! reading a code object ([`ArchiveError`]), a whole load ([`LoadError`])
//! and binary-path discovery ([`DiscoverError`]). kpack-cxx returns these
//! codes and `kpack why` reports them; neither decides a code itself.

use std::io;
use std::path::{Path, PathBuf};

use crate::archive::ArchiveError;
use crate::config::ENV_DISABLE;
use crate::discover::DiscoverError;
use crate::hipk::HipkError;

/// A file that could not be opened as what it was expected to be, with its
/// path.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {source}", path.display())]
    Archive {
        path: PathBuf,
        #[source]
        source: ArchiveError,
    },
}

impl OpenError {
    pub fn io(path: &Path, source: io::Error) -> Self {
        OpenError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            OpenError::Io { path, .. } | OpenError::Archive { path, .. } => path,
        }
    }
}

/// Why a code object could not be loaded. Each variant is one error code of
/// the C API.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// No architecture was given (`INVALID_ARGUMENT`).
    #[error("no architecture given")]
    NoArchitectures,
    /// `ROCM_KPACK_DISABLE` was set when the loader was created
    /// (`NOT_IMPLEMENTED`).
    #[error("kpack is disabled by {ENV_DISABLE}")]
    Disabled,
    /// The HIPK metadata is not valid (`INVALID_METADATA`).
    #[error(transparent)]
    Metadata(#[from] HipkError),
    /// An archive that lists a matching target failed to read the code
    /// object (`DECOMPRESSION_FAILED`, or `IO_ERROR` for
    /// [`ArchiveError::Io`]), and no other candidate had it.
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: ArchiveError,
    },
    /// Some archive lists a matching target, but none has the key
    /// (`KERNEL_NOT_FOUND`).
    #[error("no code object {key} for {} in the archives that serve those targets", archs.join(", "))]
    KernelNotFound { key: String, archs: Vec<String> },
    /// Archives opened, but none lists a target compatible with the
    /// requested architectures (`ARCH_NOT_FOUND`).
    #[error("{key}: no archive serves {}", archs.join(", "))]
    ArchNotFound { key: String, archs: Vec<String> },
    /// No candidate archive could be opened (`ARCHIVE_NOT_FOUND`).
    #[error("{key}: none of {} candidate archive(s) could be opened", candidates.len())]
    ArchiveNotFound {
        key: String,
        candidates: Vec<PathBuf>,
    },
    /// The buffer for the code object could not be allocated
    /// (`OUT_OF_MEMORY`).
    #[error("{key}: cannot allocate {size} bytes")]
    OutOfMemory { key: String, size: u64 },
}

/// The C API's `kpack_error_t` (formats.md §5.2), value for value: what a load
/// returns, for tools that report it (`kpack why`) and the C API alike
/// (kpack-cxx returns this very type across the FFI, hence `repr(C)`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ErrorCode {
    Success = 0,
    InvalidArgument = 1,
    FileNotFound = 2,
    InvalidFormat = 3,
    UnsupportedVersion = 4,
    KernelNotFound = 5,
    DecompressionFailed = 6,
    OutOfMemory = 7,
    NotImplemented = 8,
    IoError = 9,
    MsgpackParseFailed = 10,
    PathDiscoveryFailed = 11,
    InvalidMetadata = 12,
    ArchiveNotFound = 13,
    ArchNotFound = 14,
}

impl ErrorCode {
    /// The C name, e.g. `KPACK_ERROR_KERNEL_NOT_FOUND`.
    pub fn name(self) -> &'static str {
        use ErrorCode as E;
        match self {
            E::Success => "KPACK_SUCCESS",
            E::InvalidArgument => "KPACK_ERROR_INVALID_ARGUMENT",
            E::FileNotFound => "KPACK_ERROR_FILE_NOT_FOUND",
            E::InvalidFormat => "KPACK_ERROR_INVALID_FORMAT",
            E::UnsupportedVersion => "KPACK_ERROR_UNSUPPORTED_VERSION",
            E::KernelNotFound => "KPACK_ERROR_KERNEL_NOT_FOUND",
            E::DecompressionFailed => "KPACK_ERROR_DECOMPRESSION_FAILED",
            E::OutOfMemory => "KPACK_ERROR_OUT_OF_MEMORY",
            E::NotImplemented => "KPACK_ERROR_NOT_IMPLEMENTED",
            E::IoError => "KPACK_ERROR_IO_ERROR",
            E::MsgpackParseFailed => "KPACK_ERROR_MSGPACK_PARSE_FAILED",
            E::PathDiscoveryFailed => "KPACK_ERROR_PATH_DISCOVERY_FAILED",
            E::InvalidMetadata => "KPACK_ERROR_INVALID_METADATA",
            E::ArchiveNotFound => "KPACK_ERROR_ARCHIVE_NOT_FOUND",
            E::ArchNotFound => "KPACK_ERROR_ARCH_NOT_FOUND",
        }
    }

    /// The code of a failure to read a code object from an open archive.
    pub fn of_read(e: &ArchiveError) -> ErrorCode {
        match e {
            ArchiveError::KernelNotFound { .. } => ErrorCode::KernelNotFound,
            ArchiveError::Io(_) => ErrorCode::IoError,
            _ => ErrorCode::DecompressionFailed,
        }
    }
}

impl LoadError {
    /// The `kpack_error_t` that `kpack_load_code_object` returns for this.
    pub fn code(&self) -> ErrorCode {
        match self {
            LoadError::NoArchitectures => ErrorCode::InvalidArgument,
            LoadError::Disabled => ErrorCode::NotImplemented,
            LoadError::Metadata(_) => ErrorCode::InvalidMetadata,
            LoadError::Read { source, .. } => ErrorCode::of_read(source),
            LoadError::KernelNotFound { .. } => ErrorCode::KernelNotFound,
            LoadError::ArchNotFound { .. } => ErrorCode::ArchNotFound,
            LoadError::ArchiveNotFound { .. } => ErrorCode::ArchiveNotFound,
            LoadError::OutOfMemory { .. } => ErrorCode::OutOfMemory,
        }
    }
}

impl ErrorCode {
    /// The code of a failure to open an archive (`kpack_open`, and an
    /// archive the search could not open).
    pub fn of_open(e: &OpenError) -> ErrorCode {
        match e {
            OpenError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                ErrorCode::FileNotFound
            }
            OpenError::Io { .. } => ErrorCode::IoError,
            OpenError::Archive { source, .. } => match source {
                ArchiveError::UnsupportedVersion { .. }
                | ArchiveError::UnsupportedTocVersion { .. } => ErrorCode::UnsupportedVersion,
                ArchiveError::TocParse { .. } => ErrorCode::MsgpackParseFailed,
                ArchiveError::Io(_) => ErrorCode::IoError,
                _ => ErrorCode::InvalidFormat,
            },
        }
    }

    /// The code of a failure to find the binary mapped at an address.
    pub fn of_discover(e: &DiscoverError) -> ErrorCode {
        match e {
            DiscoverError::Unsupported => ErrorCode::NotImplemented,
            DiscoverError::Io(_) | DiscoverError::NotMapped(_) => ErrorCode::PathDiscoveryFailed,
        }
    }
}

/// The full text of an error as `kpack` prints it after `kpack: error: `:
/// its message, then each deeper cause its message does not already
/// include, separated by `: `. (The top error's message includes its direct
/// source.) The C++ API's `kpack::Error::what()` is this text too.
pub fn report(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source().and_then(|s| s.source());
    while let Some(s) = src {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        src = s.source();
    }
    msg
}
