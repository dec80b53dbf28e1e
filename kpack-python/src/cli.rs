//! The `kpack` command, in-process ([`kpack_cli`]).

use std::ffi::OsString;

use pyo3::prelude::*;

use crate::errors::Failure;

/// Run `kpack` with `argv` (program name first); a failure is reported as
/// `<error_prefix><message>` on stderr. Returns the exit status. The GIL is
/// released while it runs.
#[pyfunction]
#[pyo3(signature = (argv, error_prefix="kpack: error: "))]
pub fn cli_main(py: Python<'_>, argv: Vec<OsString>, error_prefix: &str) -> u8 {
    py.detach(|| kpack_cli::main_with_args(argv, error_prefix))
}

/// Run one command (`args` without the program name) with its `--json`
/// summary captured: returns `(summary as JSON text or None, exception
/// instance or None)`. `--help` and `--version` print as the command does
/// and return `(None, None)`.
#[pyfunction]
pub fn run_captured(
    py: Python<'_>,
    args: Vec<OsString>,
) -> PyResult<(Option<String>, Option<Py<PyAny>>)> {
    let (json, failure) = py.detach(|| {
        let c = kpack_cli::run_captured(args);
        let json = c.json.map(|v| v.to_string());
        let failure = match c.result {
            Ok(()) => None,
            Err(e) => match e.downcast_ref::<clap::Error>() {
                Some(c) if c.exit_code() == 0 => {
                    let _ = c.print();
                    None
                }
                _ => Some(Failure::of(e.as_ref())),
            },
        };
        (json, failure)
    });
    let error = failure.map(|f| f.instance(py)).transpose()?;
    Ok((json, error))
}
