//! `rocm-kpack-prelink STATICLIB LIBDIR INCLUDEDIR`: install the runtime
//! library from cargo's `librocm_kpack.a` (STATICLIB):
//!
//! - `LIBDIR/librocm_kpack.a`: prelinked (see `kpack_cxx`'s `prelink`
//!   module): only the C API is exported, no C++ runtime needed;
//! - `LIBDIR/librocm_kpack_cxx.a`: the C++ API's glue, built by this
//!   build's build.rs (cxx-build);
//! - `INCLUDEDIR/rocm_kpack/`: `kpack.h`, `kpack_types.h`,
//!   `kpack_export.h`, `kpack.hpp` and the bridge header cxx generated,
//!   `kpack_bridge.h`; `INCLUDEDIR/rust/cxx.h`.
//!
//! `cargo xtask dist` and the CMake build (both paths) run it, so the
//! installed and the from-source layouts are the same.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The build script's output directory of this build (build.rs).
const OUT_DIR: &str = env!("KPACK_CXX_OUT_DIR");

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [staticlib, libdir, includedir] = args.as_slice() else {
        eprintln!("usage: rocm-kpack-prelink STATICLIB LIBDIR INCLUDEDIR");
        return ExitCode::from(2);
    };
    match install(staticlib, libdir, includedir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rocm-kpack-prelink: {e}");
            ExitCode::FAILURE
        }
    }
}

fn install(staticlib: &Path, libdir: &Path, includedir: &Path) -> std::io::Result<()> {
    let out_dir = Path::new(OUT_DIR);
    let headers = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/rocm_kpack");
    let generated = out_dir.join("cxxbridge/include");
    let rocm_kpack = includedir.join("rocm_kpack");
    for d in [libdir, &rocm_kpack, &includedir.join("rust")] {
        std::fs::create_dir_all(d)?;
    }
    let bridge = rocm_kpack::prelink::Bridge::from_out_dir(out_dir)?;
    rocm_kpack::prelink::prelink(staticlib, &bridge, &libdir.join("librocm_kpack.a"))?;
    let mut copies = vec![
        (
            out_dir.join("librocm_kpack_cxx.a"),
            libdir.join("librocm_kpack_cxx.a"),
        ),
        (
            generated.join("kpack-cxx/src/bridge.rs.h"),
            rocm_kpack.join("kpack_bridge.h"),
        ),
        (generated.join("rust/cxx.h"), includedir.join("rust/cxx.h")),
    ];
    for name in ["kpack.h", "kpack_types.h", "kpack_export.h", "kpack.hpp"] {
        copies.push((headers.join(name), rocm_kpack.join(name)));
    }
    for (from, to) in copies {
        copy(&from, &to)?;
    }
    Ok(())
}

/// Copy through a temporary file renamed into place (a file that would
/// not change is left alone, so build systems rebuild nothing).
fn copy(from: &Path, to: &Path) -> std::io::Result<()> {
    let name = to.file_name().unwrap_or_default().to_string_lossy();
    let tmp = to.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::copy(from, &tmp)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", from.display())))?;
    rocm_kpack::prelink::replace_if_changed(&tmp, to)
}
