//! Artifact manifests (`artifact_manifest.txt`: one install prefix per line)
//! and artifact directory names.

use std::fs;
use std::path::{Path, PathBuf};

use crate::target::TargetId;
use crate::{ArtifactError, Result};

/// The manifest's file name in an artifact directory.
pub const MANIFEST: &str = "artifact_manifest.txt";

/// The family suffix of generic artifacts.
pub const GENERIC: &str = "generic";

/// Read and check an artifact's manifest: its prefixes, normalized (no
/// `.` components, no trailing `/`), in file order, without duplicates.
///
/// A prefix must be a relative path inside the artifact: absolute paths,
/// `..` components and the artifact root itself are rejected, and so are
/// prefixes nested in one another (their files would be taken twice).
pub(crate) fn read_manifest(artifact_dir: &Path) -> Result<Vec<String>> {
    let path = artifact_dir.join(MANIFEST);
    let text = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ArtifactError::MissingManifest {
                dir: artifact_dir.to_path_buf(),
            })
        }
        Err(e) => return Err(ArtifactError::io(&path, e)),
    };
    let text = String::from_utf8(text)
        .map_err(|_| ArtifactError::input(&path, "manifest is not valid UTF-8"))?;
    parse_manifest(&path, &text)
}

/// [`read_manifest`] of a manifest's text (`path` is for messages).
pub(crate) fn parse_manifest(path: &Path, text: &str) -> Result<Vec<String>> {
    let mut prefixes: Vec<String> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |reason: &str| ArtifactError::BadManifestLine {
            manifest: path.to_path_buf(),
            line: i + 1,
            prefix: line.to_string(),
            reason: reason.to_string(),
        };
        if line.starts_with('/') || line.starts_with('\\') || line.contains(":\\") {
            return Err(bad(
                "is absolute: prefixes must be relative to the artifact",
            ));
        }
        let mut parts = Vec::new();
        for c in line.split('/') {
            match c {
                "" | "." => {}
                ".." => return Err(bad("escapes the artifact (`..`)")),
                c => parts.push(c),
            }
        }
        if parts.is_empty() {
            return Err(bad("names the artifact root, not a prefix directory"));
        }
        let p = parts.join("/");
        if p == MANIFEST {
            return Err(bad("names the manifest itself"));
        }
        if prefixes.contains(&p) {
            continue;
        }
        if let Some(other) = prefixes.iter().find(|o| nested(o, &p) || nested(&p, o)) {
            return Err(bad(&format!(
                "overlaps prefix {other:?}: prefixes must not nest"
            )));
        }
        prefixes.push(p);
    }
    Ok(prefixes)
}

