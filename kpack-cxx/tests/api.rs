//! The runtime library's C and C++ APIs as their users see them: one test
//! binary, `api`, with a module per area (run one with
//! `cargo test -p kpack-cxx --test api -- AREA::`). C and C++ programs are
//! compiled from `tests/c/` and `tests/cxx/` against the library as built
//! and as installed; what the areas share is in [`common`].

mod common;

// The C API: through the rlib, then through a C11 program.
mod api_regressions;
mod c_api;
// Who owns the code objects handed out: zero-copy mappings, recycled buffers.
mod zero_copy;
// The C++ API, through a C++17 program.
mod cxx_api;
mod cxx_view;
// The headers, and what the built libraries export.
mod headers;
mod symbols;
