//! `rocm-kpack-prelink IN.a OUT.a`: prelink cargo's `librocm_kpack.a` into
//! the archive that is installed (see `kpack_cxx`'s `prelink` module).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [input, output] = args.as_slice() else {
        eprintln!("usage: rocm-kpack-prelink IN.a OUT.a");
        return ExitCode::from(2);
    };
    match rocm_kpack::prelink::prelink(input, output) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rocm-kpack-prelink: {e}");
            ExitCode::FAILURE
        }
    }
}