/// Is `inner` inside `outer` (both normalized)?
fn nested(outer: &str, inner: &str) -> bool {
    inner
        .strip_prefix(outer)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// The manifest text for these prefixes (one per line, newline-terminated).
pub(crate) fn manifest_text(prefixes: &[String]) -> String {
    prefixes.iter().map(|p| format!("{p}\n")).collect()
}

/// Write a manifest into `dir`.
pub(crate) fn write_manifest(dir: &Path, prefixes: &[String]) -> Result<()> {
    let path = dir.join(MANIFEST);
    fs::write(&path, manifest_text(prefixes)).map_err(|e| ArtifactError::io(&path, e))
}

/// The artifact prefix of an artifact directory name: the name without its
/// last `_` part (`blas_lib_gfx110X-dgpu` → `blas_lib`).
pub fn artifact_prefix(dir_name: &str) -> Option<&str> {
    match dir_name.rsplit_once('_') {
        Some((prefix, family)) if !prefix.is_empty() && !family.is_empty() => Some(prefix),
        _ => None,
    }
}

/// The prefix of the artifact in `dir`: `given`, or the directory's name
/// without its last `_` part ([`artifact_prefix`]).
pub fn split_prefix(dir: &Path, given: Option<&str>) -> Result<String> {
    if let Some(p) = given {
        return Ok(p.to_string());
    }
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    match artifact_prefix(&name) {
        Some(p) => Ok(p.to_string()),
        None => Err(ArtifactError::input(
            dir,
            "cannot derive the artifact prefix from the directory name: pass --artifact-prefix",
        )),
    }
}

/// The name of a split or recombined output artifact: `<component>_generic`,
/// or `<component>_<suffix>` where the suffix is a target ID (split) or an
/// architecture group (recombine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputName {
    pub component: String,
    pub suffix: Suffix,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Suffix {
    Generic,
    /// A target ID (`gfx1100`, `gfx90a:xnack-`, `gfx1250-strict`,
    /// `amdgcnspirv`) or a database family key (`gfx12_0`).
    Target(String),
    /// Anything else (a group name, when a packaging config says so).
    Other(String),
}

impl OutputName {
    pub fn parse(name: &str) -> Option<OutputName> {
        // A family key has a `_` of its own (`aotriton_lib_gfx12_0`).
        if let Some((component, key)) = name
            .rmatch_indices("_gfx")
            .map(|(i, _)| (&name[..i], &name[i + 1..]))
            .find(|(c, key)| !c.is_empty() && crate::databases::is_family_key(key))
        {
            return Some(OutputName {
                component: component.to_string(),
                suffix: Suffix::Target(key.to_string()),
            });
        }
        let (component, suffix) = name.rsplit_once('_')?;
        if component.is_empty() || suffix.is_empty() {
            return None;
        }
        let suffix = if suffix == GENERIC {
            Suffix::Generic
        } else if TargetId::parse(suffix).is_ok()
            && !suffix.starts_with(crate::target::AGENT_ISA_PREFIX)
        {
            Suffix::Target(suffix.to_string())
        } else {
            Suffix::Other(suffix.to_string())
        };
        Some(OutputName {
            component: component.to_string(),
            suffix,
        })
    }
}

/// `<component>_generic`.
pub(crate) fn generic_name(component: &str) -> String {
    format!("{component}_{GENERIC}")
}

/// Subdirectories of `dir`, sorted by name, without hidden ones (staging
/// directories start with `.`).
pub(crate) fn subdirs(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| ArtifactError::io(dir, e))? {
        let e = e.map_err(|e| ArtifactError::io(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let ty = e
            .file_type()
            .map_err(|err| ArtifactError::io(e.path(), err))?;
        if ty.is_dir() {
            out.push((name, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<String>> {
        parse_manifest(Path::new("m.txt"), text)
    }

    #[test]
    fn manifests_parse_and_normalize() {
        assert_eq!(
            parse(
                "math-libs/BLAS/rocBLAS/stage\n\n./kpack/stage/\r\nmath-libs/BLAS/rocBLAS/stage\n"
            )
            .unwrap(),
            vec!["math-libs/BLAS/rocBLAS/stage", "kpack/stage"]
        );
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn manifests_reject_escapes() {
        for (text, needle) in [
            ("../x\n", "escapes"),
            ("a/../../x\n", "escapes"),
            ("/abs/stage\n", "absolute"),
            (".\n", "artifact root"),
            ("a/stage\na/stage/lib\n", "nest"),
            ("a/stage/lib\na/stage\n", "nest"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(e.contains("line"), "{e}");
        }
    }

    #[test]
    fn names() {
        assert_eq!(artifact_prefix("blas_lib_gfx110X-dgpu"), Some("blas_lib"));
        assert_eq!(artifact_prefix("base_lib_generic"), Some("base_lib"));
        assert_eq!(artifact_prefix("nounderscore"), None);
        assert_eq!(artifact_prefix("_x"), None);
        let n = OutputName::parse("blas_lib_gfx90a:xnack-").unwrap();
        assert_eq!(n.component, "blas_lib");
        assert_eq!(n.suffix, Suffix::Target("gfx90a:xnack-".into()));
        assert_eq!(
            OutputName::parse("blas_lib_generic").unwrap().suffix,
            Suffix::Generic
        );
        assert_eq!(
            OutputName::parse("blas_lib_gfx110X").unwrap().suffix,
            Suffix::Other("gfx110X".into())
        );
        for (name, component, key) in [
            ("blas_lib_gfx1250-strict", "blas_lib", "gfx1250-strict"),
            ("blas_lib_amdgcnspirv", "blas_lib", "amdgcnspirv"),
            ("aotriton_lib_gfx12_0", "aotriton_lib", "gfx12_0"),
            ("aotriton_lib_gfx11", "aotriton_lib", "gfx11"),
            ("a_gfx1_gfx12_0", "a_gfx1", "gfx12_0"),
        ] {
            let n = OutputName::parse(name).unwrap();
            assert_eq!(n.component, component, "{name}");
            assert_eq!(n.suffix, Suffix::Target(key.into()), "{name}");
        }
        assert_eq!(
            OutputName::parse("_gfx12_0").unwrap().suffix,
            Suffix::Other("0".into())
        );
    }
}
