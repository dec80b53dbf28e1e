//! The text files of the output wheels: the host `METADATA` with its extras
//! (formats.md §8.3), the device wheels' `METADATA`, `WHEEL` and
//! `top_level.txt` (§8.4; a target's wheel also pins its sub-family and
//! family wheels, docs/wheels.md), the variant wheel's `METADATA` and
//! `variant.json` (§8.5), and those of PEP 825 variant wheels
//! (docs/wheels.md, variant wheels).

use std::collections::BTreeMap;

use serde::Serialize;

use super::bootstrap::{self, Bundle, Level, BOOTSTRAP_REQUIREMENT};
use super::identity::Identity;
use crate::hipk::GFXARCH;

/// The device wheels of one split: their bundles, sorted by key.
pub(crate) struct Devices<'a> {
    pub prefix: &'a str,
    pub bundles: &'a [Bundle],
}

impl Devices<'_> {
    fn has(&self, key: &str) -> bool {
        self.bundles.iter().any(|b| b.key == key)
    }

    /// Target-level keys, in string order (`gfx11` < `gfx1100` < `gfx942`).
    pub(crate) fn target_keys(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .bundles
            .iter()
            .filter(|b| b.level == Level::Target)
            .map(|b| b.key.as_str())
            .collect();
        v.sort();
        v
    }

    pub(crate) fn dist_name(&self, key: &str) -> String {
        bootstrap::device_dist_name(self.prefix, key)
    }
}

/// The host `METADATA`: `original` with the rocm-bootstrap requirement and
/// the extras inserted after its header block.
pub(crate) fn host_metadata(original: &str, id: &Identity, devices: &Devices) -> String {
    if devices.bundles.is_empty() {
        // No device code: nothing to depend on.
        return original.to_string();
    }
    let v = &id.version;
    let mut lines = vec![format!("Requires-Dist: {BOOTSTRAP_REQUIREMENT}")];
    for t in devices.target_keys() {
        lines.push(format!("Provides-Extra: device-{t}"));
        for key in bootstrap::chain(t).iter().filter(|k| devices.has(k)) {
            lines.push(format!(
                "Requires-Dist: {} == {v}; extra == \"device-{t}\"",
                devices.dist_name(key)
            ));
        }
    }
    lines.push("Provides-Extra: device-all".to_string());
    let mut all: Vec<String> = devices
        .bundles
        .iter()
        .map(|b| devices.dist_name(&b.key))
        .collect();
    all.sort();
    for d in all {
        lines.push(format!(
            "Requires-Dist: {d} == {v}; extra == \"device-all\""
        ));
    }
    insert_headers(original, &lines)
}

/// `original` with `lines` inserted at the end of its header block (before
/// the first empty line; appended when there is no body).
fn insert_headers(original: &str, lines: &[String]) -> String {
    let block = lines.join("\n") + "\n";
    match original.find("\n\n") {
        Some(end) => format!("{}{block}{}", &original[..=end], &original[end + 1..]),
        None if original.is_empty() || original.ends_with('\n') => format!("{original}{block}"),
        None => format!("{original}\n{block}"),
    }
}

/// The variant wheel's `METADATA`: every line of the classic host
/// `METADATA`, and after each per-target extra requirement the same
/// requirement under a `variant_properties` marker.
pub(crate) fn variant_metadata(classic: &str) -> String {
    let mut out = Vec::new();
    for line in classic.lines() {
        out.push(line.to_string());
        if !line.starts_with("Requires-Dist:")
            || !line.contains("extra ==")
            || line.contains("extra == \"device-all\"")
        {
            continue;
        }
        if let Some((req, extra)) = split_extra(line) {
            let target = extra.strip_prefix("device-").unwrap_or(extra);
            out.push(format!(
                "{req}; \"amd :: gfx_arch :: {target}\" in variant_properties"
            ));
        }
    }
    out.join("\n") + "\n"
}

