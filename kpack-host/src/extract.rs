//! Extracting code objects to files: from a fat binary (or raw bundle) and
//! from a `.kpack` archive.
//!
//! File names:
//! - fat binary: `<target>.hsaco`, or `<target>#<N>.hsaco` when the binary
//!   has several bundles (N = bundle index);
//! - archive: `<key>@<target>.hsaco`, where in the key `%`, `/` and `@` are
//!   written `%25`, `%2F` and `%40`, so that the name is one path component
//!   and maps back to exactly one (key, target) ([`parse_archive_file_name`]).
//!
//! Everything is decoded and checked before the first file is written, and
//! files are assembled in a staging directory and moved into place at the
//! end: bad input leaves no output behind.

use std::borrow::Cow;
use std::fs;
use std::path::{Path, PathBuf};

use crate::archive::Archive;
use crate::binary::{classify_parsed, Class};
use crate::error::{Error, Result, WithPath};
use crate::fatbin::{device_code, DeviceCode, FatBinary, Offloaded};
use crate::input::map_file;
use crate::output::StagedDir;
use crate::target::TargetId;

/// One file written by [`extract`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Extracted {
    pub file: String,
    pub target: String,
    /// Archive key (archives only).
    pub key: Option<String>,
    /// Bundle index (fat binaries only).
    pub bundle: Option<usize>,
    pub size: u64,
}

/// The file name for a code object of a fat binary.
pub(crate) fn fatbin_file_name(target: &str, bundle: Option<usize>) -> String {
    match bundle {
        Some(n) => format!("{target}#{n}.hsaco"),
        None => format!("{target}.hsaco"),
    }
}

/// The file name for an archive's (key, target) code object.
pub fn archive_file_name(key: &str, target: &str) -> String {
    let mut s = String::with_capacity(key.len() + target.len() + 8);
    for c in key.chars() {
        match c {
            '%' => s.push_str("%25"),
            '/' => s.push_str("%2F"),
            '@' => s.push_str("%40"),
            c => s.push(c),
        }
    }
    s.push('@');
    s.push_str(target);
    s.push_str(".hsaco");
    s
}

/// The (key, target) an [`archive_file_name`] came from.
pub fn parse_archive_file_name(name: &str) -> Option<(String, String)> {
    let stem = name.strip_suffix(".hsaco")?;
    let (key, target) = stem.rsplit_once('@')?;
    let mut out = String::with_capacity(key.len());
    let mut rest = key;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3)?;
        out.push(match code {
            "25" => '%',
            "2F" => '/',
            "40" => '@',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some((out, target.to_string()))
}

/// Does a code object's target match the requested one? Exact text, or
/// the same target ID once both are put in canonical form.
fn target_matches(have: &str, want: &str) -> bool {
    have == want
        || matches!((TargetId::parse(have), TargetId::parse(want)), (Ok(a), Ok(b)) if a == b)
}

/// What extraction found: the files to write, and every target seen (for
/// the error when none matches).
#[derive(Default)]
struct Found<'a> {
    files: Vec<(Extracted, Cow<'a, [u8]>)>,
    available: Vec<String>,
}

/// Extract every code object of `input` (a fat binary, raw bundle file or
/// `.kpack` archive), or only those for `target`, into `out_dir`. On an
/// offloaded binary, its wrappers are resolved through its metadata and
/// archives.
pub fn extract(input: &Path, out_dir: &Path, target: Option<&str>) -> Result<Vec<Extracted>> {
    let mapped = map_file(input)?;
    let write = |found: Found| write_all(input, out_dir, target, found.files, found.available);
    let file = classify_parsed(&mapped);
    if file.class == Class::Archive {
        return write(from_archive(
            &kpack_loader::open_archive(input)?,
            input,
            target,
        )?);
    }
    match device_code(input, &file)? {
        DeviceCode::Fat(fat) => write(from_fat(&fat, target)),
        DeviceCode::Offloaded(o) => write(from_offloaded(&o, input, target)?),
    }
}

fn wanted(target: Option<&str>, have: &str) -> bool {
    target.is_none_or(|t| target_matches(have, t))
}

fn from_archive<'a>(archive: &Archive, path: &Path, target: Option<&str>) -> Result<Found<'a>> {
    let mut found = Found::default();
    for (key, tgt) in archive.keys_and_targets() {
        found.available.push(tgt.to_string());
        if !wanted(target, tgt) {
            continue;
        }
        let bytes = archive.kernel(key, tgt).with_path(path)?;
        let info = Extracted {
            file: archive_file_name(key, tgt),
            target: tgt.to_string(),
            key: Some(key.to_string()),
            bundle: None,
            size: bytes.len() as u64,
        };
        found.files.push((info, Cow::Owned(bytes)));
    }
    Ok(found)
}

fn from_fat<'a>(fat: &'a FatBinary, target: Option<&str>) -> Found<'a> {
    let mut found = Found::default();
    let several = fat.bundles.len() > 1;
    for b in &fat.bundles {
        for e in b.device_entries() {
            found.available.push(e.target().to_string());
            if !wanted(target, e.target()) {
                continue;
            }
            let info = Extracted {
                file: fatbin_file_name(e.target(), several.then_some(b.index)),
                target: e.target().to_string(),
                key: None,
                bundle: Some(b.index),
                size: e.data.len() as u64,
            };
            found.files.push((info, Cow::Borrowed(&e.data[..])));
        }
    }
    found
}

