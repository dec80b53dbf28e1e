//! `kpack`: the command-line face of the library crates (kpack-format,
//! kpack-loader, kpack-host, kpack-engine). Flags become calls, results
//! become text, JSON or SVG; all the work happens in those crates.
//!
//! A library as well as the `kpack` binary: [`main_with_args`] is the
//! whole command (the binary's `main`, and the `kpack` console script of
//! the Python package, which runs it in-process), and [`run_captured`]
//! runs one command line and hands back its `--json` summary and its error
//! instead of printing them (`kpack.run` and the `rocm_kpack` tools; the
//! typed Python API calls the engine itself).

#![forbid(unsafe_code)]

/// `println!` that ends the process quietly when standard output is a
/// closed pipe (`kpack ls big.so | head`), as a program killed by SIGPIPE
/// would (status 141), and reports any other write error.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::capture::write_stdout_line(format_args!($($arg)*))
    };
}

mod artifacts;
mod bundle;
mod capture;
mod cli;
mod commands;
mod doctor;
mod print;
mod svg;
mod wheels;

use clap::Parser;
use kpack_host::output::{self, Durability};

use capture::{flush_stdout, CAPTURE};
use cli::{Cli, Command};

/// Run `kpack` with `args` (the first is the program name, as from
/// [`std::env::args_os`]): parse them (usage errors and `--help` as clap
/// prints them), run the command, and report a failure on stderr as
/// `<error_prefix><message>`. Returns the exit status: 0, 1 for a failure
/// (2 when `doctor` could check nothing), clap's status for a usage error
/// (2).
pub fn main_with_args<I, T>(args: I, error_prefix: &str) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are "errors" that print to stdout, status 0.
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    let status = match dispatch(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{error_prefix}{}", kpack_host::report(e.as_ref()));
            exit_status(e.as_ref())
        }
    };
    flush_stdout();
    status
}

/// The exit status of a failed command: 2 when `doctor` could check
/// nothing, else 1.
fn exit_status(e: &(dyn std::error::Error + 'static)) -> u8 {
    match e.downcast_ref::<kpack_engine::ArtifactError>() {
        Some(kpack_engine::ArtifactError::NothingToCheck { .. }) => 2,
        _ => 1,
    }
}

/// What [`run_captured`] gives back.
pub struct Captured {
    /// The summary the command prints with `--json` (when it got that far:
    /// a batch split with failures has one and an error).
    pub json: Option<serde_json::Value>,
    pub result: Result<(), CommandError>,
}

/// Why a captured command failed.
#[derive(Debug)]
pub enum CommandError {
    /// The arguments do not parse: the usage message, as the command
    /// prints it.
    Usage(String),
    /// The command ran and failed: the value whose
    /// [`kpack_host::report`] the command line prints after
    /// `kpack: error: ` (an error of kpack's crates).
    Failed(Box<dyn std::error::Error>),
}

/// Run one command (`args` without the program name; add `--json` for a
/// summary) on this thread with its `--json` output captured instead of
/// printed. Text output and notes still go to stdout and stderr, and so do
/// `--help` and `--version` (a success).
pub fn run_captured<I, T>(args: I) -> Captured
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv =
        std::iter::once(std::ffi::OsString::from("kpack")).chain(args.into_iter().map(Into::into));
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) if e.exit_code() == 0 => {
            let _ = e.print();
            flush_stdout();
            return Captured {
                json: None,
                result: Ok(()),
            };
        }
        Err(e) => {
            return Captured {
                json: None,
                result: Err(CommandError::Usage(
                    e.render().to_string().trim_end().into(),
                )),
            }
        }
    };
    CAPTURE.with(|c| *c.borrow_mut() = Some(None));
    let result = dispatch(cli).map_err(CommandError::Failed);
    let json = CAPTURE.with(|c| c.borrow_mut().take()).flatten();
    flush_stdout();
    Captured { json, result }
}

/// Run the command; with `--durable` (or `KPACK_DURABLE=1`), the outputs
/// it wrote are fsynced at the end, all at once (those of a batch that
/// failed part-way too).
fn dispatch(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let durable = Durability::begin(cli.durable || output::durable_from_env());
    let result = match cli.command {
        Command::Artifact(c) => artifacts::run(c),
        Command::SplitWheels(a) => wheels::split_wheels(*a),
        Command::Doctor(a) => doctor::run(a),
        Command::Bundle(a) => bundle::run(a),
        command => commands::run(command).map_err(Into::into),
    };
    let synced = durable.commit();
    result?;
    synced?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{ArgAction, CommandFactory};

    /// Every subcommand, nested ones too, with its argv prefix.
    fn commands(
        c: &clap::Command,
        prefix: Vec<String>,
        out: &mut Vec<(Vec<String>, clap::Command)>,
    ) {
        for sub in c.get_subcommands() {
            let mut p = prefix.clone();
            p.push(sub.get_name().to_string());
            out.push((p.clone(), sub.clone()));
            commands(sub, p, out);
        }
    }

    /// No flag of any command drops a value given twice: a flag that
    /// takes one value (or none) is refused the second time, and a list
    /// flag appends (clap's default for a single-valued flag given twice
    /// is an error, unless `args_override_self` makes the last use win
    /// silently).
    #[test]
    fn no_flag_drops_a_repeated_value() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        let mut all = Vec::new();
        commands(&cli, vec!["kpack".to_string()], &mut all);
        let mut checked = 0;
        for (argv, cmd) in &all {
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                let action = arg.get_action();
                match action {
                    ArgAction::Help | ArgAction::Version => continue,
                    ArgAction::Append => continue,
                    ArgAction::Set | ArgAction::SetTrue | ArgAction::SetFalse => {}
                    other => panic!("{argv:?} --{long}: action {other:?}"),
                }
                let value = arg
                    .get_possible_values()
                    .first()
                    .map(|v| v.get_name().to_string())
                    .unwrap_or_else(|| "3".to_string());
                let mut v = argv.clone();
                for _ in 0..2 {
                    v.push(format!("--{long}"));
                    if action.takes_values() {
                        v.push(value.clone());
                    }
                }
                let err = match Cli::try_parse_from(&v) {
                    Ok(_) => panic!("{v:?}: accepted"),
                    Err(e) => e.to_string(),
                };
                assert!(
                    err.contains("cannot be used multiple times"),
                    "{v:?}: {err}"
                );
                checked += 1;
            }
        }
        assert!(checked > 50, "{checked} flags checked");
    }

    /// List flags keep every use's values.
    #[test]
    fn repeated_inputs_are_all_kept() {
        let Cli {
            command: Command::SplitWheels(a),
            ..
        } = Cli::try_parse_from([
            "kpack",
            "split-wheels",
            "--input",
            "a.whl",
            "--input",
            "dir",
            "--output-dir",
            "o",
            "--device-package-prefix",
            "p",
            "--overlay-root",
            "t/",
            "--device-requires-dist",
            "x",
            "--device-requires-dist",
            "y",
            "z",
        ])
        .unwrap()
        else {
            panic!("not split-wheels")
        };
        assert_eq!(a.inputs().len(), 2);
        assert_eq!(a.device_requires_dist(), ["x", "y", "z"]);
    }
}