/// `line` as upstream's `(Requires-Dist: .+ == .+); extra == "([\w-]+)"`
/// (anchored at the start only, greedy) reads it: the requirement and the
/// extra's name.
fn split_extra(line: &str) -> Option<(&str, &str)> {
    const SEP: &str = "; extra == \"";
    let mut end = line.len();
    while let Some(at) = line[..end].rfind(SEP) {
        let req = &line[..at];
        let rest = &line[at + SEP.len()..];
        let name_len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(rest.len());
        let req_ok = req.strip_prefix("Requires-Dist: ").is_some_and(|r| {
            r.char_indices()
                .any(|(i, _)| i > 0 && r[i..].starts_with(" == ") && r.len() > i + 4)
        });
        if req_ok && name_len > 0 && rest[name_len..].starts_with('"') {
            return Some((req, &rest[..name_len]));
        }
        end = at;
    }
    None
}

/// A device wheel's `METADATA`.
pub(crate) fn device_metadata(
    id: &Identity,
    bundle: &Bundle,
    devices: &Devices,
    requires: &[String],
) -> String {
    let v = &id.version;
    let mut lines = vec![
        "Metadata-Version: 2.4".to_string(),
        format!("Name: {}", devices.dist_name(&bundle.key)),
        format!("Version: {v}"),
        format!(
            "Summary: AMD device kernels ({}) for {}",
            bundle.display_name, id.name
        ),
        format!("Requires-Dist: {} == {v}", id.name),
    ];
    for r in requires {
        // Per-target packages (rocm-sdk-device-<target>) exist only for
        // targets: family and sub-family wheels never depend on them.
        if r.contains(GFXARCH) && bundle.level != Level::Target {
            continue;
        }
        lines.push(format!(
            "Requires-Dist: {}",
            r.replace(GFXARCH, &bundle.key)
        ));
    }
    lines.extend(
        family_requirements(bundle, devices)
            .into_iter()
            .map(|dist| format!("Requires-Dist: {dist} == {v}")),
    );
    lines.join("\n") + "\n"
}

/// The device wheels a target-level wheel needs besides its own: those of
/// its sub-family and family (the rest of its packaging chain, in that
/// order) that this split emits. Kernels a target shares with its family
/// (AOTriton's images) are only there: without them PyTorch's attention
/// fails at run time (docs/wheels.md). Family and sub-family wheels need
/// none.
pub(crate) fn family_requirements(bundle: &Bundle, devices: &Devices) -> Vec<String> {
    if bundle.level != Level::Target {
        return Vec::new();
    }
    bootstrap::chain(&bundle.key)
        .iter()
        .skip(1)
        .filter(|k| devices.has(k))
        .map(|k| devices.dist_name(k))
        .collect()
}

/// A device wheel's `WHEEL`.
pub(crate) fn device_wheel_file(id: &Identity) -> String {
    format!(
        "Wheel-Version: 1.0\nGenerator: rocm-kpack-split-python-wheels\nRoot-Is-Purelib: false\nTag: {}\n",
        id.tag()
    )
}

#[derive(Serialize)]
struct VariantJson<'a> {
    providers: BTreeMap<&'a str, Provider<'a>>,
    #[serde(rename = "default-priorities")]
    default_priorities: Priorities<'a>,
    variants: BTreeMap<&'a str, BTreeMap<&'a str, BTreeMap<&'a str, Vec<&'a str>>>>,
}

#[derive(Serialize)]
struct Provider<'a> {
    #[serde(rename = "install-time")]
    install_time: bool,
    #[serde(rename = "plugin-api")]
    plugin_api: &'a str,
    requires: Vec<&'a str>,
}

#[derive(Serialize)]
struct Priorities<'a> {
    namespace: Vec<&'a str>,
    property: BTreeMap<&'a str, BTreeMap<&'a str, Vec<&'a str>>>,
}

/// The variant wheel's `variant.json` (as Python's `json.dumps(...,
/// indent=2)` writes it, with a final newline).
pub(crate) fn variant_json(devices: &Devices) -> String {
    let targets = devices.target_keys();
    let doc = VariantJson {
        providers: BTreeMap::from([(
            "amd",
            Provider {
                install_time: true,
                plugin_api: "amd_variant_provider.plugin:AMDVariantPlugin",
                requires: vec!["amd-variant-provider >= 1.0"],
            },
        )]),
        default_priorities: Priorities {
            namespace: vec!["amd"],
            property: BTreeMap::from([("amd", BTreeMap::from([("gfx_arch", targets.clone())]))]),
        },
        variants: targets
            .iter()
            .map(|t| {
                (
                    *t,
                    BTreeMap::from([("amd", BTreeMap::from([("gfx_arch", vec![*t])]))]),
                )
            })
            .collect(),
    };
    serde_json::to_string_pretty(&doc).expect("variant.json serializes") + "\n"
}

