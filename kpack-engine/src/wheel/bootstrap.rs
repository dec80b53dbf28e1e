//! The GPU packaging hierarchy of rocm-bootstrap: every target belongs to a
//! sub-family and a family, and device wheels exist at each of these three
//! levels (`gfx1151` → `gfx115x` → `gfx11`).
//!
//! The tables below are those of **rocm-bootstrap 0.3.0** (PyPI,
//! `rocm_bootstrap/targets.py` and `package_metadata.py`), the version
//! upstream's wheel splitter requires (`rocm-bootstrap >= 0.3.0`). This is
//! the one place in kpack that knows them; update it together with the
//! version named in [`BOOTSTRAP_REQUIREMENT`].

/// The requirement a split host wheel gains (formats.md §8.3).
pub(crate) const BOOTSTRAP_REQUIREMENT: &str = "rocm-bootstrap >= 0.3.0";

/// Level of a bundle in the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    Target,
    SubFamily,
    Family,
}

/// A bundle: what one device wheel holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    /// The bundle key (`gfx942`, `gfx12_0`, `gfx11`).
    pub key: String,
    pub level: Level,
    /// rocm-bootstrap's `display_name` as its lookups return it (target
    /// bundles: the bare key).
    pub display_name: String,
    /// Whether rocm-bootstrap knows the key. An unknown key (a new GPU, a
    /// generic target) is treated as a target of its own, with no
    /// sub-family or family.
    pub known: bool,
}

/// Sub-families: key, display name, family, member targets (in
/// GCNProcessors.td order, as targets.py lists them).
const SUB_FAMILIES: &[(&str, &str, &str, &[&str])] = &[
    (
        "gfx9_0",
        "Vega",
        "gfx9",
        &[
            "gfx900", "gfx902", "gfx904", "gfx906", "gfx908", "gfx909", "gfx90a", "gfx90c",
        ],
    ),
    ("gfx9_4", "MI300", "gfx9", &["gfx942"]),
    ("gfx9_5", "MI350", "gfx9", &["gfx950"]),
    (
        "gfx10_1",
        "RDNA1",
        "gfx10",
        &["gfx1010", "gfx1011", "gfx1012", "gfx1013"],
    ),
    (
        "gfx10_3",
        "RDNA2",
        "gfx10",
        &[
            "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036",
        ],
    ),
    (
        "gfx110x",
        "RDNA3",
        "gfx11",
        &["gfx1100", "gfx1101", "gfx1102", "gfx1103"],
    ),
    (
        "gfx115x",
        "RDNA3.5",
        "gfx11",
        &["gfx1150", "gfx1151", "gfx1152", "gfx1153"],
    ),
    ("gfx12_0", "RDNA4", "gfx12", &["gfx1200", "gfx1201"]),
    (
        "gfx12_5",
        "GFX12.5",
        "gfx12",
        &["gfx1250", "gfx1250-strict", "gfx1251"],
    ),
];

/// Families: key, display name.
const FAMILIES: &[(&str, &str)] = &[
    ("gfx9", "GFX9"),
    ("gfx10", "GFX10"),
    ("gfx11", "RDNA3"),
    ("gfx12", "RDNA4"),
];

/// Legacy sub-family keys (`_BUNDLE_KEY_ALIASES`).
const ALIASES: &[(&str, &str)] = &[("gfx11_0", "gfx110x"), ("gfx11_5", "gfx115x")];

/// Targets that share another target's package (`_OVERRIDE_PACKAGE_OWNERS`).
const OWNER_OVERRIDES: &[(&str, &str)] = &[("gfx1250-strict", "gfx1250")];

/// The bundle key (package owner) of a target ID or database key:
/// trailing `:xnack±`/`:sramecc±` (or `-xnack±`) features dropped, then the
/// owner overrides (`gfx1250-strict` → `gfx1250`). `gfx942:sramecc+:xnack-`
/// → `gfx942`.
pub(crate) fn package_owner(target: &str) -> String {
    let mut t = target;
    loop {
        let stripped = ["xnack+", "xnack-", "sramecc+", "sramecc-"]
            .iter()
            .find_map(|f| {
                let rest = t.strip_suffix(f)?;
                rest.strip_suffix(':').or_else(|| rest.strip_suffix('-'))
            });
        match stripped {
            Some(rest) => t = rest,
            None => break,
        }
    }
    OWNER_OVERRIDES
        .iter()
        .find(|(from, _)| *from == t)
        .map_or(t, |(_, to)| to)
        .to_string()
}

