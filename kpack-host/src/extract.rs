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
//! What to write is decided from the entry tables (or archive TOCs) before
//! the first file is written; files are then written one code object at a
//! time (compressed bundles read as a stream) into a staging directory,
//! moved into place at the end: bad input, even found half-way, leaves no
//! output behind.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::archive::Archive;
use crate::binary::{classify_parsed, Class};
use crate::error::{Error, Result, WithPath};
use crate::fatbin::{device_code, DeviceCode, FatBinary, Offloaded};
use crate::input::{map_file, Mapped};
use crate::offload::collect::Pages;
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

/// What extraction will write: each file with where its bytes come from,
/// and every target seen (for the error when none matches).
struct Plan<S> {
    files: Vec<(Extracted, S)>,
    available: Vec<String>,
}

impl<S> Default for Plan<S> {
    fn default() -> Self {
        Plan {
            files: Vec::new(),
            available: Vec::new(),
        }
    }
}

/// Extract every code object of `input` (a fat binary, raw bundle file or
/// `.kpack` archive), or only those for `target`, into `out_dir`. On an
/// offloaded binary, its wrappers are resolved through its metadata and
/// archives.
///
/// What is extracted is decided (and file names checked) before anything
/// is written; the files are then written one code object at a time into
/// a staging directory, moved into place once all are there: at most one
/// code object is held, and bad input (found on the way, e.g. a damaged
/// compressed bundle) leaves no output behind.
pub fn extract(input: &Path, out_dir: &Path, target: Option<&str>) -> Result<Vec<Extracted>> {
    let mapped = map_file(input)?;
    let file = classify_parsed(&mapped);
    if file.class == Class::Archive {
        let archive = kpack_loader::open_archive(input)?;
        let plan = from_archive(&archive, target);
        return write_planned(input, out_dir, target, plan, |(key, tgt)| {
            archive.kernel(key, tgt).with_path(input)
        });
    }
    match device_code(input, &file)? {
        DeviceCode::Fat(fat) => from_fat(input, &mapped, out_dir, &fat, target),
        DeviceCode::Offloaded(o) => {
            let (archives, plan) = from_offloaded(&o, input, target)?;
            write_planned(input, out_dir, target, plan, |(at, (key, tgt))| {
                let (path, archive) = &archives[*at];
                archive.kernel(key, tgt).with_path(path)
            })
        }
    }
}

fn wanted(target: Option<&str>, have: &str) -> bool {
    target.is_none_or(|t| target_matches(have, t))
}

/// An archive's code objects: (key, target) of each.
fn from_archive<'a>(archive: &'a Archive, target: Option<&str>) -> Plan<(&'a str, &'a str)> {
    let mut plan = Plan::default();
    for (key, tgt) in archive.keys_and_targets() {
        plan.available.push(tgt.to_string());
        if !wanted(target, tgt) {
            continue;
        }
        let size = archive.entry(key, tgt).map_or(0, |e| e.original_size);
        let info = Extracted {
            file: archive_file_name(key, tgt),
            target: tgt.to_string(),
            key: Some(key.to_string()),
            bundle: None,
            size,
        };
        plan.files.push((info, (key, tgt)));
    }
    plan
}

/// A fat binary's code objects, planned from its bundles' entry tables and
/// written as the bundles are read (compressed ones as a stream).
fn from_fat(
    input: &Path,
    mapped: &Mapped,
    out_dir: &Path,
    fat: &FatBinary,
    target: Option<&str>,
) -> Result<Vec<Extracted>> {
    let mut plan: Plan<(usize, usize)> = Plan::default();
    let several = fat.bundles.len() > 1;
    for b in &fat.bundles {
        for (i, e) in b.entries.iter().enumerate() {
            if e.is_host() {
                continue;
            }
            plan.available.push(e.target().to_string());
            if !wanted(target, e.target()) {
                continue;
            }
            let info = Extracted {
                file: fatbin_file_name(e.target(), several.then_some(b.index)),
                target: e.target().to_string(),
                key: None,
                bundle: Some(b.index),
                size: e.size,
            };
            plan.files.push((info, (b.index, i)));
        }
    }
    check_plan(input, out_dir, target, &mut plan)?;
    let names: HashMap<(usize, usize), &str> = plan
        .files
        .iter()
        .map(|(info, at)| (*at, info.file.as_str()))
        .collect();
    write_staged(out_dir, |dir| {
        let mut stream = fat.stream().keep(|t: &str| wanted(target, t));
        let mut pages = Pages::new(mapped, fat.data);
        let mut written = 0;
        while let Some(co) = stream.next().with_path(input)? {
            let Some(name) = names.get(&(co.bundle, co.entry)) else {
                continue;
            };
            let p = dir.join(name);
            fs::write(&p, &*co.data).with_path(&p)?;
            written += 1;
            pages.release(&stream);
        }
        if written != names.len() {
            return Err(Error::request(
                input,
                format!("{} code objects listed, {written} read", names.len()),
            ));
        }
        Ok(())
    })?;
    Ok(plan.files.into_iter().map(|(i, _)| i).collect())
}