/// The `$schema` of a PEP 825 `variant.json` (schema v0.1.1).
pub(crate) const PEP825_SCHEMA: &str = "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json";
/// The variant namespace and feature of a GPU architecture.
const NAMESPACE: &str = "amd";
const FEATURE: &str = "gfx_arch";

/// The PEP 825 label of a target bundle key, which is also its `gfx_arch`
/// value: labels and values are `^[0-9a-z_.]+$`, so `-` becomes `_`
/// (`gfx11-generic` → `gfx11_generic`).
pub(crate) fn pep825_label(key: &str) -> String {
    key.to_lowercase()
        .chars()
        .map(|c| match c {
            '0'..='9' | 'a'..='z' | '_' | '.' => c,
            _ => '_',
        })
        .collect()
}

type Properties = BTreeMap<&'static str, BTreeMap<&'static str, Vec<String>>>;

#[derive(Serialize)]
struct Pep825Json {
    #[serde(rename = "$schema")]
    schema: &'static str,
    #[serde(rename = "default-priorities")]
    default_priorities: BTreeMap<&'static str, Vec<&'static str>>,
    providers: BTreeMap<&'static str, StaticProvider>,
    variants: BTreeMap<String, Properties>,
}

/// A provider whose properties are static (PEP 850 draft): an installer
/// needs no plugin to choose a variant.
#[derive(Serialize)]
struct StaticProvider {
    #[serde(rename = "static-properties")]
    static_properties: BTreeMap<&'static str, Vec<String>>,
}

/// A PEP 825 `variant.json` naming the variants of `labels` (one for a
/// wheel's own `*.dist-info/variant.json`, all for the index's
/// `<name>-<version>-variants.json`). The provider lists every target's
/// value as static, in the order of [`Devices::target_keys`]: an installer
/// takes the first variant of that order it has.
pub(crate) fn pep825_variant_json(devices: &Devices, labels: &[String]) -> String {
    let all: Vec<String> = devices
        .target_keys()
        .iter()
        .map(|k| pep825_label(k))
        .collect();
    let doc = Pep825Json {
        schema: PEP825_SCHEMA,
        default_priorities: BTreeMap::from([("namespace", vec![NAMESPACE])]),
        providers: BTreeMap::from([(
            NAMESPACE,
            StaticProvider {
                static_properties: BTreeMap::from([(FEATURE, all)]),
            },
        )]),
        variants: labels
            .iter()
            .map(|l| {
                let props = BTreeMap::from([(FEATURE, vec![l.clone()])]);
                (l.clone(), BTreeMap::from([(NAMESPACE, props)]))
            })
            .collect(),
    };
    serde_json::to_string_pretty(&doc).expect("variant.json serializes") + "\n"
}

