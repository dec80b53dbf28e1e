//! The packaging config of recombine (SPEC §5):
//!
//! ```json
//! {"primary_shard": "gfx110X-build",
//!  "architecture_groups": {"gfx110X": {"display_name": "...", "architectures": ["gfx1100", "gfx1101"]}},
//!  "validation": {"error_on_duplicate_device_code": true,
//!                 "verify_generic_artifacts_match": false,
//!                 "error_on_missing_architecture": false}}
//! ```
//!
//! Parsing checks every field and says which one is wrong and why; unknown
//! keys are errors too (a misspelt validation option would otherwise be
//! silently off).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::manifest::GENERIC;
use super::{ArtifactError, Result};
use crate::target::TargetId;

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
    /// Processors (`gfx90a`: every feature variant of it) or full target
    /// IDs (`gfx90a:xnack-`: exactly that one).
    pub architectures: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
    /// Does `target` (a target ID) belong to this group?
    pub fn contains(&self, target: &str) -> bool {
        let Ok(t) = TargetId::parse(target) else {
            return false;
        };
        self.architectures.iter().any(|a| arch_matches(a, &t))
    }
}

/// `arch` (a processor or a full target ID) takes `target`.
pub fn arch_matches(arch: &str, target: &TargetId) -> bool {
    match TargetId::parse(arch) {
        Ok(a) if a.features().is_empty() => a.processor() == target.processor(),
        Ok(a) => a == *target,
        Err(_) => false,
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
        if text.trim().is_empty() {
            return Err(err("packaging config is empty".into()));
        }
        let v: Value = serde_json::from_str(text)
            .map_err(|e| err(format!("packaging config is not valid JSON: {e}")))?;
        let Value::Object(top) = &v else {
            return Err(err(format!(
                "packaging config must be a JSON object, found {}",
                kind(&v)
            )));
        };
        for k in top.keys() {
            if !["primary_shard", "architecture_groups", "validation"].contains(&k.as_str()) {
                return Err(err(format!(
                    "unknown field `{k}` (known: primary_shard, architecture_groups, validation)"
                )));
            }
        }
        let primary_shard = match top.get("primary_shard") {
            None => return Err(err("missing field `primary_shard`".into())),
            Some(Value::String(s)) if s.trim().is_empty() => {
                return Err(err("`primary_shard` is empty".into()))
            }
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(err(format!(
                    "`primary_shard` must be a string, found {}",
                    kind(other)
                )))
            }
        };
        let groups = match top.get("architecture_groups") {
            None => return Err(err("missing field `architecture_groups`".into())),
            Some(Value::Object(m)) if m.is_empty() => {
                return Err(err(
                    "`architecture_groups` is empty: at least one group is needed".into(),
                ))
            }
            Some(Value::Object(m)) => m,
            Some(other) => {
                return Err(err(format!(
                    "`architecture_groups` must be an object (group name -> group), found {}",
                    kind(other)
                )))
            }
        };
        let mut architecture_groups = Vec::new();
        for (name, g) in groups {
            let field = format!("architecture_groups.{name}");
            if name.is_empty()
                || name == GENERIC
                || name.contains(['/', '\\', '_'])
                || name.starts_with('.')
                || name.chars().any(char::is_whitespace)
            {
                return Err(err(format!(
                    "`{field}`: invalid group name {name:?} (artifacts are named <component>_<group>: no `/`, `_`, spaces, leading `.`, and not \"generic\")"
                )));
            }
            let Value::Object(g) = g else {
                return Err(err(format!(
                    "`{field}` must be an object, found {}",
                    kind(g)
                )));
            };
            for k in g.keys() {
                if !["display_name", "architectures"].contains(&k.as_str()) {
                    return Err(err(format!(
                        "`{field}`: unknown field `{k}` (known: display_name, architectures)"
                    )));
                }
            }
            let display_name = match g.get("display_name") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(other) => {
                    return Err(err(format!(
                        "`{field}.display_name` must be a string, found {}",
                        kind(other)
                    )))
                }
            };
            let archs = match g.get("architectures") {
                None => return Err(err(format!("`{field}`: missing field `architectures`"))),
                Some(Value::Array(a)) if a.is_empty() => {
                    return Err(err(format!("`{field}.architectures` is empty")))
                }
                Some(Value::Array(a)) => a,
                Some(other) => {
                    return Err(err(format!(
                        "`{field}.architectures` must be an array of strings, found {}",
                        kind(other)
                    )))
                }
            };
            let mut architectures = Vec::new();
            for (i, a) in archs.iter().enumerate() {
                let f = format!("{field}.architectures[{i}]");
                let Value::String(a) = a else {
                    return Err(err(format!("`{f}` must be a string, found {}", kind(a))));
                };
                if !a.starts_with("gfx") {
                    return Err(err(format!(
                        "`{f}`: {a:?} does not start with \"gfx\" (an AMDGPU processor such as gfx1100)"
                    )));
                }
                if let Err(e) = TargetId::parse(a) {
                    return Err(err(format!("`{f}`: {e}")));
                }
                architectures.push(a.clone());
            }
            architecture_groups.push(ArchitectureGroup {
                name: name.clone(),
                display_name,
                architectures,
            });
        }
        // No processor in two groups: membership must be unambiguous.
        let mut owners: Vec<(String, &str)> = Vec::new();
        for g in &architecture_groups {
            for a in &g.architectures {
                let p = TargetId::parse(a).expect("checked").processor().to_string();
                if let Some((_, other)) = owners.iter().find(|(q, o)| *q == p && *o != g.name) {
                    return Err(err(format!(
                        "processor {p} is in groups {other} and {}: a target must belong to one group",
                        g.name
                    )));
                }
                owners.push((p, &g.name));
            }
        }
        let mut validation = Validation::default();
        match top.get("validation") {
            None => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    let slot = match k.as_str() {
                        "error_on_duplicate_device_code" => &mut validation.error_on_duplicate_device_code,
                        "verify_generic_artifacts_match" => &mut validation.verify_generic_artifacts_match,
                        "error_on_missing_architecture" => &mut validation.error_on_missing_architecture,
                        _ => {
                            return Err(err(format!(
                                "`validation`: unknown option `{k}` (known: error_on_duplicate_device_code, verify_generic_artifacts_match, error_on_missing_architecture)"
                            )))
                        }
                    };
                    match v {
                        Value::Bool(b) => *slot = *b,
                        other => {
                            return Err(err(format!(
                                "`validation.{k}` must be true or false, found {}",
                                kind(other)
                            )))
                        }
                    }
                }
            }
            Some(other) => {
                return Err(err(format!(
                    "`validation` must be an object, found {}",
                    kind(other)
                )))
            }
        }
        Ok(PackagingConfig {
            primary_shard,
            architecture_groups,
            validation,
        })
    }

    /// The group `target` belongs to.
    pub fn group_of(&self, target: &str) -> Option<&ArchitectureGroup> {
        self.architecture_groups.iter().find(|g| g.contains(target))
    }

    pub fn group(&self, name: &str) -> Option<&ArchitectureGroup> {
        self.architecture_groups.iter().find(|g| g.name == name)
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
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

    #[test]
    fn bad_configs() {
        for (text, needle) in [
            ("", "empty"),
            ("  \n", "empty"),
            ("{", "not valid JSON"),
            ("[]", "must be a JSON object"),
            (
                r#"{"architecture_groups": {"g": {"architectures": ["gfx1100"]}}}"#,
                "missing field `primary_shard`",
            ),
            (
                r#"{"primary_shard": 3, "architecture_groups": {}}"#,
                "`primary_shard` must be a string, found a number",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {}}"#,
                "`architecture_groups` is empty",
            ),
            (
                r#"{"primary_shard": "a"}"#,
                "missing field `architecture_groups`",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": []}"#,
                "must be an object",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["sm_80"]}}}"#,
                "`architecture_groups.g.architectures[0]`: \"sm_80\" does not start with \"gfx\"",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": "gfx1100"}}}"#,
                "must be an array of strings, found a string",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": [1100]}}}"#,
                "`architecture_groups.g.architectures[0]` must be a string, found a number",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": []}}}"#,
                "architectures` is empty",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {}}}"#,
                "missing field `architectures`",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}, "validation": {"error_on_duplicate_device_code": "yes"}}"#,
                "must be true or false, found a string",
            ),
            (
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}, "validation": {"error_on_missing_architectures": true}}"#,
                "unknown option",
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
                r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"], "display_name": 1}}}"#,
                "display_name` must be a string",
            ),
        ] {
            let e = err(text);
            assert!(e.contains(needle), "{text}: {e}");
            assert!(e.starts_with("c.json: "), "{e}");
        }
    }
}
