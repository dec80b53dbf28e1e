//! Prelinking `librocm_kpack.a` for installation.
//!
//! A Rust static library holds the objects of the Rust standard library,
//! of every dependency and of zstd, all with default visibility: a shared
//! library that links it (the HIP runtime's `libamdhip64.so`) would export
//! all of them, and could clash with another copy of Rust or zstd in the
//! process. The installed archive is therefore prelinked:
//!
//! 1. `ld -r --gc-sections -u kpack_open ... -u kpack_enumerate_architectures
//!    -u <bridge symbols> kpack_cxx_stubs.o lib.a`: one relocatable object
//!    with just the members and sections the C API and the C++ glue reach
//!    (GNU ld). cxx's C++ runtime, which the `cxx` crate bundles, must stay
//!    out (the C++ glue archive carries its own, and C programs need no
//!    C++ runtime): the stand-ins of build.rs come first and satisfy the
//!    references to it, and none may survive the garbage collection (that
//!    would be Rust code calling C++);
//! 2. `objcopy --keep-global-symbols=<the 15 kpack_* names and the bridge
//!    symbols> --strip-unneeded --remove-section=.llvmbc
//!    --remove-section=.llvmcmd`: every other defined symbol becomes local;
//!    debug info, symbols no relocation needs and embedded LLVM bitcode go;
//! 3. the object must reference nothing of the C++ runtime;
//! 4. `ar rcs out.a object.o`.
//!
//! The bridge symbols (`cxxbridge1$...`: the Rust functions the C++ glue
//! `librocm_kpack_cxx.a` calls, listed by build.rs) stay global for the
//! glue but have hidden visibility (lib.rs), so a shared library linking
//! the archive exports only the `kpack_*` functions, from C or C++.
//!
//! Link it as the plain one: `-lrocm_kpack -lgcc_s -lpthread -ldl -lm`
//! (glibc ≥ 2.34 needs only `-lgcc_s`, for unwinding); C++ programs put
//! `-lrocm_kpack_cxx` first.
//!
//! This module uses only `std`. Its one caller is the `rocm-kpack-prelink`
//! binary of this crate (`src/bin/rocm-kpack-prelink.rs`, `STATICLIB LIBDIR
//! INCLUDEDIR`): `cargo xtask dist` (`xtask/src/dist.rs`, `prelinked`) and
//! the CMake build run that binary after cargo has built it; xtask does not
//! compile this file itself.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The symbols the library exports: the C API. (The C++ API adds none: its
/// glue and the Rust functions it calls have hidden visibility.)
pub const EXPORTED_SYMBOLS: [&str; 15] = [
    "kpack_open",
    "kpack_close",
    "kpack_get_architecture_count",
    "kpack_get_architecture",
    "kpack_get_binary_count",
    "kpack_get_binary",
    "kpack_get_kernel",
    "kpack_get_kernel_info",
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

/// Undefined symbols that would make the C library need the C++ runtime.
const CXX_RUNTIME_REFERENCES: [&str; 5] = ["_ZNSt", "_ZSt", "_ZN4rust", "__cxa_", "__gxx_"];

/// The binutils programs [`prelink`] runs.
#[derive(Debug, Clone)]
pub struct Tools {
    pub ld: PathBuf,
    pub objcopy: PathBuf,
    pub ar: PathBuf,
    pub nm: PathBuf,
    pub readelf: PathBuf,
}

impl Default for Tools {
    /// `ld`, `objcopy`, `ar`, `nm` and `readelf` from `PATH`, or as named
    /// by the `LD`, `OBJCOPY`, `AR`, `NM` and `READELF` environment
    /// variables.
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
            nm: tool("NM", "nm"),
            readelf: tool("READELF", "readelf"),
        }
    }
}

/// What build.rs left for the prelink step in its `OUT_DIR`.
#[derive(Debug, Clone)]
pub struct Bridge {
    /// The Rust functions the C++ glue calls (kept global, hidden).
    pub symbols: Vec<String>,
    /// The stand-ins for cxx's C++ runtime (`kpack_cxx_stubs.o`), if the
    /// target needs them.
    pub stubs: Option<PathBuf>,
}

impl Bridge {
    /// The bridge of the build whose `OUT_DIR` is `out_dir`.
    pub fn from_out_dir(out_dir: &Path) -> io::Result<Bridge> {
        let list = out_dir.join("bridge_symbols.txt");
        let text = std::fs::read_to_string(&list)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", list.display())))?;
        let stubs = out_dir.join("kpack_cxx_stubs.o");
        Ok(Bridge {
            symbols: text.lines().map(str::to_owned).collect(),
            stubs: stubs.is_file().then_some(stubs),
        })
    }
}

