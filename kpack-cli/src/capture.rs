//! Standard output and `--json` summaries: printed, or captured for
//! [`crate::run_captured`].

thread_local! {
    /// `Some` while [`run_captured`] runs on this thread: the summary
    /// [`print_json`] was given, if any.
    pub(crate) static CAPTURE: std::cell::RefCell<Option<Option<serde_json::Value>>> =
        const { std::cell::RefCell::new(None) };
}

pub(crate) fn flush_stdout() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

/// One line to standard output ([`outln!`]).
pub(crate) fn write_stdout_line(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("kpack: error: writing to standard output: {e}");
        std::process::exit(1);
    }
}

/// A `--json` summary: printed, or kept for [`run_captured`].
pub(crate) fn print_json(v: &impl serde::Serialize) {
    let captured = CAPTURE.with(|c| match c.borrow_mut().as_mut() {
        Some(slot) => {
            *slot = Some(serde_json::to_value(v).expect("output serializes"));
            true
        }
        None => false,
    });
    if !captured {
        outln!(
            "{}",
            serde_json::to_string_pretty(v).expect("output serializes")
        );
    }
}
