//! `cargo xtask split|verify|recombine`: build the `kpack` command and run
//! the subcommand of the same name with the same flags (for CI jobs and
//! developers working over a build tree). Relative paths are taken from the
//! directory `cargo xtask` was started in, as `kpack` itself would.
//!
//! The command is built with the release profile (splitting tens of
//! gigabytes wants an optimized build); `KPACK_XTASK_PROFILE=dev` uses the
//! debug build instead (the tests do, to avoid a release build).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::cargo;

/// Environment variable choosing the cargo profile of the `kpack` build.
pub const PROFILE_VAR: &str = "KPACK_XTASK_PROFILE";

/// `(cargo profile, its directory under target/)`.
fn profile() -> Result<(&'static str, &'static str)> {
    match std::env::var(PROFILE_VAR).as_deref() {
        Err(_) | Ok("release") => Ok(("release", "release")),
        Ok("dev") | Ok("debug") => Ok(("dev", "debug")),
        Ok(other) => bail!("{PROFILE_VAR}={other}: use release or dev"),
    }
}

/// Build `kpack` (quietly) and return its path.
pub fn build_kpack(root: &Path) -> Result<PathBuf> {
    let (profile, dir) = profile()?;
    let sh = Shell::new()?;
    sh.change_dir(root);
    let cargo = cargo();
    cmd!(
        sh,
        "{cargo} build --quiet --profile {profile} -p kpack-cli --bin kpack"
    )
    .quiet()
    .run()
    .context("building the kpack command")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join(dir).join("kpack"))
}

/// The `kpack` command line for `subcommand` and `args`.
pub fn command_line(kpack: &Path, subcommand: &str, args: &[String]) -> Vec<String> {
    let mut v = vec![kpack.display().to_string(), subcommand.to_string()];
    v.extend(args.iter().cloned());
    v
}

/// Run `kpack <subcommand> <args>` in the current directory.
pub fn run(root: &Path, subcommand: &str, args: &[String]) -> Result<()> {
    let kpack = build_kpack(root)?;
    // A fresh shell: the caller's working directory, not the workspace root.
    let sh = Shell::new()?;
    let line = command_line(&kpack, subcommand, args);
    let (program, rest) = line.split_first().expect("not empty");
    if cmd!(sh, "{program} {rest...}").quiet().run().is_err() {
        // kpack has said what went wrong.
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_flags_verbatim() {
        let args: Vec<String> = [
            "--batch-artifact-parent-dir",
            "a b",
            "--split-databases",
            "rocblas",
            "hipblaslt",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            command_line(Path::new("/t/kpack"), "split", &args),
            [
                "/t/kpack",
                "split",
                "--batch-artifact-parent-dir",
                "a b",
                "--split-databases",
                "rocblas",
                "hipblaslt"
            ]
        );
    }
}
