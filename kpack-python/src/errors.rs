//! The one place where kpack's Rust errors become Python exceptions.
//!
//! Every failure is classified here into a [`Kind`], whose class lives in
//! the Python module `kpack._errors` (the hierarchy under `kpack.Error`,
//! with the builtin bases Python code catches: `ValueError`,
//! `FileNotFoundError`, ...), and carries the message the `kpack` command
//! prints after `kpack: error: ` ([`kpack_host::report`]). The typed
//! errors of the engine and the host (and io) each have one classifying
//! function; an error known only as `dyn Error` (the command line's) is
//! classified as its type is.

use std::error::Error as StdError;
use std::io;

use kpack_engine::wheel::WheelError;
use kpack_engine::ArtifactError;
use kpack_format::archive::ArchiveError;
use pyo3::prelude::*;

/// What went wrong, as the Python API tells it apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Options or arguments that are wrong whatever the input.
    Usage,
    /// An input that is not what the operation accepts.
    Input,
    /// A malformed `.kpack` archive, or a kernel that does not read back.
    Archive,
    /// A malformed host binary, offload bundle or HIPK metadata.
    Binary,
    /// A host binary without device code where one with it is needed.
    NotFat,
    NotFound,
    PermissionDenied,
    /// An output that exists and is not replaced.
    OutputExists,
    /// Any other I/O error.
    File,
    /// A check that ran and failed (verify), or artifacts that failed.
    Verification,
    Other,
}

impl Kind {
    /// The class's name in `kpack._errors`.
    fn class_name(self) -> &'static str {
        match self {
            Kind::Usage => "UsageError",
            Kind::Input => "InputError",
            Kind::Archive => "ArchiveError",
            Kind::Binary => "BinaryError",
            Kind::NotFat => "NotFatBinaryError",
            Kind::NotFound => "NotFoundError",
            Kind::PermissionDenied => "PermissionDeniedError",
            Kind::OutputExists => "OutputExistsError",
            Kind::File => "FileError",
            Kind::Verification => "VerificationError",
            Kind::Other => "Error",
        }
    }
}

/// A classified failure: `Send`, so it crosses the GIL-free sections, and
/// turned into an exception once the GIL is held again. `summary`: what
/// the operation reported before failing (a batch split with failed
/// artifacts, a verify that found problems), set as the exception's
/// `summary`.
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: Kind,
    pub message: String,
    pub summary: Option<serde_json::Value>,
}

impl Failure {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
            summary: None,
        }
    }

    /// This failure, with what the operation reported.
    pub fn with_summary(mut self, summary: serde_json::Value) -> Self {
        self.summary = Some(summary);
        self
    }

    /// A typed error of kpack's crates, classified by `kind`; the message
    /// is the command line's ([`kpack_host::report`]).
    fn typed<E: StdError + 'static>(e: &E, kind: fn(&E) -> Kind) -> Self {
        Failure::new(kind(e), kpack_host::report(e))
    }

    /// An error of kpack's crates known only as `dyn Error` (what the
    /// `kpack` command line returns): its type found, then classified as
    /// that type is below.
    pub fn of(e: &(dyn StdError + 'static)) -> Self {
        Failure::new(kind_of(e), kpack_host::report(e))
    }

    /// The exception instance (not raised).
    pub fn instance(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let class = py
            .import("kpack._errors")?
            .getattr(self.kind.class_name())?;
        let e = class.call1((self.message.as_str(),))?;
        if let Some(s) = &self.summary {
            e.setattr("summary", crate::convert::json_to_py(py, s)?)?;
        }
        Ok(e.unbind())
    }

    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        match self.instance(py) {
            Ok(value) => PyErr::from_value(value.into_bound(py)),
            Err(e) => e,
        }
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        Python::attach(|py| f.into_pyerr(py))
    }
}

impl From<kpack_host::Error> for Failure {
    fn from(e: kpack_host::Error) -> Self {
        Failure::typed(&e, host_kind)
    }
}

impl From<ArtifactError> for Failure {
    fn from(e: ArtifactError) -> Self {
        Failure::typed(&e, artifact_kind)
    }
}

