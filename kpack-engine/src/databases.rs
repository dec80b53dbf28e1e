//! Kernel-database handlers (formats.md §7): files that hold
//! device code (or data) for one target outside any fat binary. Split
//! moves each into the artifact of its target's [`base_arch`], at its
//! original relative path; the wheel splitter does the same for device
//! wheels.
//!
//! Handlers look at the path only (relative to the install prefix or
//! overlay root, `/`-separated), never at the bytes. The one entry point
//! for any pipeline is [`classify`]: a relative path and the enabled
//! handlers give the first handler's [`Claim`], with the raw key the
//! handler found (`gfx90a-xnack+`, `gfx1250-strict`, `gfx12_0`) and the
//! base key that artifacts and `--gpu-targets` use (`gfx90a`,
//! `gfx1250-strict`, `gfx12_0`).
//!
//! | handler | claims | key |
//! |---|---|---|
//! | `rocblas`, `hipblaslt`, `hipsparselt` | the path contains `rocblas/library` (`hipblaslt/library`, `hipsparselt/library`) and either the file name ends in `.co`, `.hsaco` or `.dat` and contains a target, or the path has a per-target directory `/library/<target>/` | the first target in the file name, else the directory |
//! | `aotriton` | the first `aotriton.images` directory is followed by `amd-gfx...` | that name without `amd-`; `gfx11xx` → `gfx11`, `gfx120x` → `gfx12_0` (family keys) |
//! | `miopen` | `(lib)MIOpenCK<name>_<target>.so`/`.dll` anywhere; or under `miopen/db`, `.kdb`, `.model`, `.db.txt`, `.fdb.txt` files naming one of MIOpen's known targets | the target |
//! | `composablekernel` | `(lib)device_conv_operations_<target>[_xnackp...].a`/`.lib` anywhere | the target, features dropped, `_strict` → `-strict` |
//! | `hipkernelprovider` | `.../engines/arch_content/.../<target>/...` or `.../engines/test_arch_content/...` | the first directory after it that is a target |
//! | `hotswap_cache` | `share/rocjitsu/translations/<domain>/v1/<64 hex>.man`/`.obj` | `gfx1250` for domain `gfx1250-b0-a0`; other domains: no claim |
//! | `rocfft` | rocFFT's per-architecture kernel caches `rocfft_kernel_cache_<arch>.db` (any directory: `lib/rocfft/`, `bin/rocfft/` on Windows) | the bare processor (`gfx942`); the combined `rocfft_kernel_cache.db` stays generic |
//!
//! A target in a name is `gfx<digits><letters>[-strict][-xnack±]`, `_strict`
//! read as `-strict` (a `gfx1250` handler key never comes from a
//! `gfx1250_strict` name). A file
//! no enabled handler claims is not a database file (it stays generic).

use std::fmt;
use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

use crate::target::{base_arch, normalize_feature_spelling, TargetId};
use crate::{ArtifactError, Result};

/// A target as database file names spell it.
/// `_strict` reads as `-strict` (the key is normalized in [`Database::detect`]).
const GFX: &str = r"gfx\d+[a-z]*(?:[-_]strict)?(?:-xnack[+-])?";

fn regex(pattern: &str) -> Regex {
    Regex::new(pattern).expect("the handlers' patterns are valid")
}

static GFX_IN_NAME: LazyLock<Regex> = LazyLock::new(|| regex(GFX));
static GFX_WHOLE: LazyLock<Regex> = LazyLock::new(|| regex(&format!("^(?:{GFX})$")));
static LIBRARY_ARCH_DIR: LazyLock<Regex> = LazyLock::new(|| regex(&format!("/library/({GFX})/")));
/// The targets MIOpen ships databases for; others stay generic.
static MIOPEN_ARCH: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"gfx(?:90a|900|906|908|940|941|942|950|1010|1030|1100|1101|1102|1150|1151|1200|1201|1250(?:[-_]strict)?)",
    )
});
/// Anchored at the start only (`libMIOpenCKConv_gfx942.so.1` is one too).
static MIOPEN_CK_LIBRARY: LazyLock<Regex> =
    LazyLock::new(|| regex(&format!(r"^(?:lib)?MIOpenCK\w+_({GFX})\.(?:so|dll)")));
