//! Load latency of the C API (ignored by default; run in release):
//!
//! ```text
//! cargo test --release -p kpack-cxx --test bench -- --ignored --nocapture
//! ```
//!
//! The code object is `KPACK_BENCH_CODE_OBJECT` (e.g. one extracted from a
//! ROCm library with `kpack extract`), else 1.7 MB of librocrand, else of
//! this test executable; it is stored zstd-compressed (level 3) and
//! uncompressed, and loaded for the agent `gfx90a:xnack-`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use kpack_core::archive::{ArchiveWriter, Scheme};

const SIZE: usize = 1_716_776;

fn code_object() -> Vec<u8> {
    if let Some(p) = std::env::var_os("KPACK_BENCH_CODE_OBJECT") {
        return std::fs::read(p).expect("KPACK_BENCH_CODE_OBJECT");
    }
    let source = [
        PathBuf::from("/usr/lib/x86_64-linux-gnu/librocrand.so.1.1"),
        std::env::current_exe().unwrap(),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap();
    let bytes = std::fs::read(source).unwrap();
    let start = bytes.len().saturating_sub(SIZE) / 2;
    bytes[start..(start + SIZE).min(bytes.len())].to_vec()
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture, in release"]
fn load_latency() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_dir("bench").join("bench");
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-O2", "-I"])
        .arg(include_dir())
        .arg(crate_dir().join("tests/c/bench.c"))
        .arg(staticlib())
        .args(NATIVE_LIBS)
        .arg("-o")
        .arg(&exe);
    run_ok(&mut cc);
    let co = code_object();
    for scheme in [Scheme::ZstdPerKernel, Scheme::None] {
        let archive = dir.path().join(format!("lib_gfx90a:xnack-.{scheme}.kpack"));
        let mut w =
            ArchiveWriter::new("lib", "gfx90a:xnack-", vec!["gfx90a:xnack-".into()]).scheme(scheme);
        w.add("lib/libx.so#0", "gfx90a:xnack-", co.as_slice(), None)
            .unwrap();
        let summary = w.write(&archive).unwrap();
        let meta = dir.path().join("meta");
        write_metadata(&meta, "lib/libx.so", &[archive.to_str().unwrap()]);
        let out = run_ok(
            Command::new(&exe)
                .arg(&archive)
                .arg(&meta)
                .arg(dir.path().join("libx.so"))
                .arg("amdgcn-amd-amdhsa--gfx90a:xnack-")
                .arg("lib/libx.so#0")
                .arg("200"),
        );
        println!(
            "{scheme}: code object {} bytes, archive {} bytes\n{}",
            co.len(),
            summary.bytes_out,
            stdout(&out)
        );
        assert!(stdout(&out).contains("warm load"));
    }
}
