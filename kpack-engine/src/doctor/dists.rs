//! The Python distributions installed where doctor looks (`*.dist-info`
//! directories of a `site-packages`): which one owns a file (its RECORD)
//! and which device extras it offers (its METADATA's `Provides-Extra:
//! device-<gfx>` and the `Requires-Dist: <device dist> ...; extra ==
//! "device-<gfx>"` lines), so that a missing archive becomes `pip install
//! "torch[device-gfx1151]"`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

/// One installed distribution.
#[derive(Debug, Clone, Default)]
pub struct Dist {
    /// `Name:` as METADATA spells it.
    pub name: String,
    /// `Provides-Extra:` values, and the distributions each requires.
    pub extras: BTreeMap<String, Vec<String>>,
}

/// The distributions of every site directory found, and who owns what.
#[derive(Debug, Default)]
pub struct Dists {
    pub dists: Vec<Dist>,
    /// A file (absolute, normalized) → the distribution whose RECORD lists it.
    owner: HashMap<PathBuf, usize>,
}

impl Dists {
    /// Read the `*.dist-info` directories of `dirs` (each a site
    /// directory, its RECORD paths relative to it). Unreadable or
    /// malformed dist-infos are skipped: they only help with fixes.
    pub fn read(dirs: &[PathBuf]) -> Dists {
        let mut d = Dists::default();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut infos: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "dist-info") && p.is_dir())
                .collect();
            infos.sort();
            for info in infos {
                d.add(dir, &info);
            }
        }
        d
    }

    fn add(&mut self, site: &Path, info: &Path) {
        let Ok(metadata) = std::fs::read_to_string(info.join("METADATA")) else {
            return;
        };
        let dist = parse_metadata(&metadata);
        if dist.name.is_empty() {
            return;
        }
        let i = self.dists.len();
        self.dists.push(dist);
        let record = std::fs::read_to_string(info.join("RECORD")).unwrap_or_default();
        for line in record.lines() {
            if let Some(rel) = record_path(line) {
                self.owner.insert(lexical(&site.join(rel)), i);
            }
        }
    }

    /// The distribution whose RECORD lists `path`.
    pub fn owner(&self, path: &Path) -> Option<&Dist> {
        self.owner.get(&lexical(path)).map(|&i| &self.dists[i])
    }
}

/// The site directories of `paths`: each path (or, for a file, its
/// directory) and its ancestors that hold a `*.dist-info` directory.
pub fn site_dirs(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        let start = if p.is_dir() {
            p.as_path()
        } else {
            p.parent().unwrap_or(p)
        };
        for dir in start.ancestors() {
            if has_dist_info(dir) && !out.iter().any(|d| d == dir) {
                out.push(dir.to_path_buf());
            }
        }
    }
    out
}

fn has_dist_info(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().ends_with(".dist-info"))
    })
}

/// The path of a RECORD line (`path,hash,size`; a path with a comma is
/// quoted).
fn record_path(line: &str) -> Option<&str> {
    let path = match line.strip_prefix('"') {
        Some(rest) => rest.split_once('"')?.0,
        None => line.split(',').next()?,
    };
    (!path.is_empty()).then_some(path)
}

/// `Name`, `Provides-Extra` and the extras' `Requires-Dist` of METADATA's
/// header.
fn parse_metadata(text: &str) -> Dist {
    let mut d = Dist::default();
    for line in text.lines().take_while(|l| !l.is_empty()) {
        if let Some(v) = line.strip_prefix("Name:") {
            d.name = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("Provides-Extra:") {
            d.extras.entry(v.trim().to_string()).or_default();
        } else if let Some(v) = line.strip_prefix("Requires-Dist:") {
            if let Some((name, extra)) = extra_requirement(v) {
                d.extras.entry(extra).or_default().push(name);
            }
        }
    }
    d
}

/// `name ...; extra == "x"`: the required distribution's name and `x`.
fn extra_requirement(req: &str) -> Option<(String, String)> {
    let (spec, marker) = req.split_once(';')?;
    let (_, rest) = marker.split_once("extra")?;
    let rest = rest.trim_start().strip_prefix("==")?.trim();
    let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let extra = rest[1..].split(quote).next()?.to_string();
    let name: String = spec
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    (!name.is_empty()).then_some((name, extra))
}

/// `path` made absolute, `.` and `..` resolved without the file system.
pub fn lexical(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_extras_and_their_requirements() {
        let d = parse_metadata(
            "Metadata-Version: 2.4\nName: torch\nVersion: 2.10\n\
             Requires-Dist: rocm-bootstrap >= 0.3.0\n\
             Provides-Extra: device-gfx1100\n\
             Requires-Dist: amd-torch-device-gfx1100 == 2.10; extra == \"device-gfx1100\"\n\
             Requires-Dist: amd_torch_device_gfx11 == 2.10 ; extra=='device-gfx1100'\n\
             Provides-Extra: device-all\n\nBody: no\n",
        );
        assert_eq!(d.name, "torch");
        assert_eq!(
            d.extras["device-gfx1100"],
            ["amd-torch-device-gfx1100", "amd_torch_device_gfx11"]
        );
        assert!(d.extras["device-all"].is_empty());
        assert!(!d.extras.contains_key("Body"));
        assert_eq!(record_path("\"a,b.so\",sha256=x,3"), Some("a,b.so"));
        assert_eq!(record_path("torch/x.so,sha256=x,3"), Some("torch/x.so"));
        assert_eq!(lexical(Path::new("/a/b/../c/./d")), PathBuf::from("/a/c/d"));
    }
}