static CK_STATIC_LIBRARY: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"^(?:lib)?device_conv_operations_(gfx\d+[a-z]*(?:_strict)?)(?:_(?:xnack|sramecc)[p_])*\.(?:a|lib)$",
    )
});
static HOTSWAP_FILE: LazyLock<Regex> = LazyLock::new(|| regex(r"^[0-9a-f]{64}\.(?:man|obj)$"));
/// rocFFT (1.0.37 on) looks its cache up by the bare processor name
/// (`gcnArchName` cut at the first `:`): no features, no `-strict`.
static ROCFFT_CACHE: LazyLock<Regex> =
    LazyLock::new(|| regex(r"(?:^|/)rocfft_kernel_cache_(gfx[0-9]+[a-z]*)\.db$"));

/// One database handler. Handlers are consulted in this order (the order
/// of [`Database::ALL`]), whatever order they are enabled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Database {
    /// rocBLAS Tensile libraries under `rocblas/library`.
    Rocblas,
    /// hipBLASLt Tensile libraries under `hipblaslt/library`.
    Hipblaslt,
    /// hipSPARSELt Tensile libraries under `hipsparselt/library`.
    Hipsparselt,
    /// AOTriton images: `aotriton.images/amd-gfx.../`.
    Aotriton,
    /// MIOpen: per-target CK libraries anywhere, databases under
    /// `miopen/db`.
    Miopen,
    /// Composable Kernel's per-target static libraries.
    ComposableKernel,
    /// hipKernelProvider: `engines/arch_content/`, `engines/test_arch_content/`.
    HipKernelProvider,
    /// rocJITsu's translation cache under `share/rocjitsu/translations`.
    HotswapCache,
    /// rocFFT's per-architecture SQLite kernel caches
    /// (`rocfft_kernel_cache_<arch>.db`).
    Rocfft,
}

/// A handler's claim on a file: it is a database file of `base`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Claim {
    pub handler: Database,
    /// What the handler found, as spelled (`gfx90a-xnack+`, `gfx12_0`).
    pub key: String,
    /// [`base_arch`] of the key: the per-target artifact (or device wheel)
    /// the file belongs to, and what `--gpu-targets` compares.
    pub base: String,
}

impl Database {
    /// Every handler, in the order they are consulted.
    pub const ALL: [Database; 9] = [
        Database::Rocblas,
        Database::Hipblaslt,
        Database::Hipsparselt,
        Database::Aotriton,
        Database::Miopen,
        Database::ComposableKernel,
        Database::HipKernelProvider,
        Database::HotswapCache,
        Database::Rocfft,
    ];

