//! The GPUs of this machine, without ROCm: the kernel driver's topology,
//! `<root>/class/kfd/kfd/topology/nodes/<N>/properties` (`root` is `/sys`
//! but for tests and containers), one `name value` per line. A node's
//! `gfx_target_version` names its processor (0: a CPU node), its
//! `capability` says whether SRAM ECC is on; `HSA_XNACK=1` turns XNACK on,
//! as ROCr reads it.

use std::path::{Path, PathBuf};

use crate::{ArtifactError, Result};
use kpack_format::processors::{device_target, processor_of_version, CAP_SRAM_EDC};

/// Where sysfs is, unless told otherwise (`--sysfs-root`).
pub const SYSFS_ROOT: &str = "/sys";

/// Where the nodes are, below the sysfs root.
pub const NODES: &str = "class/kfd/kfd/topology/nodes";

/// The targets to check for and where they came from: `given` (`--arch`)
/// when there are any, else this machine's GPUs below `sysfs_root`
/// (`detected in <nodes>`). No GPU, or a topology that does not read, is
/// [`ArtifactError::NothingToCheck`].
pub fn choose_targets(given: &[String], sysfs_root: &Path) -> Result<(Vec<String>, String)> {
    if !given.is_empty() {
        return Ok((given.to_vec(), "--arch".into()));
    }
    let nodes = sysfs_root.join(NODES);
    let found = detect_targets(sysfs_root, xnack_from_env()).map_err(|e| {
        ArtifactError::NothingToCheck {
            reason: kpack_host::report(&e),
        }
    })?;
    if found.is_empty() {
        return Err(ArtifactError::NothingToCheck {
            reason: format!(
                "no GPU found: {} lists no GPU node (no amdgpu kernel driver, or a container without /sys); give the targets with --arch, e.g. --arch gfx942:sramecc+:xnack-",
                nodes.display()
            ),
        });
    }
    Ok((found, format!("detected in {}", nodes.display())))
}

/// The target ID of each GPU node below `sysfs_root` (as ROCr reports it:
/// `gfx942:sramecc+:xnack-`), in node order, each once; empty when there is
/// no KFD topology or no GPU node. `xnack`: `HSA_XNACK=1`.
pub fn detect_targets(sysfs_root: &Path, xnack: bool) -> Result<Vec<String>> {
    let dir = sysfs_root.join(NODES);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let mut nodes: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    nodes.sort();
    let mut out: Vec<String> = Vec::new();
    for (_, node) in nodes {
        if let Some(t) = node_target(&node.join("properties"), xnack)? {
            if !out.contains(&t) {
                out.push(t);
            }
        }
    }
    Ok(out)
}

/// The target of one node's `properties` file; `None` for a CPU node.
fn node_target(properties: &Path, xnack: bool) -> Result<Option<String>> {
    let text = match std::fs::read_to_string(properties) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ArtifactError::io(properties, e)),
    };
    let value = |key: &str| -> Result<Option<u64>> {
        let Some(v) = text.lines().find_map(|l| {
            let (k, v) = l.split_once(char::is_whitespace)?;
            (k == key).then(|| v.trim())
        }) else {
            return Ok(None);
        };
        parse_number(v)
            .map(Some)
            .ok_or_else(|| ArtifactError::input(properties, format!("{key} {v:?} is not a number")))
    };
    let version = value("gfx_target_version")?.unwrap_or(0);
    let Some(processor) = processor_of_version(version) else {
        return Ok(None);
    };
    let capability = value("capability")?.unwrap_or(0);
    let ecc = capability & CAP_SRAM_EDC != 0;
    Ok(Some(device_target(&processor, ecc, xnack)))
}

/// A decimal number, or `0x` hexadecimal.
fn parse_number(v: &str) -> Option<u64> {
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Whether `HSA_XNACK` turns XNACK on (`1`), as ROCr reads it.
pub fn xnack_from_env() -> bool {
    std::env::var("HSA_XNACK").is_ok_and(|v| v.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(root: &Path, n: usize, props: &str) {
        let d = root.join(NODES).join(n.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("properties"), props).unwrap();
    }

    #[test]
    fn reads_gpu_nodes_and_skips_cpus() {
        let t = tempfile::tempdir().unwrap();
        assert!(detect_targets(t.path(), false).unwrap().is_empty());
        node(
            t.path(),
            0,
            "cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\n",
        );
        node(
            t.path(),
            1,
            "simd_count 304\ngfx_target_version 90402\ncapability 67109120\n",
        );
        node(
            t.path(),
            2,
            "gfx_target_version 90402\ncapability 67109120\n",
        );
        node(t.path(), 10, "gfx_target_version 110501\ncapability 0\n");
        node(t.path(), 3, "gfx_target_version 90010\ncapability 0x0\n");
        let got = detect_targets(t.path(), false).unwrap();
        assert_eq!(
            got,
            [
                "gfx942:sramecc+:xnack-",
                "gfx90a:sramecc-:xnack-",
                "gfx1151"
            ]
        );
        let got = detect_targets(t.path(), true).unwrap();
        assert_eq!(got[0], "gfx942:sramecc+:xnack+");
        node(t.path(), 4, "gfx_target_version lots\n");
        let err = detect_targets(t.path(), false).unwrap_err().to_string();
        assert!(
            err.contains("4/properties") && err.contains("not a number"),
            "{err}"
        );
    }
}
