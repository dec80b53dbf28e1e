//! kpack's end-to-end tests, on the compiled fixtures (`cargo xtask
//! fixtures`; `cargo xtask test` builds them and runs everything): one test
//! binary, `e2e`, with a module per area (run one area with
//! `cargo test -p kpack-e2e --test e2e -- AREA::`). What the areas share is
//! in [`common`] and, for xtask and the runtime library's tests too, in
//! `kpack-testkit`.
//!
//! One process runs every test: no test sets environment variables, the
//! current directory or other process-wide state; programs get their
//! environment on their own command line.

mod common;

// The command-line tool on the fixtures: listing, offloading, extracting.
mod archive_cli;
mod asan_wrappers;
mod bad_input;
mod bench_inputs;
mod bundle_formats;
mod golden;
mod ground_truth;
// Outputs past other readers' limits (ROCm's HRX runtime): warnings.
mod hrx_limits;
mod large_host;
mod ls;
mod malformed;
mod mixed_targets;
mod offload;
mod offload_mutations;
mod prune_restore;
mod reference_quirks;
mod size_shared;
mod stream_compressed;
mod unaligned_headers;
mod why;

// Other hosts than x86-64 Linux.
mod foreign_hosts;
mod windows;

// Large archives, through the library and the C API.
mod large_archives;
// The C and C++ APIs' size query on offloaded and split archives.
mod kernel_info;

// The artifact pipeline: split, verify, recombine, pack-tree; TheRock.
mod no_device_code;
mod pipeline;
mod pipeline_bad;
mod provenance;
mod rocfft_caches;
mod shard_agreement;
mod therock;
mod verify_tree;

// Deployments: what keeps GPU code from loading, application-local copies.
mod bundle;
mod doctor;

// Python wheels, and kpack as a pip package.
mod python_api;
mod python_package;
mod wheel_families;
mod wheel_many;
mod wheel_variants;
mod wheels;

// Crash safety, determinism, hostile paths, regressions, threads.
mod durability;
mod robustness_crash;
mod robustness_determinism;
mod robustness_paths;
mod robustness_regressions;
mod robustness_threads;

// Upstream's readers on kpack's outputs (optional: KPACK_UPSTREAM_PYTHON).
mod upstream_readers;

// The CMake package and a TheRock-shaped superbuild.
mod cmake;
mod superbuild;
