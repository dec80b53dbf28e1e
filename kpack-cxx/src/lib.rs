//! kpack runtime library (C API and C++ bindings). Filled in by the runtime issue.