/// The `METADATA` of the PEP 825 variant wheel of the target bundle key
/// `key`: the host wheel's (`classic`), and the device wheels of the key's
/// packaging chain that this split emits, required without a marker (the
/// wheel is for that target only).
pub(crate) fn pep825_metadata(
    classic: &str,
    id: &Identity,
    devices: &Devices,
    key: &str,
) -> String {
    let lines: Vec<String> = bootstrap::chain(key)
        .iter()
        .filter(|k| devices.has(k))
        .map(|k| format!("Requires-Dist: {} == {}", devices.dist_name(k), id.version))
        .collect();
    insert_headers(classic, &lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            name: "torch".into(),
            version: "2.10.0+rocm7.1".into(),
            python_tag: "cp313".into(),
            abi_tag: "cp313".into(),
            platform_tag: "linux_x86_64".into(),
            dist_info: "torch-2.10.0+rocm7.1.dist-info".into(),
        }
    }

    fn bundles(keys: &[&str]) -> Vec<Bundle> {
        keys.iter().map(|k| bootstrap::lookup(k)).collect()
    }

    #[test]
    fn host_extras_follow_the_chains() {
        let b = bundles(&["gfx1100", "gfx110x", "gfx11", "gfx942"]);
        let d = Devices {
            prefix: "amd-torch-device",
            bundles: &b,
        };
        let m = host_metadata(
            "Metadata-Version: 2.1\nName: torch\n\nBody text\n",
            &id(),
            &d,
        );
        let v = "2.10.0+rocm7.1";
        let want = format!(
            "Metadata-Version: 2.1\nName: torch\n\
             Requires-Dist: rocm-bootstrap >= 0.3.0\n\
             Provides-Extra: device-gfx1100\n\
             Requires-Dist: amd-torch-device-gfx1100 == {v}; extra == \"device-gfx1100\"\n\
             Requires-Dist: amd-torch-device-gfx110x == {v}; extra == \"device-gfx1100\"\n\
             Requires-Dist: amd-torch-device-gfx11 == {v}; extra == \"device-gfx1100\"\n\
             Provides-Extra: device-gfx942\n\
             Requires-Dist: amd-torch-device-gfx942 == {v}; extra == \"device-gfx942\"\n\
             Provides-Extra: device-all\n\
             Requires-Dist: amd-torch-device-gfx11 == {v}; extra == \"device-all\"\n\
             Requires-Dist: amd-torch-device-gfx1100 == {v}; extra == \"device-all\"\n\
             Requires-Dist: amd-torch-device-gfx110x == {v}; extra == \"device-all\"\n\
             Requires-Dist: amd-torch-device-gfx942 == {v}; extra == \"device-all\"\n\
             \nBody text\n"
        );
        assert_eq!(m, want);
        assert!(host_metadata("Name: t\nVersion: 1", &id(), &d)
            .starts_with("Name: t\nVersion: 1\nRequires-Dist: rocm-bootstrap"));

        let var = variant_metadata(&m);
        assert!(var.contains(&format!(
            "Requires-Dist: amd-torch-device-gfx110x == {v}; extra == \"device-gfx1100\"\n\
             Requires-Dist: amd-torch-device-gfx110x == {v}; \"amd :: gfx_arch :: gfx1100\" in variant_properties\n"
        )));
        assert_eq!(var.matches("variant_properties").count(), 4);
    }

    #[test]
    fn pep825_variant_files() {
        let b = bundles(&["gfx1100", "gfx110x", "gfx942", "gfx11-generic"]);
        let d = Devices {
            prefix: "amd-torch-device",
            bundles: &b,
        };
        assert_eq!(pep825_label("gfx11-generic"), "gfx11_generic");
        let j = pep825_variant_json(&d, &["gfx942".to_string()]);
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "$schema": PEP825_SCHEMA,
                "default-priorities": {"namespace": ["amd"]},
                "providers": {"amd": {"static-properties": {
                    // The target keys' string order: `-` sorts before `0`.
                    "gfx_arch": ["gfx11_generic", "gfx1100", "gfx942"]}}},
                "variants": {"gfx942": {"amd": {"gfx_arch": ["gfx942"]}}},
            })
        );
        assert!(j.starts_with("{\n  \"$schema\": "), "{j}");
        let m = pep825_metadata("Name: torch\n\nBody\n", &id(), &d, "gfx1100");
        assert_eq!(
            m,
            "Name: torch\nRequires-Dist: amd-torch-device-gfx1100 == 2.10.0+rocm7.1\n\
             Requires-Dist: amd-torch-device-gfx110x == 2.10.0+rocm7.1\n\nBody\n"
        );
        // No device wheels: the host METADATA stays as it was.
        let none = Devices {
            prefix: "p",
            bundles: &[],
        };
        assert_eq!(
            host_metadata("Name: t\n\nB\n", &id(), &none),
            "Name: t\n\nB\n"
        );
    }

    #[test]
    fn extra_lines_as_upstream_reads_them() {
        assert_eq!(
            split_extra("Requires-Dist: a == 1; extra == \"device-x_1\" trailing"),
            Some(("Requires-Dist: a == 1", "device-x_1"))
        );
        assert_eq!(split_extra("Requires-Dist: a >= 1; extra == \"x\""), None);
        assert_eq!(split_extra("Requires-Dist: a == 1; extra == \"\""), None);
    }

    /// docs/wheels.md, device wheels: the family pins of torch
    /// 2.12.0+rocm7.14.0 split into gfx11, gfx1100 and gfx942.
    #[test]
    fn target_wheels_require_their_family_wheels() {
        let id = Identity {
            version: "2.12.0+rocm7.14.0".into(),
            ..id()
        };
        let b = bundles(&["gfx11", "gfx1100", "gfx942"]);
        let d = Devices {
            prefix: "amd-torch-device",
            bundles: &b,
        };
        let req = vec!["rocm-sdk-device-@GFXARCH@ == 7.14.0".to_string()];
        let requires = |bundle: &Bundle| -> Vec<String> {
            device_metadata(&id, bundle, &d, &req)
                .lines()
                .filter_map(|l| l.strip_prefix("Requires-Dist: "))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            requires(&b[1]),
            [
                "torch == 2.12.0+rocm7.14.0",
                "rocm-sdk-device-gfx1100 == 7.14.0",
                "amd-torch-device-gfx11 == 2.12.0+rocm7.14.0",
            ]
        );
        assert_eq!(requires(&b[0]), ["torch == 2.12.0+rocm7.14.0"]);
        assert_eq!(
            requires(&b[2]),
            [
                "torch == 2.12.0+rocm7.14.0",
                "rocm-sdk-device-gfx942 == 7.14.0",
            ]
        );
        // Sub-family, then family; an unknown target has no chain.
        let b = bundles(&["gfx11", "gfx110x", "gfx1101", "gfx1300"]);
        let d = Devices {
            prefix: "p",
            bundles: &b,
        };
        assert_eq!(family_requirements(&b[2], &d), ["p-gfx110x", "p-gfx11"]);
        assert!(family_requirements(&b[1], &d).is_empty());
        assert!(family_requirements(&b[3], &d).is_empty());
    }

    #[test]
    fn device_files() {
        let b = bundles(&["gfx12_0", "gfx1201"]);
        let d = Devices {
            prefix: "amd-torch-device",
            bundles: &b,
        };
        let req = vec![
            "rocm-sdk-device-@GFXARCH@ == 7.1".to_string(),
            "other".to_string(),
        ];
        let m = device_metadata(&id(), &b[0], &d, &req);
        assert_eq!(
            m,
            "Metadata-Version: 2.4\nName: amd-torch-device-gfx12-0\nVersion: 2.10.0+rocm7.1\n\
             Summary: AMD device kernels (RDNA4) for torch\nRequires-Dist: torch == 2.10.0+rocm7.1\n\
             Requires-Dist: other\n"
        );
        let m = device_metadata(&id(), &b[1], &d, &req);
        assert!(m.contains("Summary: AMD device kernels (gfx1201) for torch\n"));
        assert!(m.contains("Requires-Dist: rocm-sdk-device-gfx1201 == 7.1\nRequires-Dist: other\n"));
        assert!(device_wheel_file(&id())
            .ends_with("Root-Is-Purelib: false\nTag: cp313-cp313-linux_x86_64\n"));
        let j = variant_json(&d);
        assert_eq!(
            j,
            "{\n  \"providers\": {\n    \"amd\": {\n      \"install-time\": true,\n      \"plugin-api\": \"amd_variant_provider.plugin:AMDVariantPlugin\",\n      \"requires\": [\n        \"amd-variant-provider >= 1.0\"\n      ]\n    }\n  },\n  \"default-priorities\": {\n    \"namespace\": [\n      \"amd\"\n    ],\n    \"property\": {\n      \"amd\": {\n        \"gfx_arch\": [\n          \"gfx1201\"\n        ]\n      }\n    }\n  },\n  \"variants\": {\n    \"gfx1201\": {\n      \"amd\": {\n        \"gfx_arch\": [\n          \"gfx1201\"\n        ]\n      }\n    }\n  }\n}\n"
        );
    }
}
