//! What the faces (the `kpack` command and the Python API) take from their
//! users as names and numbers, checked one way: the compression scheme, the
//! zstd level, the number of worker threads. A bad value is an
//! [`ArtifactError::BadOption`] saying which option and why.

use std::ops::RangeInclusive;

use crate::archive::Scheme;
use crate::{ArtifactError, Result};

/// The zstd levels accepted (`--compression-level`).
pub const LEVELS: RangeInclusive<i32> = 1..=22;

/// The names of the compression schemes (`--compression`); `noop` is the
/// reference tools' name for `none`.
pub const COMPRESSIONS: &[&str] = &["none", "zstd"];

/// The scheme named `name`: `zstd`, `none` (or `noop`).
pub fn compression(name: &str) -> Result<Scheme> {
    match name {
        "zstd" => Ok(Scheme::ZstdPerKernel),
        "none" | "noop" => Ok(Scheme::None),
        _ => Err(ArtifactError::BadOption {
            option: "compression",
            what: format!(
                "unknown scheme {name:?} (known: {})",
                COMPRESSIONS.join(", ")
            ),
        }),
    }
}

/// A zstd level in [`LEVELS`].
pub fn compression_level(level: i32) -> Result<i32> {
    if LEVELS.contains(&level) {
        return Ok(level);
    }
    Err(ArtifactError::BadOption {
        option: "compression level",
        what: format!("{level} is not in {}..={}", LEVELS.start(), LEVELS.end()),
    })
}

/// A number of worker threads: at least 1 (`None`: all cores).
pub fn jobs(n: Option<i64>) -> Result<Option<usize>> {
    match n {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(ArtifactError::BadOption {
            option: "jobs",
            what: format!("{n} is not at least 1"),
        }),
    }
}

/// A number of worker threads where values below 1 mean 1 (split-wheels,
/// as the reference tool).
pub fn jobs_at_least_one(n: Option<i64>) -> Option<usize> {
    n.map(|n| usize::try_from(n.max(1)).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ranges() {
        assert_eq!(compression("zstd").unwrap(), Scheme::ZstdPerKernel);
        assert_eq!(compression("noop").unwrap(), Scheme::None);
        let e = compression("lz4").unwrap_err().to_string();
        assert_eq!(e, "compression: unknown scheme \"lz4\" (known: none, zstd)");
        assert_eq!(compression_level(22).unwrap(), 22);
        let e = compression_level(99).unwrap_err().to_string();
        assert_eq!(e, "compression level: 99 is not in 1..=22");
        assert!(compression_level(0).is_err());
        assert_eq!(jobs(Some(2)).unwrap(), Some(2));
        assert!(jobs(Some(0)).is_err());
        assert_eq!(jobs_at_least_one(Some(-3)), Some(1));
        assert_eq!(jobs_at_least_one(None), None);
    }
}
