//! Prelinking `librocm_kpack.a` for installation.
//!
//! A Rust static library holds the objects of the Rust standard library,
//! of every dependency and of zstd, all with default visibility: a shared
//! library that links it (the HIP runtime's `libamdhip64.so`) would export
//! all of them, and could clash with another copy of Rust or zstd in the
//! process. The installed archive is therefore prelinked:
//!
//! 1. `ld -r --gc-sections -u kpack_open ... -u kpack_enumerate_architectures
//!    lib.a`: one relocatable object with just the members and sections the
//!    API reaches (GNU ld);
//! 2. `objcopy --keep-global-symbols=<the 14 kpack_* names>
//!    --strip-unneeded --remove-section=.llvmbc --remove-section=.llvmcmd`:
//!    every other defined symbol becomes local; debug info, symbols no
//!    relocation needs and embedded LLVM bitcode go;
//! 3. `ar rcs out.a object.o`.
//!
//! Link it as the plain one: `-lrocm_kpack -lgcc_s -lpthread -ldl -lm`
//! (glibc ≥ 2.34 needs only `-lgcc_s`, for unwinding).
//!
//! This file uses only `std`, so that `xtask` can include it directly
//! (`#[path = "../../kpack-cxx/src/prelink.rs"] mod prelink;`) without
//! depending on the library; `cargo run -p kpack-cxx --bin
//! rocm-kpack-prelink -- IN.a OUT.a` runs it from the command line.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The symbols the library exports: the C API. (The C++ API is
/// header-only and adds none.)
pub const EXPORTED_SYMBOLS: [&str; 14] = [
    "kpack_open",
    "kpack_close",
    "kpack_get_architecture_count",
    "kpack_get_architecture",
    "kpack_get_binary_count",
    "kpack_get_binary",
    "kpack_get_kernel",
    "kpack_free_kernel",
    "kpack_cache_create",
    "kpack_cache_destroy",
    "kpack_discover_binary_path",
    "kpack_load_code_object",
    "kpack_free_code_object",
    "kpack_enumerate_architectures",
];

/// Symbols pulled in besides the exports: the library's own definitions of
/// zstd's weak tracing hooks (a weak reference does not pull an archive
/// member by itself). Made local like everything else.
pub const EXTRA_ROOTS: [&str; 2] = ["ZSTD_trace_decompress_begin", "ZSTD_trace_decompress_end"];

/// The binutils programs [`prelink`] runs.
#[derive(Debug, Clone)]
pub struct Tools {
    pub ld: PathBuf,
    pub objcopy: PathBuf,
    pub ar: PathBuf,
}

impl Default for Tools {
    /// `ld`, `objcopy` and `ar` from `PATH`, or as named by the `LD`,
    /// `OBJCOPY` and `AR` environment variables.
    fn default() -> Tools {
        let tool = |var: &str, name: &str| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(name), PathBuf::from)
        };
        Tools {
            ld: tool("LD", "ld"),
            objcopy: tool("OBJCOPY", "objcopy"),
            ar: tool("AR", "ar"),
        }
    }
}

/// Prelink the static library `staticlib` (cargo's `librocm_kpack.a`)
/// into `out`, with the tools of [`Tools::default`]. `out` is written
/// through a temporary file in its directory and renamed into place.
pub fn prelink(staticlib: &Path, out: &Path) -> io::Result<()> {
    prelink_with(&Tools::default(), staticlib, out)
}

/// [`prelink`] with explicit tools.
pub fn prelink_with(tools: &Tools, staticlib: &Path, out: &Path) -> io::Result<()> {
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let name = out
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "output has no file name"))?
        .to_string_lossy()
        .into_owned();
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let work = dir.join(format!(".{name}.prelink.{}.{n}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let result = prelink_in(tools, staticlib, out, &work, &name);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn prelink_in(
    tools: &Tools,
    staticlib: &Path,
    out: &Path,
    work: &Path,
    name: &str,
) -> io::Result<()> {
    let combined = work.join("combined.o");
    let mut ld = Command::new(&tools.ld);
    // --gc-sections with -r keeps what the -u roots reach (GNU ld; lld
    // refuses the combination).
    ld.args(["-r", "--gc-sections", "-o"]).arg(&combined);
    for sym in EXPORTED_SYMBOLS.iter().chain(&EXTRA_ROOTS) {
        ld.arg("-u").arg(sym);
    }
    ld.arg(staticlib);
    run(&mut ld)?;

    let keep = work.join("keep.txt");
    std::fs::write(&keep, EXPORTED_SYMBOLS.join("\n") + "\n")?;
    let object = work.join("rocm_kpack.o");
    run(Command::new(&tools.objcopy)
        // Debug info and every symbol no relocation needs.
        .arg("--strip-unneeded")
        // LLVM bitcode embedded by rustc (the standard library ships with
        // it): dead weight, and it makes `ar`'s LTO plugin choke.
        .arg("--remove-section=.llvmbc")
        .arg("--remove-section=.llvmcmd")
        .arg(format!("--keep-global-symbols={}", keep.display()))
        .arg(&combined)
        .arg(&object))?;

    let archive = work.join(name);
    run(Command::new(&tools.ar)
        .arg("rcsD")
        .arg(&archive)
        .arg(&object))?;
    std::fs::rename(&archive, out)
}

fn run(cmd: &mut Command) -> io::Result<()> {
    let output = cmd.output().map_err(|e| {
        io::Error::new(e.kind(), format!("cannot run {:?}: {e}", cmd.get_program()))
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{:?} failed ({}): {}",
            cmd,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}