/// Resolve each wrapper through the metadata and the archives its search
/// paths name (what a GPU would load): the archives opened, and the code
/// objects as (archive, (key, target)).
type OffloadedPlan = (Vec<(PathBuf, Archive)>, Plan<(usize, (String, String))>);

fn from_offloaded(o: &Offloaded, input: &Path, target: Option<&str>) -> Result<OffloadedPlan> {
    let mut plan = Plan::default();
    let mut archives = Vec::new();
    let mut cos: Vec<u64> = o.wrappers.iter().map(|w| w.reserved1).collect();
    cos.sort_unstable();
    cos.dedup();
    let several = cos.len() > 1 || cos.iter().any(|&c| c > 0);
    let base = crate::output::parent_dir(input);
    let mut seen = std::collections::BTreeSet::new();
    for pattern in &o.metadata.search_paths {
        for path in crate::loader::archives_on_search_path(base, pattern) {
            let archive = kpack_loader::open_archive(&path)?;
            let at = archives.len();
            for tgt in archive.gfx_arches() {
                plan.available.push(tgt.clone());
                if !wanted(target, tgt) {
                    continue;
                }
                for &co in &cos {
                    let key = crate::offload::archive_key(&o.metadata.kernel_name, co as usize);
                    let Some(entry) = archive.entry(&key, tgt) else {
                        continue;
                    };
                    if !seen.insert((tgt.clone(), co)) {
                        continue;
                    }
                    let info = Extracted {
                        file: fatbin_file_name(tgt, several.then_some(co as usize)),
                        target: tgt.clone(),
                        key: Some(key.clone()),
                        bundle: Some(co as usize),
                        size: entry.original_size,
                    };
                    plan.files.push((info, (at, (key, tgt.clone()))));
                }
            }
            archives.push((path, archive));
        }
    }
    Ok((archives, plan))
}

/// The checks before anything is written: something to extract, and
/// every name one plain file name (names come from the input: bundle
/// triples, archive targets), so that nothing lands outside `out_dir`.
fn check_plan<S>(
    input: &Path,
    out_dir: &Path,
    target: Option<&str>,
    plan: &mut Plan<S>,
) -> Result<()> {
    if plan.files.is_empty() {
        plan.available.sort();
        plan.available.dedup();
        let what = match target {
            Some(t) => format!(
                "no code object for target {t} (available: {})",
                plan.available.join(", ")
            ),
            None => "no code objects to extract".into(),
        };
        return Err(Error::request(input, what));
    }
    for (info, _) in &plan.files {
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
    Ok(())
}

/// Write planned files one at a time, each read by `load` (its bytes
/// dropped once written).
fn write_planned<S>(
    input: &Path,
    out_dir: &Path,
    target: Option<&str>,
    mut plan: Plan<S>,
    load: impl Fn(&S) -> Result<Vec<u8>>,
) -> Result<Vec<Extracted>> {
    check_plan(input, out_dir, target, &mut plan)?;
    write_staged(out_dir, |dir| {
        for (info, at) in &plan.files {
            let bytes = load(at)?;
            let p = dir.join(&info.file);
            fs::write(&p, &bytes).with_path(&p)?;
        }
        Ok(())
    })?;
    Ok(plan.files.into_iter().map(|(i, _)| i).collect())
}

/// Fill a staging directory for `out_dir` and move it into place; on
/// error it is removed with what it holds.
fn write_staged(out_dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let staged = StagedDir::new(out_dir)?;
    fill(staged.path())?;
    staged.commit()?;
    Ok(())
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