    /// The name `--split-databases` takes.
    pub fn name(self) -> &'static str {
        match self {
            Database::Rocblas => "rocblas",
            Database::Hipblaslt => "hipblaslt",
            Database::Hipsparselt => "hipsparselt",
            Database::Aotriton => "aotriton",
            Database::Miopen => "miopen",
            Database::ComposableKernel => "composablekernel",
            Database::HipKernelProvider => "hipkernelprovider",
            Database::HotswapCache => "hotswap_cache",
            Database::Rocfft => "rocfft",
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

    /// The raw key this handler finds for the file at `rel` (relative to
    /// its prefix root, `/`-separated), or `None` when it does not claim
    /// the file.
    pub(crate) fn detect(self, rel: &str) -> Option<String> {
        let key = self.detect_as_spelled(rel)?;
        Some(key.replace("_strict", "-strict"))
    }

    /// The key as the path spells it (`gfx1250_strict` kept).
    fn detect_as_spelled(self, rel: &str) -> Option<String> {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        match self {
            Database::Rocblas => tensile(rel, name, "rocblas/library"),
            Database::Hipblaslt => tensile(rel, name, "hipblaslt/library"),
            Database::Hipsparselt => tensile(rel, name, "hipsparselt/library"),
            Database::Aotriton => aotriton(rel),
            Database::Miopen => miopen(rel, name),
            Database::ComposableKernel => CK_STATIC_LIBRARY.captures(name).map(|c| c[1].into()),
            Database::HipKernelProvider => hipkernelprovider(rel),
            Database::HotswapCache => hotswap_cache(rel),
            Database::Rocfft => ROCFFT_CACHE.captures(rel).map(|c| c[1].to_string()),
        }
    }

    /// This handler's [`Claim`] on the file at `rel`, if any.
    pub fn claim(self, rel: &str) -> Option<Claim> {
        self.detect(rel).map(|key| Claim {
            handler: self,
            base: base_arch(&key),
            key,
        })
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Database {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The claim of the first handler of `enabled` (in [`Database::ALL`]
/// order) that claims the file at `rel`: its path relative to the prefix
/// (or overlay) root, `/`-separated.
pub fn classify(enabled: &[Database], rel: &str) -> Option<Claim> {
    Database::ALL
        .into_iter()
        .filter(|d| enabled.contains(d))
        .find_map(|d| d.claim(rel))
}

/// Is `key` an AOTriton family key that is not a target ID (`gfx12_0`)?
pub(crate) fn is_family_key(key: &str) -> bool {
    crate::target::is_family_key(key)
}

/// Can `key` name a per-target artifact (`<prefix>_<key>`) or device
/// wheel: a target ID (`-xnack±` spellings accepted) or a family key.
pub(crate) fn is_artifact_key(key: &str) -> bool {
    is_family_key(key) || TargetId::parse(&normalize_feature_spelling(key)).is_ok()
}

/// rocBLAS-style Tensile libraries below `library_dir`.
fn tensile(rel: &str, name: &str, library_dir: &str) -> Option<String> {
    if !rel.contains(library_dir) {
        return None;
    }
    let suffix_ok = [".co", ".hsaco", ".dat"].iter().any(|s| name.ends_with(s));
    if suffix_ok {
        if let Some(m) = GFX_IN_NAME.find(name) {
            return Some(m.as_str().to_string());
        }
    }
    LIBRARY_ARCH_DIR.captures(rel).map(|c| c[1].to_string())
}

fn aotriton(rel: &str) -> Option<String> {
    let comps: Vec<&str> = rel.split('/').collect();
    let at = comps[..comps.len() - 1]
        .iter()
        .position(|c| *c == "aotriton.images")?;
    let image = comps[at + 1].strip_prefix("amd-")?;
    if !image.starts_with("gfx") {
        return None;
    }
    Some(match image {
        "gfx11xx" => "gfx11".to_string(),
        "gfx120x" => "gfx12_0".to_string(),
        other => other.to_string(),
    })
}

fn miopen(rel: &str, name: &str) -> Option<String> {
    if let Some(c) = MIOPEN_CK_LIBRARY.captures(name) {
        return Some(c[1].to_string());
    }
    let db_file = [".kdb", ".model", ".db.txt", ".fdb.txt"]
        .iter()
        .any(|s| name.ends_with(s));
    if !rel.contains("miopen/db") || !db_file {
        return None;
    }
    MIOPEN_ARCH.find(name).map(|m| m.as_str().to_string())
}

fn hipkernelprovider(rel: &str) -> Option<String> {
    let comps: Vec<&str> = rel.split('/').collect();
    let dirs = &comps[..comps.len() - 1];
    (1..comps.len())
        .filter(|&i| {
            matches!(comps[i], "arch_content" | "test_arch_content") && comps[i - 1] == "engines"
        })
        .find_map(|i| {
            dirs.get(i + 1..)?
                .iter()
                .find(|d| GFX_WHOLE.is_match(d))
                .map(|d| d.to_string())
        })
}

fn hotswap_cache(rel: &str) -> Option<String> {
    let comps: Vec<&str> = rel.split('/').collect();
    match comps.as_slice() {
        ["share", "rocjitsu", "translations", "gfx1250-b0-a0", "v1", file]
            if HOTSWAP_FILE.is_match(file) =>
        {
            Some("gfx1250".to_string())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(d: Database, rel: &str) -> Option<String> {
        d.detect(rel)
    }

    /// `_strict` in a name is `-strict`: the strict target, never a
    /// `gfx1250` claim cut short at the `_`.
    #[test]
    fn underscore_strict_names_are_strict_targets() {
        for (d, rel) in [
            (
                Database::Rocblas,
                "lib/rocblas/library/TensileLibrary_gfx1250_strict.dat",
            ),
            (
                Database::Hipblaslt,
                "lib/hipblaslt/library/Kernels_gfx1250_strict-xnack+.co",
            ),
            (Database::Miopen, "share/miopen/db/gfx1250_strict256.kdb"),
            (Database::Miopen, "lib/libMIOpenCKFwd_gfx1250_strict.so"),
            (
                Database::ComposableKernel,
                "lib/libdevice_conv_operations_gfx1250_strict.a",
            ),
            (
                Database::HipKernelProvider,
                "lib/engines/arch_content/gfx1250_strict/k",
            ),
        ] {
            let c = d.claim(rel).unwrap_or_else(|| panic!("{rel}"));
            assert_eq!(c.base, "gfx1250-strict", "{rel}: {c:?}");
            assert!(c.key.starts_with("gfx1250-strict"), "{rel}: {c:?}");
        }
        let c = Database::Rocblas.claim("lib/rocblas/library/TensileLibrary_gfx1250.dat");
        assert_eq!(c.unwrap().base, "gfx1250");
    }

    #[test]
    fn tensile_file_names() {
        for d in [
            Database::Rocblas,
            Database::Hipblaslt,
            Database::Hipsparselt,
        ] {
            let lib = format!("lib/{}/library", d.name());
            let k = |f: &str| key(d, &format!("{lib}/{f}"));
            assert_eq!(
                k("TensileLibrary_Type_HH_gfx1100.dat").as_deref(),
                Some("gfx1100")
            );
            assert_eq!(
                k("Kernels.so-000-gfx90a-xnack+.hsaco").as_deref(),
                Some("gfx90a-xnack+")
            );
            assert_eq!(
                k("TensileLibrary_gfx1250-strict.co").as_deref(),
                Some("gfx1250-strict")
            );
            assert_eq!(
                k("Kernels.so-000-gfx1250-strict-xnack-.hsaco").as_deref(),
                Some("gfx1250-strict-xnack-")
            );
            // The first target in the name.
            assert_eq!(k("a_gfx900_b_gfx1201.co").as_deref(), Some("gfx900"));
            // The `:` spelling is not part of a name's target.
            assert_eq!(
                k("Kernels.so-000-gfx942:xnack-.hsaco").as_deref(),
                Some("gfx942")
            );
            assert_eq!(k("TensileLibrary_fallback.dat"), None);
            assert_eq!(k("TensileManifest.txt"), None);
            assert_eq!(k("gfx1100.txt"), None);
            assert_eq!(k("gfx_x.dat"), None);
        }
        // A substring of the path, as upstream compares.
        assert_eq!(
            key(Database::Rocblas, "lib/myrocblas/library/x_gfx1100.co").as_deref(),
            Some("gfx1100")
        );
        assert_eq!(
            key(Database::Rocblas, "lib/hipblaslt/library/x_gfx1100.co"),
            None
        );
        assert_eq!(
            key(Database::Hipsparselt, "lib/hipblaslt/library/x_gfx1100.co"),
            None
        );
    }

    /// rocm-libraries' per-target layout: every file below
    /// `library/<target>/` belongs to that target.
    #[test]
    fn tensile_per_target_directories() {
        let d = Database::Hipblaslt;
        for (rel, want) in [
            (
                "lib/hipblaslt/library/gfx942/TensileManifest.txt",
                Some("gfx942"),
            ),
            (
                "lib/hipblaslt/library/gfx942/TensileLibrary_fallback.dat",
                Some("gfx942"),
            ),
            (
                "lib/hipblaslt/library/gfx1250-strict/sub/x.json",
                Some("gfx1250-strict"),
            ),
            (
                "lib/hipblaslt/library/gfx90a-xnack+/a.co",
                Some("gfx90a-xnack+"),
            ),
            // The name wins over the directory.
            (
                "lib/hipblaslt/library/gfx942/extop_gfx90a.co",
                Some("gfx90a"),
            ),
            ("lib/hipblaslt/library/gfx942", None),
            ("lib/hipblaslt/library/common/gfx942x", None),
            ("lib/other/library/gfx942/a.dat", None),
        ] {
            assert_eq!(key(d, rel).as_deref(), want, "{rel}");
        }
    }

    #[test]
    fn aotriton_images() {
        let d = Database::Aotriton;
        for (rel, want) in [
            (
                "lib/aotriton.images/amd-gfx942/flash/a.aks2",
                Some("gfx942"),
            ),
            ("lib/aotriton.images/amd-gfx11xx/a.aks2", Some("gfx11")),
            ("lib/aotriton.images/amd-gfx120x/a.aks2", Some("gfx12_0")),
            ("lib/aotriton.images/amd-gfx110x/a.aks2", Some("gfx110x")),
            ("lib/aotriton.images/amd-gfx950/a.aks2", Some("gfx950")),
            ("lib/aotriton.images/common/amd-gfx942/a", None),
            ("lib/aotriton.images", None),
            ("lib/aotriton/kernels/gfx942/a.hsaco", None),
            // Only the first aotriton.images is examined.
            ("lib/aotriton.images/x/aotriton.images/amd-gfx942/a", None),
        ] {
            assert_eq!(key(d, rel).as_deref(), want, "{rel}");
        }
        assert!(is_family_key("gfx12_0"));
        assert!(!is_family_key("gfx11"));
        assert!(is_artifact_key("gfx11") && is_artifact_key("gfx12_0"));
        assert!(is_artifact_key("gfx90a-xnack+") && is_artifact_key("gfx1250-strict"));
        assert!(!is_artifact_key("gfx") && !is_artifact_key("gfx_foo"));
    }

    #[test]
    fn miopen_databases_and_ck_libraries() {
        let d = Database::Miopen;
        for (rel, want) in [
            ("share/miopen/db/gfx90a68.tn.model", Some("gfx90a")),
            ("share/miopen/db/gfx942130.kdb", Some("gfx942")),
            ("share/miopen/db/gfx1030_36.HIP.fdb.txt", Some("gfx1030")),
            ("share/miopen/db/gfx1100_48.db.txt", Some("gfx1100")),
            (
                "share/miopen/db/gfx1250-strict256.kdb",
                Some("gfx1250-strict"),
            ),
            ("share/miopen/db/gfx1250256.kdb", Some("gfx1250")),
            // Not among MIOpen's known targets: generic.
            ("share/miopen/db/gfx1103_20.kdb", None),
            ("share/miopen/db/gfx90c.kdb", None),
            ("share/miopen/db/gfx1251.kdb", None),
            ("share/miopen/db/gfx942.txt", None),
            ("share/other/db/gfx942.kdb", None),
            // Per-target CK libraries, anywhere.
            ("lib/libMIOpenCKGroupedConv_gfx942.so", Some("gfx942")),
            ("lib/libMIOpenCKGroupedConv_gfx942.so.1", Some("gfx942")),
            ("bin/MIOpenCKConv_gfx1201.dll", Some("gfx1201")),
            (
                "lib/libMIOpenCKFwd_gfx1250-strict.so",
                Some("gfx1250-strict"),
            ),
            ("lib/libMIOpenCKA_gfx942_gfx90a.so", Some("gfx90a")),
            ("lib/libMIOpenCK_gfx942.so", None),
            ("lib/libMIOpen.so", None),
            ("lib/xlibMIOpenCKConv_gfx942.so", None),
        ] {
            assert_eq!(key(d, rel).as_deref(), want, "{rel}");
        }
    }

    #[test]
    fn composable_kernel_static_libraries() {
        let d = Database::ComposableKernel;
        for (rel, want) in [
            ("lib/libdevice_conv_operations_gfx942.a", Some("gfx942")),
            ("lib/device_conv_operations_gfx1201.lib", Some("gfx1201")),
            (
                "lib/libdevice_conv_operations_gfx950_xnackp.a",
                Some("gfx950"),
            ),
            (
                "lib/libdevice_conv_operations_gfx90a_sramecc__xnackp.a",
                Some("gfx90a"),
            ),
            (
                "lib/libdevice_conv_operations_gfx1250_strict.a",
                Some("gfx1250-strict"),
            ),
            ("lib/libdevice_conv_operations.a", None),
            ("lib/libdevice_conv_operations_gfx942.so", None),
            ("lib/libdevice_conv_operations_gfx942.a.bak", None),
        ] {
            assert_eq!(key(d, rel).as_deref(), want, "{rel}");
        }
    }

    #[test]
    fn hipkernelprovider_content() {
        let d = Database::HipKernelProvider;
        for (rel, want) in [
            (
                "lib/engines/arch_content/gemm/gfx1201/k.co",
                Some("gfx1201"),
            ),
            ("lib/engines/arch_content/gfx1201/k.co", Some("gfx1201")),
            (
                "lib/engines/test_arch_content/conv/x/gfx942/y/k.co",
                Some("gfx942"),
            ),
            (
                "lib/engines/arch_content/gfx1250-strict/k",
                Some("gfx1250-strict"),
            ),
            // The file name is not a directory.
            ("lib/engines/arch_content/gemm/gfx1201", None),
            ("lib/arch_content/gemm/gfx1201/k.co", None),
            ("engines/arch_content/gemm/k.co", None),
            ("arch_content/gfx942/k", None),
        ] {
            assert_eq!(key(d, rel).as_deref(), want, "{rel}");
        }
    }

    #[test]
    fn hotswap_cache_translations() {
        let d = Database::HotswapCache;
        let hex = "0123456789abcdef".repeat(4);
        let t = |domain: &str, file: &str| {
            key(
                d,
                &format!("share/rocjitsu/translations/{domain}/v1/{file}"),
            )
        };
        assert_eq!(
            t("gfx1250-b0-a0", &format!("{hex}.man")).as_deref(),
            Some("gfx1250")
        );
        assert_eq!(
            t("gfx1250-b0-a0", &format!("{hex}.obj")).as_deref(),
            Some("gfx1250")
        );
        assert_eq!(t("gfx942-a0", &format!("{hex}.obj")), None);
        assert_eq!(t("gfx1250-b0-a0", &format!("{}.obj", &hex[1..])), None);
        assert_eq!(
            t("gfx1250-b0-a0", &format!("{}.obj", hex.to_uppercase())),
            None
        );
        assert_eq!(t("gfx1250-b0-a0", "index.json"), None);
        assert_eq!(
            key(
                d,
                &format!("x/share/rocjitsu/translations/gfx1250-b0-a0/v1/{hex}.man")
            ),
            None
        );
    }

    /// docs/tutorial.md, kernel-database handlers: rocFFT's caches.
    #[test]
    fn rocfft_kernel_caches() {
        let d = Database::Rocfft;
        for (rel, want) in [
            ("lib/rocfft/rocfft_kernel_cache_gfx942.db", Some("gfx942")),
            ("bin/rocfft/rocfft_kernel_cache_gfx1201.db", Some("gfx1201")),
            ("lib/rocfft/rocfft_kernel_cache_gfx90a.db", Some("gfx90a")),
            ("rocfft_kernel_cache_gfx1100.db", Some("gfx1100")),
            // The legacy combined cache stays generic.
            ("lib/rocfft/rocfft_kernel_cache.db", None),
            // The runtime asks for the bare processor only.
            ("lib/rocfft/rocfft_kernel_cache_gfx90a:xnack-.db", None),
            ("lib/rocfft/rocfft_kernel_cache_gfx1250-strict.db", None),
            ("lib/rocfft/rocfft_kernel_cache_gfx942.db-journal", None),
            ("lib/rocfft/xrocfft_kernel_cache_gfx942.db", None),
            ("lib/rocfft/rocfft_kernel_cache_gfx942.db.bak", None),
        ] {
            assert_eq!(key(d, rel).as_deref(), want, "{rel}");
        }
    }

    #[test]
    fn claims_and_lists() {
        assert_eq!(
            Database::parse_list(&["hipblaslt", "rocblas", "rocblas", "hotswap_cache"]).unwrap(),
            vec![
                Database::Rocblas,
                Database::Hipblaslt,
                Database::HotswapCache
            ]
        );
        let e = Database::parse_list(&["tensile"]).unwrap_err().to_string();
        assert!(e.contains("unknown database handler \"tensile\""), "{e}");
        assert!(
            e.contains("rocblas, hipblaslt, hipsparselt, aotriton, miopen, composablekernel, hipkernelprovider, hotswap_cache, rocfft"),
            "{e}"
        );
        assert_eq!(
            classify(
                &[Database::Rocblas],
                "lib/rocblas/library/a_gfx90a-xnack-.dat"
            ),
            Some(Claim {
                handler: Database::Rocblas,
                key: "gfx90a-xnack-".into(),
                base: "gfx90a".into(),
            })
        );
        assert_eq!(classify(&[], "lib/rocblas/library/a_gfx90a.dat"), None);
        // First claim wins, in handler order, whatever order enabled.
        let rel = "lib/rocblas/library/gfx942/libMIOpenCKx_gfx90a.so";
        let c = classify(&[Database::Miopen, Database::Rocblas], rel).unwrap();
        assert_eq!((c.handler, c.base.as_str()), (Database::Rocblas, "gfx942"));
        assert_eq!(classify(&[Database::Miopen], rel).unwrap().base, "gfx90a");
        assert_eq!(
            serde_json::to_string(&Database::HotswapCache).unwrap(),
            "\"hotswap_cache\""
        );
    }
}
