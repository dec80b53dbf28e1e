//! What each AMDGPU processor supports, as the runtime sees a device
//! (formats.md §2.4): the target features it has (`sramecc`, `xnack`),
//! its generic target (CLR passes a device's own ISA, then that one), and
//! the kernel driver's `gfx_target_version` (`MMmmss`: 90402 is gfx942).
//!
//! The feature table is LLVM's (`AMDGPUTargetParser`); a processor it does
//! not list has no feature and no generic target.

use crate::target::TargetId;

/// The KFD `capability` bit for SRAM ECC (`HSA_CAP_SRAM_EDCSUPPORTED`).
pub const CAP_SRAM_EDC: u64 = 0x0400_0000;

/// Processors with the `sramecc` feature.
const SRAMECC: &[&str] = &[
    "gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950",
];

/// Processors with the `xnack` feature.
const XNACK: &[&str] = &[
    "gfx801", "gfx810", "gfx900", "gfx902", "gfx904", "gfx906", "gfx908", "gfx909", "gfx90a",
    "gfx90c", "gfx940", "gfx941", "gfx942", "gfx950", "gfx1010", "gfx1011", "gfx1012", "gfx1013",
];

/// Generic targets, each with the processors it runs on and the features
/// it keeps of theirs.
const GENERIC: &[(&str, &[&str], &[&str])] = &[
    (
        "gfx9-generic",
        &["gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"],
        &["xnack"],
    ),
    (
        "gfx9-4-generic",
        &["gfx940", "gfx941", "gfx942", "gfx950"],
        &["sramecc", "xnack"],
    ),
    (
        "gfx10-1-generic",
        &["gfx1010", "gfx1011", "gfx1012", "gfx1013"],
        &["xnack"],
    ),
    (
        "gfx10-3-generic",
        &[
            "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036",
        ],
        &[],
    ),
    (
        "gfx11-generic",
        &[
            "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153",
        ],
        &[],
    ),
    ("gfx12-generic", &["gfx1200", "gfx1201"], &[]),
    ("gfx12-5-generic", &["gfx1250", "gfx1251"], &[]),
];

/// Does `processor` have the feature `sramecc`?
pub fn has_sramecc(processor: &str) -> bool {
    SRAMECC.contains(&processor)
}

/// Does `processor` have the feature `xnack`?
pub fn has_xnack(processor: &str) -> bool {
    XNACK.contains(&processor)
}

/// The processor a KFD node's `gfx_target_version` names: `MMmmss` is
/// `gfx<MM><mm><ss as one hex digit>` (90402 → gfx942, 90010 → gfx90a,
/// 110501 → gfx1151). `None` for 0 (a CPU node) and for a stepping that is
/// not one hex digit.
pub fn processor_of_version(version: u64) -> Option<String> {
    if version == 0 {
        return None;
    }
    let (major, minor, stepping) = (version / 10_000, version / 100 % 100, version % 100);
    if stepping > 15 || minor > 9 {
        return None;
    }
    Some(format!("gfx{major}{minor}{stepping:x}"))
}

/// The target ID of a device as ROCr reports it (and CLR passes it on):
/// its processor, with `sramecc+` when the processor has the feature and
/// the device has ECC on (`sramecc-` when it has it off), and `xnack+`
/// when the processor has the feature and XNACK is on (`HSA_XNACK=1`),
/// else `xnack-`. An MI300X: `gfx942:sramecc+:xnack-`.
pub fn device_target(processor: &str, sram_ecc: bool, xnack: bool) -> String {
    let mut t = processor.to_string();
    if has_sramecc(processor) {
        t.push_str(if sram_ecc { ":sramecc+" } else { ":sramecc-" });
    }
    if has_xnack(processor) {
        t.push_str(if xnack { ":xnack+" } else { ":xnack-" });
    }
    t
}

/// The generic target CLR tries after a device's own (`gfx942:sramecc+:
/// xnack-` → `gfx9-4-generic:sramecc+:xnack-`), with the features the
/// generic target keeps; `None` for a processor without one.
pub fn generic_target(device: &TargetId) -> Option<String> {
    let (name, _, keeps) = GENERIC
        .iter()
        .find(|(_, members, _)| members.contains(&device.processor()))?;
    let mut t = name.to_string();
    for (feature, on) in device.features() {
        if keeps.contains(&feature.as_str()) {
            t.push_str(&format!(":{feature}{}", if *on { '+' } else { '-' }));
        }
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_name_processors() {
        for (v, name) in [
            (90402, "gfx942"),
            (90010, "gfx90a"),
            (110501, "gfx1151"),
            (100300, "gfx1030"),
            (120001, "gfx1201"),
            (90500, "gfx950"),
            (90012, "gfx90c"),
            (120500, "gfx1250"),
        ] {
            assert_eq!(processor_of_version(v).as_deref(), Some(name), "{v}");
        }
        assert_eq!(processor_of_version(0), None);
        assert_eq!(processor_of_version(90016), None);
    }

    #[test]
    fn device_targets_as_rocr_reports_them() {
        assert_eq!(
            device_target("gfx942", true, false),
            "gfx942:sramecc+:xnack-"
        );
        assert_eq!(
            device_target("gfx90a", false, true),
            "gfx90a:sramecc-:xnack+"
        );
        assert_eq!(device_target("gfx1100", true, true), "gfx1100");
        assert_eq!(device_target("gfx900", true, false), "gfx900:xnack-");
        assert_eq!(device_target("gfx1151", false, false), "gfx1151");
    }

    #[test]
    fn generic_targets_keep_their_features() {
        let g = |t: &str| generic_target(&TargetId::parse(t).unwrap());
        assert_eq!(
            g("gfx942:sramecc+:xnack-").as_deref(),
            Some("gfx9-4-generic:sramecc+:xnack-")
        );
        assert_eq!(
            g("gfx906:sramecc-:xnack-").as_deref(),
            Some("gfx9-generic:xnack-")
        );
        assert_eq!(g("gfx1151").as_deref(), Some("gfx11-generic"));
        assert_eq!(g("gfx1030").as_deref(), Some("gfx10-3-generic"));
        assert_eq!(g("gfx908:sramecc+:xnack-"), None);
        assert_eq!(g("gfx90a:xnack-"), None);
    }
}
