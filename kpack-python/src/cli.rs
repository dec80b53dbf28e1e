//! The `kpack` command line, in-process ([`kpack_cli`]): the console script
//! (`kpack`, `python -m kpack`), `kpack.run` and the `rocm_kpack` tools.
//! kpack's typed Python API does not come through here ([`crate::ops`]).

use std::ffi::OsString;

use kpack_cli::CommandError;
use pyo3::prelude::*;

use crate::errors::{Failure, Kind};

/// Run `kpack` with `argv` (program name first); a failure is reported as
/// `<error_prefix><message>` on stderr. Returns the exit status. The GIL is
/// released while it runs.
#[pyfunction]
#[pyo3(signature = (argv, error_prefix="kpack: error: "))]
pub fn cli_main(py: Python<'_>, argv: Vec<OsString>, error_prefix: &str) -> u8 {
    py.detach(|| kpack_cli::main_with_args(argv, error_prefix))
}

/// Run one command line (`args` without the program name) with its
/// `--json` summary captured: returns `(summary as JSON text or None,
/// exception instance or None)`; a usage error is a `UsageError` with the
/// usage message. `--help` and `--version` print as the command does and
/// return `(None, None)`.
#[pyfunction]
pub fn run_captured(
    py: Python<'_>,
    args: Vec<OsString>,
) -> PyResult<(Option<String>, Option<Py<PyAny>>)> {
    let (json, failure) = py.detach(|| {
        let c = kpack_cli::run_captured(args);
        let failure = match c.result {
            Ok(()) => None,
            Err(CommandError::Usage(message)) => Some(Failure::new(Kind::Usage, message)),
            Err(CommandError::Failed(e)) => Some(Failure::of(e.as_ref())),
        };
        (c.json.map(|v| v.to_string()), failure)
    });
    let error = failure.map(|f| f.instance(py)).transpose()?;
    Ok((json, error))
}