/// Resolve each wrapper through the metadata and the archives its search
/// paths name: what a GPU would load.
fn from_offloaded<'a>(o: &Offloaded, input: &Path, target: Option<&str>) -> Result<Found<'a>> {
    let mut found = Found::default();
    let mut cos: Vec<u64> = o.wrappers.iter().map(|w| w.reserved1).collect();
    cos.sort_unstable();
    cos.dedup();
    let several = cos.len() > 1 || cos.iter().any(|&c| c > 0);
    let base = crate::output::parent_dir(input);
    let mut seen = std::collections::BTreeSet::new();
    for pattern in &o.metadata.search_paths {
        for path in crate::loader::archives_on_search_path(base, pattern) {
            let archive = kpack_loader::open_archive(&path)?;
            for tgt in archive.gfx_arches() {
                found.available.push(tgt.clone());
                if !wanted(target, tgt) {
                    continue;
                }
                for &co in &cos {
                    let key = crate::offload::archive_key(&o.metadata.kernel_name, co as usize);
                    if archive.entry(&key, tgt).is_none() || !seen.insert((tgt.clone(), co)) {
                        continue;
                    }
                    let bytes = archive.kernel(&key, tgt).with_path(&path)?;
                    let info = Extracted {
                        file: fatbin_file_name(tgt, several.then_some(co as usize)),
                        target: tgt.clone(),
                        key: Some(key),
                        bundle: Some(co as usize),
                        size: bytes.len() as u64,
                    };
                    found.files.push((info, Cow::Owned(bytes)));
                }
            }
        }
    }
    Ok(found)
}

fn write_all(
    input: &Path,
    out_dir: &Path,
    target: Option<&str>,
    files: Vec<(Extracted, Cow<[u8]>)>,
    mut available: Vec<String>,
) -> Result<Vec<Extracted>> {
    if files.is_empty() {
        available.sort();
        available.dedup();
        let what = match target {
            Some(t) => format!(
                "no code object for target {t} (available: {})",
                available.join(", ")
            ),
            None => "no code objects to extract".into(),
        };
        return Err(Error::request(input, what));
    }
    // Names come from the input (bundle triples, archive targets): each must
    // be one plain file name, so that nothing lands outside `out_dir`.
    for (info, _) in &files {
        let plain = !info.file.is_empty()
            && !info.file.contains(['/', '\\', '\0'])
            && info.file != "."
            && info.file != "..";
        if !plain {
            return Err(Error::request(
                input,
                format!(
                    "target {:?} would make the output file name {:?}, not a plain file name in {}",
                    info.target,
                    info.file,
                    out_dir.display()
                ),
            ));
        }
    }
    let staged = StagedDir::new(out_dir)?;
    for (info, bytes) in &files {
        let p: PathBuf = staged.path().join(&info.file);
        fs::write(&p, bytes).with_path(&p)?;
    }
    staged.commit()?;
    Ok(files.into_iter().map(|(i, _)| i).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_names_round_trip() {
        for (k, t) in [
            ("lib/libfoo.so#0", "gfx942:sramecc+:xnack-"),
            ("a%2F/b@c#12", "gfx1100"),
            ("", "gfx900"),
            ("..#0", "gfx90a:xnack+"),
        ] {
            let n = archive_file_name(k, t);
            assert!(!n.contains('/'), "{n}");
            assert_eq!(
                parse_archive_file_name(&n),
                Some((k.to_string(), t.to_string()))
            );
        }
        assert_eq!(
            archive_file_name("lib/libfoo.so#0", "gfx1100"),
            "lib%2Flibfoo.so#0@gfx1100.hsaco"
        );
        assert_eq!(parse_archive_file_name("x%zz@gfx900.hsaco"), None);
    }

    #[test]
    fn target_matching_is_canonical() {
        assert!(target_matches(
            "gfx942:sramecc+:xnack-",
            "gfx942:xnack-:sramecc+"
        ));
        assert!(!target_matches("gfx942:xnack-", "gfx942"));
    }
}
