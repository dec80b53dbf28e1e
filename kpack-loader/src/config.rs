//! The loader's configuration: the `ROCM_KPACK_*` environment (formats.md §5.3),
//! read once when a loader is created.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// Set (non-empty, not starting with `0`): every load fails with
/// [`LoadError::Disabled`](crate::LoadError::Disabled).
pub const ENV_DISABLE: &str = "ROCM_KPACK_DISABLE";
/// Set (same rule): diagnostic lines `kpack: ...` on stderr.
pub const ENV_DEBUG: &str = "ROCM_KPACK_DEBUG";
/// Archive paths that replace the embedded search paths.
pub const ENV_PATH: &str = "ROCM_KPACK_PATH";
/// Archive paths searched before the embedded search paths.
pub const ENV_PATH_PREFIX: &str = "ROCM_KPACK_PATH_PREFIX";
/// Set (same rule): every code object loaded is checked against the
/// digest its TOC entry records, if it records one.
pub const ENV_VERIFY_DIGEST: &str = "ROCM_KPACK_VERIFY_DIGEST";

/// The loader's configuration, normally read from the environment once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// `ROCM_KPACK_DISABLE`.
    pub disabled: bool,
    /// `ROCM_KPACK_DEBUG`.
    pub debug: bool,
    /// `ROCM_KPACK_PATH`: literal archive paths (relative ones against the
    /// current directory) that replace the embedded search paths; `None`
    /// when unset or without a non-empty component.
    pub path_override: Option<Vec<PathBuf>>,
    /// `ROCM_KPACK_PATH_PREFIX`: literal archive paths searched before the
    /// embedded ones.
    pub path_prefix: Vec<PathBuf>,
    /// `ROCM_KPACK_VERIFY_DIGEST`: check each code object loaded against
    /// its entry's `code_object_sha256`; a mismatch is a read error.
    pub verify_digest: bool,
}

impl Config {
    /// Read the `ROCM_KPACK_*` variables of this process.
    pub fn from_env() -> Config {
        Config::from_vars(|name| std::env::var_os(name))
    }

    /// Build a configuration from a variable lookup (`name -> value`).
    pub(crate) fn from_vars(mut var: impl FnMut(&str) -> Option<OsString>) -> Config {
        let list = path_list(var(ENV_PATH).as_deref());
        Config {
            disabled: flag_is_set(var(ENV_DISABLE).as_deref()),
            debug: flag_is_set(var(ENV_DEBUG).as_deref()),
            path_override: (!list.is_empty()).then_some(list),
            path_prefix: path_list(var(ENV_PATH_PREFIX).as_deref()),
            verify_digest: flag_is_set(var(ENV_VERIFY_DIGEST).as_deref()),
        }
    }
}

/// The rule for boolean variables: set, non-empty and not starting with `0`.
pub fn flag_is_set(value: Option<&OsStr>) -> bool {
    match value.map(OsStr::as_encoded_bytes) {
        Some([first, ..]) => *first != b'0',
        _ => false,
    }
}

/// Split a path list (`:`-separated; `;` on Windows, where `:` follows a
/// drive letter: `std::env::split_paths` picks the platform's separator),
/// dropping empty components.
pub fn path_list(value: Option<&OsStr>) -> Vec<PathBuf> {
    match value {
        Some(v) => std::env::split_paths(v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let f = |v: Option<&str>| flag_is_set(v.map(OsStr::new));
        assert!(!f(None));
        assert!(!f(Some("")));
        assert!(!f(Some("0")));
        assert!(!f(Some("0yes")));
        assert!(f(Some("1")));
        assert!(f(Some("yes")));
        assert!(f(Some("false")));
    }

    #[test]
    fn config_from_vars() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            Config::from_vars(move |name| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| OsString::from(v))
            })
        };
        assert_eq!(vars(&[]), Config::default());
        let c = vars(&[
            (ENV_DISABLE, "1"),
            (ENV_DEBUG, "0"),
            (ENV_PATH, "::/a/x.kpack::rel/y.kpack:"),
            (ENV_PATH_PREFIX, ":/p.kpack"),
            (ENV_VERIFY_DIGEST, "1"),
        ]);
        assert!(c.disabled && !c.debug && c.verify_digest);
        assert_eq!(
            c.path_override,
            Some(vec![
                PathBuf::from("/a/x.kpack"),
                PathBuf::from("rel/y.kpack")
            ])
        );
        assert_eq!(c.path_prefix, vec![PathBuf::from("/p.kpack")]);
        // Separators only: unset.
        let c = vars(&[(ENV_PATH, ":::"), (ENV_PATH_PREFIX, "")]);
        assert_eq!(c.path_override, None);
        assert!(c.path_prefix.is_empty());
    }
}
