//! Who a wheel is: its `*.dist-info` directory, `Name` and `Version` from
//! `METADATA`, and its first `Tag` from `WHEEL` (formats.md §8.1).

use std::fs;
use std::path::Path;

use super::{Result, WheelError};

/// The identity of the input wheel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub version: String,
    pub python_tag: String,
    pub abi_tag: String,
    pub platform_tag: String,
    /// The existing dist-info directory's name.
    pub dist_info: String,
}

impl Identity {
    /// `<py>-<abi>-<plat>`.
    pub fn tag(&self) -> String {
        format!("{}-{}-{}", self.python_tag, self.abi_tag, self.platform_tag)
    }

    /// The archive group: the name lower-cased, `-` → `_` (`torch`).
    pub fn group(&self) -> String {
        self.name.to_lowercase().replace('-', "_")
    }

    /// A wheel file name for distribution `name` at this version and tag:
    /// `<name with "-" → "_">-<version>-<tag>.whl`.
    pub fn file_name(&self, name: &str) -> String {
        format!(
            "{}-{}-{}.whl",
            name.replace('-', "_"),
            self.version,
            self.tag()
        )
    }

    /// The dist-info directory of distribution `name` at this version.
    pub(crate) fn dist_info_of(&self, name: &str) -> String {
        format!("{}-{}.dist-info", name.replace('-', "_"), self.version)
    }
}

/// Read the identity of the unpacked wheel at `root` (`wheel` names the
/// input in errors).
pub fn read(wheel: &Path, root: &Path) -> Result<Identity> {
    let dist_info = dist_info_dir(wheel, root)?;
    let dir = root.join(&dist_info);
    let metadata = read_text(wheel, &dir, "METADATA")?;
    let field = |name: &str| {
        header(&metadata, name).ok_or_else(|| {
            WheelError::invalid(wheel, format!("{dist_info}/METADATA has no {name} field"))
        })
    };
    let (name, version) = (field("Name")?, field("Version")?);
    let wheel_file = read_text(wheel, &dir, "WHEEL")?;
    let tag = header(&wheel_file, "Tag")
        .ok_or_else(|| WheelError::invalid(wheel, format!("{dist_info}/WHEEL has no Tag field")))?;
    let parts: Vec<&str> = tag.split('-').collect();
    let [py, abi, plat] = parts[..] else {
        return Err(WheelError::invalid(
            wheel,
            format!("{dist_info}/WHEEL: Tag {tag:?} is not <python>-<abi>-<platform>"),
        ));
    };
    Ok(Identity {
        name,
        version,
        python_tag: py.to_string(),
        abi_tag: abi.to_string(),
        platform_tag: plat.to_string(),
        dist_info,
    })
}

/// The one top-level `*.dist-info` directory.
fn dist_info_dir(wheel: &Path, root: &Path) -> Result<String> {
    let mut found = Vec::new();
    for e in fs::read_dir(root).map_err(|e| WheelError::io(root, e))? {
        let e = e.map_err(|e| WheelError::io(root, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".dist-info") && e.path().is_dir() {
            found.push(name);
        }
    }
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(WheelError::invalid(wheel, "no *.dist-info directory")),
        n => Err(WheelError::invalid(
            wheel,
            format!(
                "{n} *.dist-info directories ({}); a wheel has exactly one",
                found.join(", ")
            ),
        )),
    }
}

fn read_text(wheel: &Path, dir: &Path, file: &str) -> Result<String> {
    let path = dir.join(file);
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    match fs::read(&path) {
        Ok(b) => String::from_utf8(b)
            .map_err(|_| WheelError::invalid(wheel, format!("{name}/{file} is not UTF-8"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(WheelError::invalid(wheel, format!("no {name}/{file}")))
        }
        Err(e) => Err(WheelError::io(&path, e)),
    }
}

/// The first value of header `name` (case-insensitive) in the RFC 822
/// header block of `text` (up to the first empty line), trimmed.
pub fn header(text: &str, name: &str) -> Option<String> {
    for line in text.lines() {
        if line.trim().is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case(name) {
                return Some(v.trim().to_string());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers() {
        let t = "Metadata-Version: 2.1\nName: torch\nSummary: x\n  continued\nversion: 2.10.0+rocm7.1\n\nName: body\n";
        assert_eq!(header(t, "Name").as_deref(), Some("torch"));
        assert_eq!(header(t, "Version").as_deref(), Some("2.10.0+rocm7.1"));
        assert_eq!(header(t, "Tag"), None);
        assert_eq!(
            header("Tag: a-b-c\nTag: d-e-f\n", "Tag").as_deref(),
            Some("a-b-c")
        );
    }

    #[test]
    fn reads_identity() {
        let d = tempfile::tempdir().unwrap();
        let w = d.path();
        let di = w.join("Torch_X-1.0+l.dist-info");
        fs::create_dir(&di).unwrap();
        fs::write(di.join("METADATA"), "Name: Torch-X\nVersion: 1.0+l\n").unwrap();
        fs::write(
            di.join("WHEEL"),
            "Wheel-Version: 1.0\nTag: cp313-cp313-linux_x86_64\nTag: cp313-cp313-other\n",
        )
        .unwrap();
        let id = read(w, w).unwrap();
        assert_eq!(id.group(), "torch_x");
        assert_eq!(id.tag(), "cp313-cp313-linux_x86_64");
        assert_eq!(
            id.file_name("amd-torch-device-gfx942"),
            "amd_torch_device_gfx942-1.0+l-cp313-cp313-linux_x86_64.whl"
        );
        fs::write(di.join("WHEEL"), "Tag: cp313-linux\n").unwrap();
        let e = read(w, w).unwrap_err().to_string();
        assert!(e.contains("is not <python>-<abi>-<platform>"), "{e}");
        fs::create_dir(w.join("other-1.dist-info")).unwrap();
        let e = read(w, w).unwrap_err().to_string();
        assert!(e.contains("2 *.dist-info directories"), "{e}");
    }
}
