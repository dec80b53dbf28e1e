//! Kernel-database handlers (SPEC §5): files that hold device code for one
//! target outside any fat binary (rocBLAS/hipBLASLt Tensile libraries,
//! AOTriton images, MIOpen models, hipKernelProvider content). Split moves
//! each into the artifact of its target, at its original relative path.
//!
//! Handlers look at the path only (relative to the install prefix, `/`
//! separated), never at the bytes.

use std::fmt;

use serde::Serialize;

use super::{ArtifactError, Result};
use crate::target::TargetId;

/// One database handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Database {
    /// `.../rocblas/library/*.{co,hsaco,dat}`, target from the file name.
    Rocblas,
    /// `.../hipblaslt/library/*.{co,hsaco,dat}`, target from the file name.
    Hipblaslt,
    /// `.../aotriton/kernels/<target>/...`.
    Aotriton,
    /// `.../miopen/db/*.model` with a target in the file name.
    Miopen,
    /// `.../engines/arch_content/<engine>/<target>/...`.
    HipKernelProvider,
}

/// What a handler says about a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Not a file of this database.
    No,
    /// A database file without a target in its name: it stays generic.
    Generic,
    /// A database file of this target.
    Target(String),
}

impl Database {
    /// Every handler, in the order they are consulted.
    pub const ALL: [Database; 5] = [
        Database::Rocblas,
        Database::Hipblaslt,
        Database::Aotriton,
        Database::Miopen,
        Database::HipKernelProvider,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Database::Rocblas => "rocblas",
            Database::Hipblaslt => "hipblaslt",
            Database::Aotriton => "aotriton",
            Database::Miopen => "miopen",
            Database::HipKernelProvider => "hipkernelprovider",
        }
    }

    pub fn names() -> Vec<&'static str> {
        Database::ALL.iter().map(|d| d.name()).collect()
    }

    pub fn from_name(name: &str) -> Result<Database> {
        Database::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| ArtifactError::UnknownDatabase {
                name: name.to_string(),
            })
    }

    /// Parse a list of handler names (as given on the command line) into a
    /// sorted, deduplicated list, so that the first handler to claim a file
    /// does not depend on the order of the flags.
    pub fn parse_list<S: AsRef<str>>(names: &[S]) -> Result<Vec<Database>> {
        let mut v = names
            .iter()
            .map(|n| Database::from_name(n.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        v.sort();
        v.dedup();
        Ok(v)
    }

    /// What this handler says about the file at `rel` (relative to its
    /// install prefix, `/`-separated).
    pub fn claim(self, rel: &str) -> Claim {
        let comps: Vec<&str> = rel.split('/').collect();
        let Some((&name, dirs)) = comps.split_last() else {
            return Claim::No;
        };
        match self {
            Database::Rocblas | Database::Hipblaslt => {
                let lib = if self == Database::Rocblas {
                    "rocblas"
                } else {
                    "hipblaslt"
                };
                let in_library = dirs.windows(2).any(|w| w[0] == lib && w[1] == "library");
                let suffix_ok = [".co", ".hsaco", ".dat"].iter().any(|s| name.ends_with(s));
                if !in_library || !suffix_ok {
                    return Claim::No;
                }
                match target_in_name(name) {
                    Some(t) => Claim::Target(t),
                    None => Claim::Generic,
                }
            }
            Database::Miopen => {
                let in_db = dirs.windows(2).any(|w| w[0] == "miopen" && w[1] == "db");
                if !in_db || !name.ends_with(".model") {
                    return Claim::No;
                }
                match target_in_name(name) {
                    Some(t) => Claim::Target(t),
                    None => Claim::No,
                }
            }
            Database::Aotriton => dir_target(dirs, &["aotriton", "kernels"], 0),
            Database::HipKernelProvider => dir_target(dirs, &["engines", "arch_content"], 1),
        }
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The first handler of `enabled` that claims the file at `rel`.
pub fn classify(enabled: &[Database], rel: &str) -> Option<(Database, Claim)> {
    enabled.iter().find_map(|&d| match d.claim(rel) {
        Claim::No => None,
        c => Some((d, c)),
    })
}

/// `dirs` contains `anchor` followed by `skip` more directories and then a
/// target directory (with the file somewhere below it).
fn dir_target(dirs: &[&str], anchor: &[&str], skip: usize) -> Claim {
    let n = anchor.len();
    for i in 0..dirs.len() {
        if dirs[i..].starts_with(anchor) {
            if let Some(t) = dirs.get(i + n + skip) {
                if let Ok(id) = TargetId::parse(t) {
                    if t.starts_with("gfx") {
                        return Claim::Target(id.to_string());
                    }
                }
            }
        }
    }
    Claim::No
}

/// The target named in a file name: the last `gfx<digits>[a-z]*`, with
/// `xnack`/`sramecc` settings that follow it (`-xnack+`, `:xnack-`,
/// `_sramecc+`) kept as features: `Kernels.so-000-gfx90a-xnack+.hsaco` →
/// `gfx90a:xnack+`.
pub fn target_in_name(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let mut found = None;
    let mut i = 0;
    while let Some(pos) = name[i..].find("gfx") {
        let start = i + pos;
        let mut j = start + 3;
        let digits = j;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j > digits {
            while j < b.len() && b[j].is_ascii_lowercase() {
                j += 1;
            }
            let mut target = name[start..j].to_string();
            // Features.
            loop {
                if j < b.len() && matches!(b[j], b'-' | b':' | b'_') {
                    let rest = &name[j + 1..];
                    let feature = ["xnack", "sramecc"].into_iter().find(|f| {
                        rest.starts_with(f)
                            && matches!(rest.as_bytes().get(f.len()), Some(b'+' | b'-'))
                    });
                    if let Some(f) = feature {
                        let sign = rest.as_bytes()[f.len()] as char;
                        target.push_str(&format!(":{f}{sign}"));
                        j += 1 + f.len() + 1;
                        continue;
                    }
                }
                break;
            }
            if let Ok(id) = TargetId::parse(&target) {
                found = Some(id.to_string());
            }
        }
        i = start + 3;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_in_names() {
        let t = |s| target_in_name(s);
        assert_eq!(
            t("TensileLibrary_Type_HH_gfx1100.dat").as_deref(),
            Some("gfx1100")
        );
        assert_eq!(
            t("Kernels.so-000-gfx90a-xnack+.hsaco").as_deref(),
            Some("gfx90a:xnack+")
        );
        assert_eq!(
            t("Kernels.so-000-gfx942:xnack-:sramecc+.hsaco").as_deref(),
            Some("gfx942:sramecc+:xnack-")
        );
        assert_eq!(t("gfx90a.tn.model").as_deref(), Some("gfx90a"));
        assert_eq!(t("TensileLibrary_fallback.dat"), None);
        assert_eq!(t("gfx_x.dat"), None);
        assert_eq!(t("a_gfx900_b_gfx1201.co").as_deref(), Some("gfx1201"));
    }

    #[test]
    fn handlers() {
        use Claim::*;
        let r = Database::Rocblas;
        assert_eq!(
            r.claim("lib/rocblas/library/TensileLibrary_gfx1100.co"),
            Target("gfx1100".into())
        );
        assert_eq!(
            r.claim("lib/rocblas/library/TensileLibrary_fallback.dat"),
            Generic
        );
        assert_eq!(r.claim("lib/rocblas/library/TensileManifest.txt"), No);
        assert_eq!(r.claim("lib/myrocblas/library/x_gfx1100.co"), No);
        assert_eq!(r.claim("lib/hipblaslt/library/x_gfx1100.co"), No);
        assert_eq!(
            Database::Hipblaslt.claim("lib/hipblaslt/library/extop_gfx942.co"),
            Target("gfx942".into())
        );
        assert_eq!(
            Database::Aotriton.claim("lib/aotriton/kernels/gfx942/flash/a.hsaco"),
            Target("gfx942".into())
        );
        assert_eq!(
            Database::Aotriton.claim("lib/aotriton/kernels/common.json"),
            No
        );
        assert_eq!(
            Database::Miopen.claim("share/miopen/db/gfx90a.tn.model"),
            Target("gfx90a".into())
        );
        assert_eq!(Database::Miopen.claim("share/miopen/db/gfx90a.kdb"), No);
        assert_eq!(
            Database::HipKernelProvider.claim("lib/engines/arch_content/gemm/gfx1201/k.co"),
            Target("gfx1201".into())
        );
        assert_eq!(
            Database::HipKernelProvider.claim("lib/engines/arch_content/gfx1201/k.co"),
            No
        );
    }

    #[test]
    fn lists() {
        assert_eq!(
            Database::parse_list(&["hipblaslt", "rocblas", "rocblas"]).unwrap(),
            vec![Database::Rocblas, Database::Hipblaslt]
        );
        let e = Database::parse_list(&["tensile"]).unwrap_err().to_string();
        assert!(e.contains("unknown database handler \"tensile\""), "{e}");
        assert!(e.contains("rocblas, hipblaslt, aotriton, miopen, hipkernelprovider"));
        assert_eq!(
            classify(&[Database::Rocblas], "lib/rocblas/library/a_gfx1100.dat"),
            Some((Database::Rocblas, Claim::Target("gfx1100".into())))
        );
    }
}
