//! The `kpack split-wheels` command the wheel-shaped sections measure.

use std::ffi::OsString;
use std::path::Path;

use crate::args;

/// Which device wheels a wheel splits into.
pub struct WheelShape<'a> {
    pub device_package_prefix: &'a str,
    pub overlay_root: &'a str,
    /// `--wheel-type`, when the wheel needs one.
    pub wheel_type: Option<&'a str>,
}

/// A torch wheel (the test kit's and PyTorch's).
pub const TORCH: &WheelShape<'static> = &WheelShape {
    device_package_prefix: "amd-torch-device",
    overlay_root: "torch/",
    wheel_type: Some("torch-fat"),
};

/// `kpack split-wheels` of `wheel` into `out` with two jobs, scratch space
/// in `scratch`, a JSON summary.
pub fn split_wheels_args(
    wheel: &Path,
    out: &Path,
    scratch: &Path,
    shape: &WheelShape,
) -> Vec<OsString> {
    let mut a = args![
        "split-wheels",
        "--input",
        wheel,
        "--output-dir",
        out,
        "--device-package-prefix",
        shape.device_package_prefix,
        "--overlay-root",
        shape.overlay_root,
        "-j",
        "2",
        "--tmp-dir",
        scratch,
        "--json"
    ]
    .to_vec();
    if let Some(t) = shape.wheel_type {
        a.extend(args!["--wheel-type", t]);
    }
    a
}
