//! `kpack prune` (what CUDA's nvprune does for fat binaries): keep only
//! some targets inside a fat binary's own bundles. The output is still an
//! ordinary fat binary (HIPF wrappers, `.hip_fatbin` PROGBITS) that a HIP
//! runtime without kpack loads, with every other target's bytes gone from
//! the file.
//!
//! The steps: [`plan_bundles`] rebuilds each bundle with the kept entries
//! (host entries always stay, so a bundle left without device code is still
//! a valid, empty bundle; compressed bundles are compressed again with their
//! method, in their CCOB version or v3 where a size needs it) and lays them
//! out back to back at the section's alignment; the ELF transform
//! ([`crate::offload::transform::rewrite`], the machinery of offload) keeps
//! them at the start of `.hip_fatbin`, removes the whole pages after them
//! and points each wrapper at its bundle's new place; [`verify_fat`] checks
//! the result before it is renamed into place.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::binary::{classify_parsed, Class, Classified, HostBinary};
use crate::bundle::{compress_bundle, parse_fatbin, write_bundle, Bundle, Ccob};
use crate::elf::ElfView;
use crate::error::{Error, Result, WithPath};
use crate::input::map_file;
use crate::offload::transform::{rewrite, Request, Transformed};
use crate::offload::{verify_fat, VerifiedFat};
use crate::output::{parent_dir, write_atomically_with_mode};
use crate::target::TargetId;

/// Which code objects to keep.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Requested targets (target IDs, or exact entry target names such as
    /// `amdgcnspirv`).
    pub targets: Vec<String>,
    /// Also keep every generic target (`gfx11-generic`, ...).
    pub keep_generic: bool,
}

impl Selection {
    /// Check the requested targets: each is a target ID or at least a plain
    /// target name.
    pub fn parsed(&self, path: &Path) -> Result<Vec<(String, Option<TargetId>)>> {
        if self.targets.is_empty() {
            return Err(Error::request(path, "no target given (--targets)"));
        }
        self.targets
            .iter()
            .map(|t| match TargetId::parse(t) {
                Ok(id) => Ok((t.clone(), Some(id))),
                Err(_) if is_plain_name(t) => Ok((t.clone(), None)),
                Err(source) => Err(Error::Target {
                    path: path.into(),
                    target: t.clone(),
                    source,
                }),
            })
            .collect()
    }
}

