//! The packaging config of recombine (formats.md §6.5):
//!
//! ```json
//! {"primary_shard": "gfx110X-build",
//!  "architecture_groups": {"gfx110X": {"display_name": "...", "architectures": ["gfx1100", "gfx1101"]}},
//!  "validation": {"error_on_duplicate_device_code": true,
//!                 "verify_generic_artifacts_match": false,
//!                 "error_on_missing_architecture": false}}
//! ```
//!
//! Read in two steps: serde derives give the file its shape ([`ConfigFile`];
//! unknown keys are errors, since a misspelt validation option would
//! otherwise be silently off; a value of the wrong type is named by its
//! field path), then [`ConfigFile::validate`] checks what types cannot say
//! (names, target IDs, one group per processor).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::manifest::GENERIC;
use crate::target::{TargetId, TargetSelector};
use crate::{ArtifactError, Result};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PackagingConfig {
    pub primary_shard: String,
    /// Sorted by name.
    pub architecture_groups: Vec<ArchitectureGroup>,
    pub validation: Validation,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchitectureGroup {
    pub name: String,
    pub display_name: Option<String>,
    /// Processors (`gfx90a`: every feature variant of it), full target
    /// IDs (`gfx90a:xnack-`: exactly that one) or family wildcards
    /// (`gfx125X`: gfx1250, gfx1251, not gfx1250-strict), as
    /// [`TargetSelector`] reads them.
    pub architectures: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a JSON object")]
pub struct Validation {
    /// The same target from two shards with different bytes is an error
    /// (else: the primary shard wins, then the first in sorted order).
    pub error_on_duplicate_device_code: bool,
    /// Generic artifacts of all shards must match.
    pub verify_generic_artifacts_match: bool,
    /// A configured architecture that no shard provides is an error.
    pub error_on_missing_architecture: bool,
}

impl Default for Validation {
    fn default() -> Self {
        Validation {
            error_on_duplicate_device_code: true,
            verify_generic_artifacts_match: false,
            error_on_missing_architecture: false,
        }
    }
}

impl ArchitectureGroup {
    /// Does `target` (a target ID, or a database family key such as
    /// AOTriton's `gfx12_0`, which only a group naming it takes) belong to
    /// this group? Matched as whole target IDs ([`TargetSelector`]).
    pub fn contains(&self, target: &str) -> bool {
        self.architectures
            .iter()
            .any(|a| TargetSelector::parse(a).is_ok_and(|s| s.selects_name(target)))
    }
}

/// `arch` (a processor, a full target ID or a family wildcard) takes
/// `target` ([`TargetSelector::selects`]).
pub(crate) fn arch_matches(arch: &str, target: &TargetId) -> bool {
    TargetSelector::parse(arch).is_ok_and(|s| s.selects(target))
}

/// The config file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
pub(crate) struct ConfigFile {
    primary_shard: String,
    /// Group name -> group (sorted by name).
    architecture_groups: BTreeMap<String, Object<GroupFile>>,
    #[serde(default)]
    validation: Object<Validation>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct GroupFile {
    #[serde(default)]
    display_name: Option<String>,
    architectures: Vec<String>,
}

impl ConfigFile {
    /// Parse a config's text: its shape, not yet its rules. The error says
    /// what is wrong, and where.
    pub(crate) fn from_json(text: &str) -> std::result::Result<ConfigFile, String> {
        if text.trim().is_empty() {
            return Err("packaging config is empty".into());
        }
        let mut de = serde_json::Deserializer::from_str(text);
        let file: Object<ConfigFile> =
            serde_path_to_error::deserialize(&mut de).map_err(describe)?;
        de.end().map_err(|e| describe_json(".", e))?;
        Ok(file.0)
    }

    /// The rules that types cannot say: a non-empty primary shard, at least
    /// one group, group names usable in artifact names, architectures that
    /// are AMDGPU target IDs, and no processor in two groups.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.primary_shard.trim().is_empty() {
            return Err("`primary_shard` is empty".into());
        }
        if self.architecture_groups.is_empty() {
            return Err("`architecture_groups` is empty: at least one group is needed".into());
        }
        for (name, Object(group)) in &self.architecture_groups {
            let field = format!("architecture_groups.{name}");
            check_group_name(&field, name)?;
            if group.architectures.is_empty() {
                return Err(format!("`{field}.architectures` is empty"));
            }
            for (i, a) in group.architectures.iter().enumerate() {
                check_architecture(&format!("{field}.architectures[{i}]"), a)?;
            }
        }
        self.check_one_group_per_processor()
    }

    /// Membership must be unambiguous.
    fn check_one_group_per_processor(&self) -> std::result::Result<(), String> {
        let mut owners: BTreeMap<String, &str> = BTreeMap::new();
        for (name, Object(group)) in &self.architecture_groups {
            for a in &group.architectures {
                let p = match TargetSelector::parse(a) {
                    Ok(TargetSelector::Processor(p)) => p,
                    Ok(TargetSelector::Exact(t)) => t.processor().to_string(),
                    _ => continue,
                };
                match owners.get(&p) {
                    Some(other) if *other != name => {
                        return Err(format!(
                            "processor {p} is in groups {other} and {name}: a target must belong to one group"
                        ))
                    }
                    _ => {
                        owners.insert(p, name);
                    }
                }
            }
        }
        Ok(())
    }

    /// The checked config (call [`ConfigFile::validate`] first).
    fn into_config(self) -> PackagingConfig {
        PackagingConfig {
            primary_shard: self.primary_shard,
            architecture_groups: self
                .architecture_groups
                .into_iter()
                .map(|(name, Object(g))| ArchitectureGroup {
                    name,
                    display_name: g.display_name,
                    architectures: g.architectures,
                })
                .collect(),
            validation: self.validation.0,
        }
    }
}

/// Artifacts are named `<component>_<group>`.
fn check_group_name(field: &str, name: &str) -> std::result::Result<(), String> {
    let bad = name.is_empty()
        || name == GENERIC
        || name.contains(['/', '\\', '_'])
        || name.starts_with('.')
        || name.chars().any(char::is_whitespace);
    if bad {
        return Err(format!(
            "`{field}`: invalid group name {name:?} (artifacts are named <component>_<group>: no `/`, `_`, spaces, leading `.`, and not \"generic\")"
        ));
    }
    Ok(())
}

fn check_architecture(field: &str, a: &str) -> std::result::Result<(), String> {
    if !a.starts_with("gfx") && a != crate::target::SPIRV {
        return Err(format!(
            "`{field}`: {a:?} does not start with \"gfx\" (an AMDGPU processor such as gfx1100)"
        ));
    }
    TargetSelector::parse(a).map_err(|e| format!("`{field}`: {e}"))?;
    Ok(())
}

/// A struct read from a JSON object only: serde's derives also take an
/// array of the fields' values in order, which a config should not be.
#[derive(Debug, Default)]
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Fields<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Fields(std::marker::PhantomData))
            .map(Object)
    }
}