impl From<WheelError> for Failure {
    fn from(e: WheelError) -> Self {
        Failure::typed(&e, wheel_kind)
    }
}

impl From<ArchiveError> for Failure {
    fn from(e: ArchiveError) -> Self {
        Failure::typed(&e, archive_kind)
    }
}

impl From<kpack_loader::OpenError> for Failure {
    fn from(e: kpack_loader::OpenError) -> Self {
        Failure::typed(&e, open_kind)
    }
}

/// The kind of an error known only as `dyn Error`: that of its type.
fn kind_of(e: &(dyn StdError + 'static)) -> Kind {
    if let Some(h) = e.downcast_ref::<kpack_host::Error>() {
        return host_kind(h);
    }
    if let Some(a) = e.downcast_ref::<ArtifactError>() {
        return artifact_kind(a);
    }
    if let Some(w) = e.downcast_ref::<WheelError>() {
        return wheel_kind(w);
    }
    if let Some(a) = e.downcast_ref::<ArchiveError>() {
        return archive_kind(a);
    }
    if let Some(o) = e.downcast_ref::<kpack_loader::OpenError>() {
        return open_kind(o);
    }
    if let Some(io) = e.downcast_ref::<io::Error>() {
        return io_kind(io);
    }
    Kind::Other
}

fn wheel_kind(e: &WheelError) -> Kind {
    match e {
        WheelError::Invalid { .. } => Kind::Input,
        WheelError::Io { source, .. } => io_kind(source),
        WheelError::UnknownWheelType { .. } => Kind::Usage,
        WheelError::Artifact(a) => artifact_kind(a),
        WheelError::Core(h) => host_kind(h),
    }
}

fn open_kind(e: &kpack_loader::OpenError) -> Kind {
    match e {
        kpack_loader::OpenError::Io { source, .. } => io_kind(source),
        kpack_loader::OpenError::Archive { source, .. } => archive_kind(source),
    }
}

fn host_kind(e: &kpack_host::Error) -> Kind {
    use kpack_host::Error as E;
    match e {
        E::Io { source, .. } => io_kind(source),
        E::Archive { source, .. } => archive_kind(source),
        E::Bundle { .. }
        | E::Elf { .. }
        | E::Pe { .. }
        | E::Hipk { .. }
        | E::Inconsistent { .. }
        | E::Transform { .. }
        | E::PeTransform { .. } => Kind::Binary,
        E::Verify { .. } | E::SelfCheck { .. } => Kind::Verification,
        E::Load { .. } | E::Compress { .. } => Kind::Archive,
        E::Target { .. } => Kind::Usage,
        E::Request { what, .. } if what.contains("not a fat binary") => Kind::NotFat,
        E::Unsupported { .. } | E::Request { .. } => Kind::Input,
    }
}

fn artifact_kind(e: &ArtifactError) -> Kind {
    match e {
        ArtifactError::Core(h) => host_kind(h),
        ArtifactError::OutputExists { .. } => Kind::OutputExists,
        ArtifactError::ArtifactsFailed { .. }
        | ArtifactError::VerifyFailed { .. }
        | ArtifactError::ProblemsFound { .. } => Kind::Verification,
        ArtifactError::UnknownDatabase { .. }
        | ArtifactError::BadOption { .. }
        | ArtifactError::BadGpuTargets { .. }
        | ArtifactError::BadExpectTargets { .. }
        | ArtifactError::Config { .. } => Kind::Usage,
        ArtifactError::ThreadPool { .. } => Kind::Other,
        _ => Kind::Input,
    }
}

fn archive_kind(e: &ArchiveError) -> Kind {
    match e {
        ArchiveError::InvalidZstdLevel { .. } | ArchiveError::InvalidKey { .. } => Kind::Usage,
        ArchiveError::Io(source) => io_kind(source),
        ArchiveError::ReadInput { source, .. } => io_kind(source),
        _ => Kind::Archive,
    }
}

fn io_kind(e: &io::Error) -> Kind {
    match e.kind() {
        io::ErrorKind::NotFound => Kind::NotFound,
        io::ErrorKind::PermissionDenied => Kind::PermissionDenied,
        io::ErrorKind::AlreadyExists => Kind::OutputExists,
        _ => Kind::File,
    }
}