fn is_plain_name(t: &str) -> bool {
    !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Does the selection keep a code object for `target` (as a bundle entry
/// spells it)? The same name, or a requested target that takes it
/// ([`TargetId::takes`]), or a generic target with `keep_generic`.
pub fn keeps(wanted: &[(String, Option<TargetId>)], keep_generic: bool, target: &str) -> bool {
    let parsed = TargetId::parse(target).ok();
    wanted.iter().any(|(name, id)| {
        name == target || matches!((id, &parsed), (Some(want), Some(have)) if want.takes(have))
    }) || (keep_generic && parsed.is_some_and(|t| t.is_generic()))
}

/// What happened to one bundle.
#[derive(Debug, Clone, Serialize)]
pub struct BundlePruned {
    pub index: usize,
    /// CCOB version and method, for a compressed bundle.
    pub compressed: Option<String>,
    pub kept: Vec<String>,
    pub dropped: Vec<String>,
    /// Stored bytes before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// What [`prune`] did.
#[derive(Debug, Clone, Serialize)]
pub struct PruneSummary {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Targets kept, and dropped, over all bundles (sorted).
    pub kept_targets: Vec<String>,
    pub dropped_targets: Vec<String>,
    pub bundles: Vec<BundlePruned>,
    pub wrappers: usize,
    /// `.hip_fatbin` bytes before and after.
    pub section_before: u64,
    pub section_after: u64,
    pub input_size: u64,
    pub output_size: u64,
    pub seconds: f64,
}

/// The pruned bundles laid out as the new section's payload.
pub struct Layout {
    pub bytes: Vec<u8>,
    /// (old offset in the section, new offset) of each top-level bundle.
    pub starts: Vec<(u64, u64)>,
    pub bundles: Vec<BundlePruned>,
}

/// Prune `input` to the targets of `selection`, writing `output` (which may
/// be the same path; its mode is the input's).
pub fn prune(input: &Path, output: &Path, selection: &Selection) -> Result<PruneSummary> {
    let clock = std::time::Instant::now();
    let wanted = selection.parsed(input)?;
    let mapped = map_file(input)?;
    let bytes: &[u8] = &mapped;
    let mode = fs::metadata(input).with_path(input)?.permissions().mode();
    let elf = fat_elf(input, &classify_parsed(bytes))?;
    let section = HostBinary::Elf(elf)
        .fatbin()
        .with_path(input)?
        .ok_or_else(|| Error::request(input, "no .hip_fatbin section"))?;
    let bundles = parse_fatbin(section.data).with_path(input)?;
    let align = section_alignment(&elf);
    let layout = plan_bundles(input, &bundles, align, &|t| {
        keeps(&wanted, selection.keep_generic, t)
    })?;
    let (kept, dropped) = kept_and_dropped(&layout.bundles);
    if kept.is_empty() {
        return Err(Error::request(
            input,
            format!(
                "none of its code objects is for {} (it has {})",
                selection.targets.join(", "),
                dropped.join(", ")
            ),
        ));
    }
    let (t, v) = rewrite_verified(input, elf, &layout)?;
    fs::create_dir_all(parent_dir(output)).with_path(parent_dir(output))?;
    write_atomically_with_mode(output, Some(mode), |f| f.write_all(&t.bytes))?;
    Ok(PruneSummary {
        input: input.into(),
        output: output.into(),
        kept_targets: kept,
        dropped_targets: dropped,
        bundles: layout.bundles,
        wrappers: v.wrapper_bundles.len(),
        section_before: section.size,
        section_after: layout.bytes.len() as u64,
        input_size: bytes.len() as u64,
        output_size: t.bytes.len() as u64,
        seconds: clock.elapsed().as_secs_f64(),
    })
}

/// The fat ELF binary of a file; anything else (a PE file too) is refused,
/// saying what it is.
fn fat_elf<'a>(input: &Path, file: &Classified<'a>) -> Result<ElfView<'a>> {
    check_class(input, file)?;
    match file.binary.clone().with_path(input)? {
        HostBinary::Elf(elf) => Ok(elf),
        HostBinary::Pe(_) => Err(Error::request(
            input,
            "a PE file: prune rewrites ELF binaries only (offload handles both)",
        )),
    }
}

/// The binary in `bytes` with `layout` in place of its section's bundles
/// (the ELF transform), and what verifying it found.
fn rewrite_verified(
    input: &Path,
    elf: ElfView,
    layout: &Layout,
) -> Result<(Transformed, VerifiedFat)> {
    let req = Request::Prune {
        bundles: &layout.bytes,
        starts: layout.starts.clone(),
    };
    let t = rewrite(elf, &req).with_path(input)?;
    let v = verify_fat(&t.bytes).map_err(|source| Error::SelfCheck {
        path: input.into(),
        output: "pruned",
        source,
    })?;
    Ok((t, v))
}

/// Only a fat binary can be pruned; anything else is refused, saying what
/// it is.
fn check_class(input: &Path, file: &Classified) -> Result<()> {
    let what = match &file.class {
        Class::Fat => return Ok(()),
        Class::Offloaded => "an offloaded binary: its device code is in archives (kpack restore --targets puts chosen targets back)",
        Class::HostOnly => "a host binary without device code (no .hip_fatbin)",
        Class::DebugOnly => "a debug-info file: no device code",
        Class::Relocatable { .. } | Class::StaticArchive => "a link input, not a run-time binary",
        Class::CodeObject => "an AMDGPU code object, not a host binary",
        Class::Bundle => "a raw offload bundle, not a host binary",
        Class::Archive => "a .kpack archive, not a binary",
        Class::Inconsistent(why) => return Err(why.clone()).with_path(input),
        Class::Other => {
            return Err(match &file.binary {
                Err(e) => Error::binary(input, e.clone()),
                Ok(_) => Error::request(input, "not a host binary"),
            })
        }
    };
    Err(Error::request(input, what))
}

/// The alignment of bundles in the section: its own, at most a page.
fn section_alignment(elf: &ElfView) -> u64 {
    use object::read::elf::SectionHeader as _;
    elf.section_index(crate::elf::FATBIN_SECTION)
        .map(|i| elf.shdrs()[i].sh_addralign(crate::elf::LE))
        .unwrap_or(1)
        .clamp(8, 4096)
}

/// Rebuild every bundle with the entries `keep` says, in order, each
/// top-level bundle at a multiple of `align`.
pub(crate) fn plan_bundles(
    input: &Path,
    bundles: &[Bundle],
    align: u64,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Layout> {
    let mut out = Layout {
        bytes: Vec::new(),
        starts: Vec::new(),
        bundles: Vec::new(),
    };
    for group in bundles.chunk_by(|a, b| a.range == b.range) {
        let start = crate::offload::transform::align_up(out.bytes.len() as u64, align);
        out.bytes.resize(start as usize, 0);
        let mut plain = Vec::new();
        for b in group {
            let (bytes, kept, dropped) = pruned_plain(b, keep);
            plain.extend_from_slice(&bytes);
            out.bundles.push(BundlePruned {
                index: b.index,
                compressed: None,
                kept,
                dropped,
                bytes_before: group[0].range.len() as u64,
                bytes_after: 0,
            });
        }
        let stored = match &group[0].compressed {
            Some((ccob, _)) => recompress(input, &plain, ccob)?,
            None => plain,
        };
        let n = out.bundles.len();
        for b in &mut out.bundles[n - group.len()..] {
            b.bytes_after = stored.len() as u64;
            b.compressed = group[0]
                .compressed
                .as_ref()
                .map(|(c, _)| format!("CCOB v{} {}", ccob_version(c, stored.len()), c.method));
        }
        out.starts.push((group[0].range.start as u64, start));
        out.bytes.extend_from_slice(&stored);
    }
    Ok(out)
}

/// An uncompressed bundle with its host entries and the device entries
/// `keep` says, entries aligned as in the input; the kept and dropped
/// targets.
fn pruned_plain(b: &Bundle, keep: &dyn Fn(&str) -> bool) -> (Vec<u8>, Vec<String>, Vec<String>) {
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    let mut entries: Vec<(&str, &[u8])> = Vec::new();
    for e in &b.entries {
        if e.is_host() || keep(e.target()) {
            entries.push((&e.triple, &e.data));
            if !e.is_host() {
                kept.push(e.target().to_string());
            }
        } else {
            dropped.push(e.target().to_string());
        }
    }
    (write_bundle(&entries, entry_alignment(b)), kept, dropped)
}

/// The alignment of a bundle's device entries: the largest power of two,
/// at most 4096 (clang's), dividing each non-empty entry's offset.
fn entry_alignment(b: &Bundle) -> usize {
    b.device_entries()
        .filter(|e| !e.data.is_empty())
        .map(|e| 1u64 << e.offset.trailing_zeros().min(12))
        .min()
        .unwrap_or(1) as usize
}

/// The CCOB version a rewritten compressed bundle gets: its own, or v3
/// when its sizes no longer fit v1/v2's 32-bit fields.
fn ccob_version(c: &Ccob, stored: usize) -> u16 {
    if c.version < 3 && u32::try_from(stored).is_err() {
        3
    } else {
        c.version
    }
}

/// Compress `plain` as the compressed bundle `ccob` was: same method, same
/// version unless a size needs v3.
fn recompress(input: &Path, plain: &[u8], ccob: &Ccob) -> Result<Vec<u8>> {
    let fail = |source| Error::Compress {
        path: input.into(),
        what: "a pruned bundle",
        source,
    };
    let version = if u32::try_from(plain.len()).is_err() {
        3
    } else {
        ccob.version
    };
    match compress_bundle(plain, version, ccob.method) {
        Ok(b) if version < 3 && u32::try_from(b.len()).is_err() => {
            compress_bundle(plain, 3, ccob.method).map_err(fail)
        }
        Ok(b) => Ok(b),
        Err(_) if version < 3 => compress_bundle(plain, 3, ccob.method).map_err(fail),
        Err(e) => Err(fail(e)),
    }
}

/// The targets kept and dropped, over all bundles, sorted.
fn kept_and_dropped(bundles: &[BundlePruned]) -> (Vec<String>, Vec<String>) {
    let mut kept: Vec<String> = bundles.iter().flat_map(|b| b.kept.clone()).collect();
    let mut dropped: Vec<String> = bundles.iter().flat_map(|b| b.dropped.clone()).collect();
    for v in [&mut kept, &mut dropped] {
        v.sort();
        v.dedup();
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::Method;

    const HOST: &str = "host-x86_64-unknown-linux--";
    const A: &str = "hipv4-amdgcn-amd-amdhsa--gfx1100";
    const B: &str = "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-";
    const C: &str = "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+";

    fn wanted(t: &[&str]) -> Vec<(String, Option<TargetId>)> {
        Selection {
            targets: t.iter().map(|s| s.to_string()).collect(),
            keep_generic: false,
        }
        .parsed(Path::new("x"))
        .unwrap()
    }

    #[test]
    fn keeps_as_the_loader_matches() {
        let w = wanted(&["gfx90a"]);
        assert!(keeps(&w, false, "gfx90a:xnack+"));
        assert!(keeps(&w, false, "gfx90a:xnack-"));
        assert!(!keeps(&w, false, "gfx1100"));
        assert!(!keeps(&w, false, "gfx11-generic"));
        assert!(keeps(&w, true, "gfx11-generic"));
        let w = wanted(&["gfx90a:xnack-", "amdgcnspirv"]);
        assert!(!keeps(&w, false, "gfx90a:xnack+"));
        assert!(keeps(&w, false, "gfx90a"));
        assert!(keeps(&w, false, "amdgcnspirv"));
        assert!(Selection::default().parsed(Path::new("x")).is_err());
        let bad = Selection {
            targets: vec!["../x".into()],
            keep_generic: false,
        };
        assert!(bad.parsed(Path::new("x")).is_err());
    }

    /// Plain and compressed bundles keep their form; a bundle left without
    /// device code keeps its host entry; every kept code object is intact.
    #[test]
    fn bundles_keep_their_form() {
        let a = vec![1u8; 5000];
        let b = vec![2u8; 3000];
        let c = vec![3u8; 7000];
        let plain = write_bundle(&[(HOST, b""), (A, &a), (B, &b), (C, &c)], 4096);
        let inner = write_bundle(&[(HOST, b""), (B, &b), (C, &c)], 4096);
        let ccob = compress_bundle(&inner, 2, Method::Zstd).unwrap();
        let only_a = write_bundle(&[(HOST, b""), (A, &a)], 4096);
        let mut section = plain.clone();
        section.resize(plain.len().div_ceil(4096) * 4096, 0);
        let ccob_at = section.len();
        section.extend_from_slice(&ccob);
        section.resize(section.len().div_ceil(4096) * 4096, 0);
        let last_at = section.len();
        section.extend_from_slice(&only_a);
        let bundles = parse_fatbin(&section).unwrap();
        let w = wanted(&["gfx90a:xnack-"]);
        let l = plan_bundles(Path::new("x"), &bundles, 4096, &|t| keeps(&w, false, t)).unwrap();
        assert_eq!(l.starts.len(), 3);
        assert_eq!(l.starts[1].0, ccob_at as u64);
        assert_eq!(l.starts[2].0, last_at as u64);
        let out = parse_fatbin(&l.bytes).unwrap();
        assert_eq!(out.len(), 3);
        for (o, &(_, new)) in out.iter().zip(&l.starts) {
            assert_eq!(o.range.start as u64, new);
            assert_eq!(new % 4096, 0);
        }
        let targets = |b: &Bundle| {
            b.device_entries()
                .map(|e| e.target().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(targets(&out[0]), ["gfx90a:xnack-"]);
        assert_eq!(&*out[0].entry_for("gfx90a:xnack-").unwrap().data, &b[..]);
        assert_eq!(out[0].entry_for("gfx90a:xnack-").unwrap().offset % 4096, 0);
        let (c1, _) = out[1].compressed.as_ref().expect("still compressed");
        assert_eq!((c1.version, c1.method), (2, Method::Zstd));
        assert_eq!(c1.hash_matches, Some(true));
        assert_eq!(targets(&out[1]), ["gfx90a:xnack-"]);
        // Left without device code: the host entry, a valid empty bundle.
        assert!(out[2].device_entries().next().is_none());
        assert_eq!(out[2].entries.len(), 1);
        assert!(l.bundles[2].kept.is_empty());
        assert_eq!(l.bundles[0].dropped, ["gfx1100", "gfx90a:xnack+"]);
        assert!(l.bytes.len() < section.len());
    }
}
