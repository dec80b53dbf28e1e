//! Was a code object index built for a device? The one answer `why`,
//! `verify`, `verify --tree` and `doctor` give, from what an offloaded
//! binary's HIPK metadata records (formats.md §4.2): the targets its code
//! objects were split for (`kpack_targets`) and, when its bundles did not
//! all hold the same ones, each code object index's (`kpack_co_targets`).
//! A code object index whose bundle was built without any target the device
//! takes has no code for it in the original fat binary either: nothing to
//! install, no archive missing.

use serde::Serialize;

use crate::hipk::HipkMetadata;
use crate::target::TargetId;

/// What the metadata says of one code object index and a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BuiltFor {
    /// The binary records no targets (the reference's, an older kpack's):
    /// only the archives can tell.
    Unknown,
    /// Its bundle holds a target the device takes.
    Yes,
    /// No bundle of the binary holds a target the device takes.
    NotInBinary,
    /// Other bundles do, but this code object index's was built without
    /// any (`kpack_co_targets`).
    NotInBundle,
}

/// Was code object `co` of the binary with `metadata` built for a device
/// whose ISA names (in the runtime's order, `amdgcn-amd-amdhsa--` prefix
/// or not) are `archs`?
pub fn built_for<S: AsRef<str>>(metadata: &HipkMetadata, co: u64, archs: &[S]) -> BuiltFor {
    let Some(all) = &metadata.targets else {
        return BuiltFor::Unknown;
    };
    if !any_taken(all, archs) {
        return BuiltFor::NotInBinary;
    }
    match metadata.co_index_targets(co) {
        Some(own) if !any_taken(&own, archs) => BuiltFor::NotInBundle,
        _ => BuiltFor::Yes,
    }
}

/// Would a device with these ISAs load code built for one of `targets`?
pub fn any_taken<T: AsRef<str>, S: AsRef<str>>(targets: &[T], archs: &[S]) -> bool {
    let accepted: Vec<TargetId> = archs
        .iter()
        .filter_map(|a| TargetId::parse(a.as_ref()).ok())
        .flat_map(|a| a.compatible_targets())
        .collect();
    targets
        .iter()
        .any(|t| TargetId::parse(t.as_ref()).is_ok_and(|t| accepted.contains(&t)))
}

/// The note for a code object index built without the device's targets
/// (`device`: how the device is named).
pub fn built_without_note(co: u64, device: &str) -> String {
    let device = device
        .strip_prefix(crate::target::AGENT_ISA_PREFIX)
        .unwrap_or(device);
    format!("bundle #{co} was built without {device} in the original fat binary: no code for it to load (as with the fat binary)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_per_code_object_index() {
        let bundles: Vec<(u64, Vec<String>)> = vec![
            (0, vec!["gfx1100".into(), "gfx90a:xnack-".into()]),
            (1, vec!["gfx1100".into()]),
        ];
        let m = HipkMetadata::new("k", vec!["p".into()]).with_bundle_targets(&bundles);
        let gfx90a = ["amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-", "gfx90a"];
        assert_eq!(built_for(&m, 0, &gfx90a), BuiltFor::Yes);
        assert_eq!(built_for(&m, 1, &gfx90a), BuiltFor::NotInBundle);
        assert_eq!(built_for(&m, 1, &["gfx1100"]), BuiltFor::Yes);
        assert_eq!(built_for(&m, 0, &["gfx942"]), BuiltFor::NotInBinary);
        // xnack+ devices do not take xnack- code.
        assert_eq!(built_for(&m, 0, &["gfx90a:xnack+"]), BuiltFor::NotInBinary);
        let plain = HipkMetadata::new("k", vec!["p".into()]);
        assert_eq!(built_for(&plain, 1, &gfx90a), BuiltFor::Unknown);
        // Same targets everywhere: no per-bundle key, every index built.
        let same = HipkMetadata::new("k", vec!["p".into()]).with_bundle_targets(&bundles[..1]);
        assert_eq!(same.co_targets, None);
        assert_eq!(built_for(&same, 7, &gfx90a), BuiltFor::Yes);
        assert_eq!(
            built_without_note(1, "amdgcn-amd-amdhsa--gfx90a"),
            "bundle #1 was built without gfx90a in the original fat binary: no code for it to load (as with the fat binary)"
        );
    }
}