/// Prelink the static library `staticlib` (cargo's `librocm_kpack.a`)
/// into `out`, keeping the C API and the `bridge` symbols global, with the
/// tools of [`Tools::default`]. `out` is written through a temporary file
/// in its directory and renamed into place (left alone when its bytes
/// would not change).
pub fn prelink(staticlib: &Path, bridge: &Bridge, out: &Path) -> io::Result<()> {
    prelink_with(&Tools::default(), staticlib, bridge, out)
}

/// [`prelink`] with explicit tools.
pub fn prelink_with(
    tools: &Tools,
    staticlib: &Path,
    bridge: &Bridge,
    out: &Path,
) -> io::Result<()> {
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
    let result = prelink_in(tools, staticlib, bridge, out, &work, &name);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn prelink_in(
    tools: &Tools,
    staticlib: &Path,
    bridge: &Bridge,
    out: &Path,
    work: &Path,
    name: &str,
) -> io::Result<()> {
    let bridge_symbols = &bridge.symbols;
    let combined = work.join("combined.o");
    let mut ld = Command::new(&tools.ld);
    // --gc-sections with -r keeps what the -u roots reach (GNU ld; lld
    // refuses the combination).
    ld.args(["-r", "--gc-sections", "-o"]).arg(&combined);
    let roots = EXPORTED_SYMBOLS.iter().chain(&EXTRA_ROOTS).copied();
    for sym in roots.chain(bridge_symbols.iter().map(String::as_str)) {
        ld.arg("-u").arg(sym);
    }
    ld.args(&bridge.stubs).arg(staticlib);
    run(&mut ld)?;
    let survivors = stub_sections_of(tools, &combined)?;
    if !survivors.is_empty() {
        return Err(io::Error::other(format!(
            "Rust code the C API or the bridge reaches calls cxx's C++ runtime \
             (stand-ins {} of kpack_cxx_stubs.o survive)",
            survivors.join(", ")
        )));
    }

    let keep = work.join("keep.txt");
    let mut kept: Vec<&str> = EXPORTED_SYMBOLS.to_vec();
    kept.extend(bridge_symbols.iter().map(String::as_str));
    std::fs::write(&keep, kept.join("\n") + "\n")?;
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

    check_no_cxx_runtime(tools, &object)?;

    let archive = work.join(name);
    run(Command::new(&tools.ar)
        .arg("rcsD")
        .arg(&archive)
        .arg(&object))?;
    replace_if_changed(&archive, out)
}

/// Rename `new` over `out`, unless `out` already has the same bytes (then
/// `out` keeps its modification time, so build systems relink nothing).
pub fn replace_if_changed(new: &Path, out: &Path) -> io::Result<()> {
    if std::fs::read(out).ok() == Some(std::fs::read(new)?) {
        return std::fs::remove_file(new);
    }
    std::fs::rename(new, out)
}

/// The stand-in sections still in `object` (readelf, which unlike nm
/// reads objects with embedded bitcode).
fn stub_sections_of(tools: &Tools, object: &Path) -> io::Result<Vec<String>> {
    let out = output(Command::new(&tools.readelf).arg("-SW").arg(object))?;
    Ok(out
        .split_whitespace()
        .filter(|w| w.starts_with(".text.kpack_cxx_stub."))
        .map(str::to_owned)
        .collect())
}

/// Fail if `object` references the C++ runtime (strongly: glibc's
/// `__cxa_thread_atexit_impl` is a weak reference of Rust's).
fn check_no_cxx_runtime(tools: &Tools, object: &Path) -> io::Result<()> {
    let out = output(Command::new(&tools.nm).arg("-u").arg(object))?;
    let cxx: Vec<&str> = out
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            ["U", name] => Some(name),
            _ => None,
        })
        .filter(|s| CXX_RUNTIME_REFERENCES.iter().any(|p| s.starts_with(p)))
        .collect();
    if cxx.is_empty() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "the prelinked object would need the C++ runtime: {}",
            cxx.join(", ")
        )))
    }
}

fn run(cmd: &mut Command) -> io::Result<()> {
    output(cmd).map(drop)
}

/// Run `cmd`: its standard output, or an error with its standard error.
fn output(cmd: &mut Command) -> io::Result<String> {
    let output = cmd.output().map_err(|e| {
        io::Error::new(e.kind(), format!("cannot run {:?}: {e}", cmd.get_program()))
    })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(io::Error::other(format!(
            "{:?} failed ({}): {}",
            cmd,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}
