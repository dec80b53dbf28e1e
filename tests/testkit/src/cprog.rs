//! C and C++ test programs, compiled and linked through the `cc` crate (it
//! knows the compiler, its flags and the archiver; `CC`, `CXX`, `CFLAGS`...
//! are honoured as in a build script), and the one answer to "which native
//! libraries does a program linking the static runtime library need".
//!
//! (The HIP fixtures are not built here: `cc` cannot drive HIP offload
//! compilation; xtask's fixtures call clang++-19 themselves.)

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The native libraries (`-l...`) that a program linking a Rust static
/// library such as `librocm_kpack.a` needs, as `rustc --print
/// native-static-libs` gives them (asked once, by this crate's build script).
pub fn native_static_libs() -> Vec<&'static str> {
    env!("KPACK_TESTKIT_NATIVE_STATIC_LIBS")
        .split_whitespace()
        .collect()
}

/// The C runtime library in its installed form (what `cargo xtask dist`
/// installs), from the cargo build in `build_dir` (`target/debug` or
/// `target/release`, which holds `librocm_kpack.a` and
/// `rocm-kpack-prelink`): prelinked into `libdir` (headers into
/// `includedir`), so that a C program links it without the C++ runtime the
/// raw archive's cxx glue needs. Returns the archive's path.
pub fn prelinked(build_dir: &Path, libdir: &Path, includedir: &Path) -> Result<PathBuf> {
    let raw = build_dir.join("librocm_kpack.a");
    if !raw.is_file() {
        bail!("{} missing", raw.display());
    }
    let prelink = build_dir.join("rocm-kpack-prelink");
    let status = Command::new(&prelink)
        .arg(&raw)
        .arg(libdir)
        .arg(includedir)
        .status()
        .with_context(|| format!("running {}", prelink.display()))?;
    if !status.success() {
        bail!("{} failed ({status})", prelink.display());
    }
    Ok(libdir.join("librocm_kpack.a"))
}

/// A C or C++ program (or shared library, or object) to build: the `cc`
/// configuration (standard, flags, include directories, definitions) and
/// the link line's inputs, in order.
#[derive(Clone, Debug)]
pub struct Program {
    build: cc::Build,
    inputs: Vec<OsString>,
}

impl Program {
    /// A C program in the standard `std` (`c99`, `c11`), `-O1 -g`.
    pub fn c(std: &str) -> Program {
        Program::new(false, std)
    }

    /// A C++ program in the standard `std` (`c++11`, `c++17`), `-O1 -g`.
    pub fn cxx(std: &str) -> Program {
        Program::new(true, std)
    }

    fn new(cpp: bool, std: &str) -> Program {
        let mut build = cc::Build::new();
        build
            .target(env!("KPACK_TESTKIT_TARGET"))
            .host(env!("KPACK_TESTKIT_HOST"))
            .cpp(cpp)
            .std(std)
            .opt_level(1)
            .debug(true)
            .warnings(false)
            .extra_warnings(false)
            .cargo_metadata(false)
            .cargo_warnings(false)
            .emit_rerun_if_env_changed(false);
        Program {
            build,
            inputs: Vec::new(),
        }
    }

    /// `-Wall -Wextra -Werror` (the flags of every test program of the
    /// runtime library).
    pub fn strict(&mut self) -> &mut Program {
        self.build
            .warnings(true)
            .extra_warnings(true)
            .warnings_into_errors(true);
        self
    }

    /// The `cc` configuration, for include directories, definitions and
    /// flags.
    pub fn cc(&mut self) -> &mut cc::Build {
        &mut self.build
    }

    /// A source file, library or link flag, in link-line order.
    pub fn input(&mut self, input: impl AsRef<OsStr>) -> &mut Program {
        self.inputs.push(input.as_ref().to_owned());
        self
    }

    /// Link the static runtime library `lib` and the native libraries it
    /// needs.
    pub fn static_runtime(&mut self, lib: &Path) -> &mut Program {
        self.input(lib);
        for l in native_static_libs() {
            self.input(l);
        }
        self
    }

    /// The compiler command with every flag and input, writing `out`.
    pub fn command(&self, out: &Path) -> Result<Command> {
        let mut build = self.build.clone();
        // For flag probes, should cc need them.
        build.out_dir(out.parent().context("output without a directory")?);
        let tool = build
            .try_get_compiler()
            .context("no C/C++ compiler (apt-get install gcc g++)")?;
        let mut cmd = tool.to_command();
        cmd.args(&self.inputs).arg("-o").arg(out);
        Ok(cmd)
    }

    /// Compile and link into `out` (an executable, or a shared library with
    /// `-shared` among the flags).
    pub fn link(&self, out: &Path) -> Result<()> {
        run(self.command(out)?, out)
    }

    /// Compile only (`-c`) into the object `out`.
    pub fn compile(&self, out: &Path) -> Result<()> {
        let mut cmd = self.command(out)?;
        cmd.arg("-c");
        run(cmd, out)
    }
}

fn run(mut cmd: Command, out: &Path) -> Result<()> {
    let o = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !o.status.success() {
        bail!(
            "building {} failed ({}): {cmd:?}\n{}{}",
            out.display(),
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_and_runs_a_c_program() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("t.c");
        std::fs::write(
            &src,
            "#include <stdio.h>\nint main(void) { printf(\"%d\", TESTKIT_VALUE); return 0; }\n",
        )
        .unwrap();
        let exe = dir.path().join("t");
        let mut p = Program::c("c11");
        p.strict().cc().define("TESTKIT_VALUE", "42");
        p.input(&src).link(&exe).unwrap();
        let out = Command::new(&exe).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "42");
        // A warning is an error.
        std::fs::write(&src, "int main(void) { int unused; return 0; }\n").unwrap();
        assert!(p.link(&exe).is_err());
    }

    #[test]
    fn native_libs_come_from_rustc() {
        let libs = native_static_libs();
        assert!(libs.iter().all(|l| l.starts_with("-l")), "{libs:?}");
        assert!(libs.contains(&"-lc"), "{libs:?}");
    }
}