fn describe(e: serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    describe_json(&path, e.into_inner())
}

/// A serde_json error at `path` (`.`: the whole file).
fn describe_json(path: &str, e: serde_json::Error) -> String {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof => format!("packaging config is not valid JSON: {e}"),
        _ if path == "." => format!("packaging config: {e}"),
        _ => format!("`{path}`: {e}"),
    }
}

impl PackagingConfig {
    /// Read and check a config file.
    pub fn load(path: &Path) -> Result<PackagingConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| ArtifactError::io(path, e))?;
        PackagingConfig::parse(path, &text)
    }

    /// Check a config's text (`path` is for messages).
    pub fn parse(path: &Path, text: &str) -> Result<PackagingConfig> {
        let err = |what: String| ArtifactError::Config {
            path: PathBuf::from(path),
            what,
        };
        let file = ConfigFile::from_json(text).map_err(err)?;
        file.validate().map_err(err)?;
        Ok(file.into_config())
    }

    /// The group `target` belongs to.
    pub(crate) fn group_of(&self, target: &str) -> Option<&ArchitectureGroup> {
        self.architecture_groups.iter().find(|g| g.contains(target))
    }

    pub fn group(&self, name: &str) -> Option<&ArchitectureGroup> {
        self.architecture_groups.iter().find(|g| g.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PackagingConfig> {
        PackagingConfig::parse(Path::new("c.json"), text)
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    const GOOD: &str = r#"{"primary_shard": "gfx110X-build",
        "architecture_groups": {
          "gfx110X": {"display_name": "RDNA3", "architectures": ["gfx1100", "gfx1101"]},
          "gfx90X": {"architectures": ["gfx90a", "gfx908:xnack-"]}},
        "validation": {"error_on_missing_architecture": true}}"#;

    #[test]
    fn good_config() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.primary_shard, "gfx110X-build");
        assert_eq!(c.architecture_groups.len(), 2);
        assert!(c.validation.error_on_missing_architecture);
        assert!(c.validation.error_on_duplicate_device_code);
        assert!(!c.validation.verify_generic_artifacts_match);
        assert_eq!(c.group_of("gfx90a:xnack+").unwrap().name, "gfx90X");
        assert_eq!(c.group_of("gfx90a:xnack-").unwrap().name, "gfx90X");
        assert_eq!(c.group_of("gfx908:xnack-").unwrap().name, "gfx90X");
        assert!(c.group_of("gfx908:xnack+").is_none());
        assert_eq!(c.group_of("gfx1101").unwrap().name, "gfx110X");
        assert!(c.group_of("gfx1102").is_none());
    }

    /// Groups take whole target IDs: a processor or family wildcard never
    /// takes the strict target of the same ISA unless it is named.
    #[test]
    fn groups_match_whole_target_ids() {
        let c = parse(
            r#"{"primary_shard": "s", "architecture_groups": {
                "gfx125X": {"architectures": ["gfx125X"]},
                "strict": {"architectures": ["gfx1250_strict"]},
                "gfx90X": {"architectures": ["gfx90a"]}}}"#,
        )
        .unwrap();
        assert_eq!(c.group_of("gfx1250").unwrap().name, "gfx125X");
        assert_eq!(c.group_of("gfx1251:xnack+").unwrap().name, "gfx125X");
        assert_eq!(c.group_of("gfx1250-strict").unwrap().name, "strict");
        assert!(c.group_of("gfx12500").is_none());
        assert!(c.group_of("gfx90").is_none());
        let c = parse(
            r#"{"primary_shard": "s", "architecture_groups": {"g": {"architectures": ["gfx1250"]}}}"#,
        )
        .unwrap();
        assert!(c.group_of("gfx1250-strict").is_none());
        assert!(c.group_of("gfx1250_strict").is_none());
    }

    #[test]
    fn validation_options_and_null_display_name() {
        let c = parse(
            r#"{"primary_shard": "s", "validation": {"error_on_duplicate_device_code": false,
                "verify_generic_artifacts_match": true},
                "architecture_groups": {"b": {"architectures": ["gfx942"], "display_name": null},
                                        "a": {"architectures": ["gfx1100", "gfx1100:xnack-"]}}}"#,
        )
        .unwrap();
        assert_eq!(
            c.validation,
            Validation {
                error_on_duplicate_device_code: false,
                verify_generic_artifacts_match: true,
                error_on_missing_architecture: false,
            }
        );
        let names: Vec<&str> = c
            .architecture_groups
            .iter()
            .map(|g| g.name.as_str())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(c.architecture_groups[1].display_name, None);
        assert_eq!(c.architecture_groups[0].architectures.len(), 2);
    }

    /// Each text fails with a message naming the file and containing the
    /// needle.
    fn fails(cases: &[(&str, &str)]) {
        for (text, needle) in cases {
            let e = err(text);
            assert!(e.contains(needle), "{text}: {e}");
            assert!(e.starts_with("c.json: "), "{e}");
        }
    }

    /// Not JSON, not objects, unknown and repeated fields.
    #[test]
    fn shape_errors() {
        fails(&[
            ("", "empty"),
            ("  \n", "empty"),
            ("{", "not valid JSON"),
            ("[]", "packaging config: invalid type: sequence, expected a JSON object"),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}, "validation": {"error_on_missing_architectures": true}}"#,
                "unknown field `error_on_missing_architectures`, expected one of",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": [null, ["gfx1100"]]}}"#,
                "`architecture_groups.g`: invalid type: sequence, expected a JSON object",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}, "validation": [true, false, true]}"#,
                "`validation`: invalid type: sequence, expected a JSON object",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}, "extra": 1}"#,
                "unknown field `extra`, expected one of `primary_shard`, `architecture_groups`, `validation`",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"], "arch": 1}}}"#,
                "unknown field `arch`",
            ),
            (
                r#"{"primary_shard": "a", "primary_shard": "b", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}}"#,
                "duplicate field `primary_shard`",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}} x"#,
                "not valid JSON: trailing characters",
            ),
        ]);
    }

    /// Values of the wrong type, named by their field path, and missing
    /// fields.
    #[test]
    fn type_errors() {
        fails(&[
            (
                r#"{"architecture_groups": {"g": {"architectures": ["gfx1100"]}}}"#,
                "missing field `primary_shard`",
            ),
            (
                r#"{"primary_shard": 3, "architecture_groups": {}}"#,
                "`primary_shard`: invalid type: integer `3`, expected a string",
            ),
            (
                r#"{"primary_shard": "a"}"#,
                "missing field `architecture_groups`",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": []}"#,
                "`architecture_groups`: invalid type: sequence, expected a map",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": "gfx1100"}}}"#,
                "`architecture_groups.g.architectures`: invalid type: string \"gfx1100\", expected a sequence",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": [1100]}}}"#,
                "`architecture_groups.g.architectures[0]`: invalid type: integer `1100`, expected a string",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {}}}"#,
                "missing field `architectures`",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}, "validation": {"error_on_duplicate_device_code": "yes"}}"#,
                "`validation.error_on_duplicate_device_code`: invalid type: string \"yes\", expected a boolean",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"], "display_name": 1}}}"#,
                "`architecture_groups.g.display_name`: invalid type: integer `1`, expected a string",
            ),
        ]);
    }

    /// What `validate` says.
    #[test]
    fn rule_errors() {
        fails(&[
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["sm_80"]}}}"#,
                "`architecture_groups.g.architectures[0]`: \"sm_80\" does not start with \"gfx\"",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {}}"#,
                "`architecture_groups` is empty",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": []}}}"#,
                "architectures` is empty",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}, "h": {"architectures": ["gfx1100"]}}}"#,
                "in groups g and h",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"generic": {"architectures": ["gfx1100"]}}}"#,
                "invalid group name",
            ),
            (
                r#"{"primary_shard": " ", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}}"#,
                "`primary_shard` is empty",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx90a:xnack"]}}}"#,
                "`architecture_groups.g.architectures[0]`: target ID 'gfx90a:xnack'",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"a_b": {"architectures": ["gfx1100"]}}}"#,
                "`architecture_groups.a_b`: invalid group name",
            ),
        ]);
    }
}