/// The sub-family of a target known to the tables.
fn sub_family_of(
    target: &str,
) -> Option<&'static (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
)> {
    SUB_FAMILIES.iter().find(|sf| sf.3.contains(&target))
}

/// The bundle of a key (`lookup_bundle`); an unknown key is a target of its
/// own (`known: false`).
pub fn lookup(key: &str) -> Bundle {
    let key = ALIASES
        .iter()
        .find(|(alias, _)| *alias == key)
        .map_or(key, |(_, canonical)| canonical);
    let bundle = |level, display: &str| Bundle {
        key: key.to_string(),
        level,
        display_name: display.to_string(),
        known: true,
    };
    if let Some((_, display)) = FAMILIES.iter().find(|f| f.0 == key) {
        return bundle(Level::Family, display);
    }
    if let Some(sf) = SUB_FAMILIES.iter().find(|sf| sf.0 == key) {
        return bundle(Level::SubFamily, sf.1);
    }
    // Target bundles are keyed by package owner (gfx1250 owns gfx1250-strict).
    if package_owner(key) == key && sub_family_of(key).is_some() {
        return bundle(Level::Target, key);
    }
    Bundle {
        key: key.to_string(),
        level: Level::Target,
        display_name: key.to_string(),
        known: false,
    }
}

/// The packaging chain of a target bundle key (`packaging_chain`): the
/// target, its sub-family and its family, most specific first. An unknown
/// key is its own chain.
pub fn chain(target_key: &str) -> Vec<String> {
    match sub_family_of(target_key) {
        Some((sf, _, family, _)) => {
            vec![target_key.to_string(), sf.to_string(), family.to_string()]
        }
        None => vec![target_key.to_string()],
    }
}

/// The distribution name of a device wheel (`device_dist_name`):
/// `<prefix>-<key with "_" → "-">`.
pub(crate) fn device_dist_name(prefix: &str, key: &str) -> String {
    format!("{prefix}-{}", key.replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_strip_features_and_collapse_strict() {
        assert_eq!(package_owner("gfx942:sramecc+:xnack-"), "gfx942");
        assert_eq!(package_owner("gfx90a:xnack+"), "gfx90a");
        assert_eq!(package_owner("gfx90a-xnack-"), "gfx90a");
        assert_eq!(package_owner("gfx1250-strict"), "gfx1250");
        assert_eq!(package_owner("gfx1250-strict:xnack+"), "gfx1250");
        assert_eq!(package_owner("gfx11"), "gfx11");
        assert_eq!(package_owner("gfx11-generic"), "gfx11-generic");
    }

    #[test]
    fn lookups_and_chains() {
        let b = lookup("gfx942");
        assert_eq!(
            (b.level, b.display_name.as_str(), b.known),
            (Level::Target, "gfx942", true)
        );
        assert_eq!(lookup("gfx12_0").level, Level::SubFamily);
        assert_eq!(lookup("gfx12_0").display_name, "RDNA4");
        assert_eq!(lookup("gfx11").display_name, "RDNA3");
        assert_eq!(lookup("gfx11").level, Level::Family);
        assert_eq!(lookup("gfx11_0").key, "gfx110x");
        assert_eq!(lookup("gfx110x").display_name, "RDNA3");
        // gfx1250-strict is packaged by gfx1250: not a bundle of its own.
        assert!(!lookup("gfx1250-strict").known);
        assert!(lookup("gfx1250").known);
        let u = lookup("gfx11-generic");
        assert_eq!((u.level, u.known), (Level::Target, false));
        assert_eq!(chain("gfx1151"), ["gfx1151", "gfx115x", "gfx11"]);
        assert_eq!(chain("gfx942"), ["gfx942", "gfx9_4", "gfx9"]);
        assert_eq!(chain("gfx1201"), ["gfx1201", "gfx12_0", "gfx12"]);
        assert_eq!(chain("gfx1250"), ["gfx1250", "gfx12_5", "gfx12"]);
        assert_eq!(chain("gfx1300"), ["gfx1300"]);
        assert_eq!(
            device_dist_name("amd-torch-device", "gfx12_0"),
            "amd-torch-device-gfx12-0"
        );
    }

    #[test]
    fn every_target_has_one_sub_family_and_a_family() {
        let mut seen = std::collections::BTreeSet::new();
        for (_, _, family, members) in SUB_FAMILIES {
            assert!(FAMILIES.iter().any(|f| f.0 == *family));
            for m in *members {
                assert!(seen.insert(*m), "{m} twice");
            }
        }
        assert_eq!(seen.len(), 34, "targets.py 0.3.0 lists 34 targets");
    }
}
