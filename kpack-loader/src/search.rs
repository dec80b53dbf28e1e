//! The search (formats.md §5.4, steps 4 to 6): the candidate archive paths of a
//! load, the loader's archive cache (each archive opened once per canonical
//! path), and the walk over targets and candidates that finds the code
//! object or decides which error to report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::trace::{Attempt, AttemptOutcome, CandidateStatus, CandidateTrace, Trace};
use super::{ErrorCode, LoadError, Loaded, Loader};
use crate::archive::Entry;
use crate::config::{ENV_PATH, ENV_PATH_PREFIX};
use crate::hipk::{HipkMetadata, GFXARCH};
use crate::input::ArchiveFile;
use crate::provenance;
use crate::target::{TargetId, AGENT_ISA_PREFIX};

/// An archive the loader opened, with its `gfx_arches` parsed once.
pub(super) struct Opened {
    path: PathBuf,
    archive: ArchiveFile,
    /// `(parsed, as written)` for each `gfx_arches` entry that parses.
    targets: Vec<(TargetId, String)>,
}

impl Opened {
    pub(super) fn archive(&self) -> &ArchiveFile {
        &self.archive
    }

    /// The archive's own spelling of `target`, if it serves it.
    fn serves(&self, target: &TargetId) -> Option<&str> {
        self.targets
            .iter()
            .find(|(t, _)| t == target)
            .map(|(_, s)| s.as_str())
    }

    /// The entry of `key` for `target` (spelled `spelling` in `gfx_arches`).
    fn entry(&self, key: &str, spelling: &str, target: &TargetId) -> Option<&Entry> {
        self.archive.entry(key, spelling).or_else(|| {
            self.archive
                .targets_of(key)
                .find(|t| TargetId::parse(t).as_ref() == Ok(target))
                .and_then(|t| self.archive.entry(key, t))
        })
    }
}

/// One archive, opened at most once. `canonical` is why the candidate path
/// does not resolve, when it does not (the cell then holds that too); the
/// cell holds the archive, or why it did not open.
pub(super) struct Slot {
    canonical: Result<PathBuf, String>,
    pub(super) cell: OnceLock<Result<Arc<Opened>, Unusable>>,
}

/// Why a candidate archive cannot be used.
#[derive(Debug, Clone)]
pub(super) enum Unusable {
    /// Its path does not resolve.
    Missing(String),
    /// It exists but does not open as an archive: the error code
    /// `kpack_open` would return, and why.
    Failed(ErrorCode, String),
}

/// Where a code object was found.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The archive's canonical path.
    pub archive: PathBuf,
    /// The target, as the archive's `gfx_arches` spells it.
    pub target: String,
    /// The full offload triple recorded in the entry's metadata, if any.
    pub triple: Option<String>,
    /// The entry records the binary's own device digest: it was split from
    /// this very build (`false` when either side records none).
    pub same_build: bool,
}

#[derive(Default)]
pub(super) struct State {
    /// Candidate path as built -> its archive.
    by_candidate: HashMap<PathBuf, Arc<Slot>>,
    /// Canonical path -> its archive (shared by every candidate naming it).
    pub(super) by_canonical: HashMap<PathBuf, Arc<Slot>>,
}

impl Loader {
    /// The compatible targets of each requested architecture, most
    /// specific first; architectures that are not target IDs are skipped.
    pub(super) fn agents<'a>(&self, archs: &[&'a str]) -> Vec<(&'a str, Vec<TargetId>)> {
        let mut agents = Vec::with_capacity(archs.len());
        for &arch in archs {
            let name = arch.strip_prefix(AGENT_ISA_PREFIX).unwrap_or(arch);
            match TargetId::parse(name) {
                Ok(t) => agents.push((arch, t.compatible_targets())),
                Err(e) => self.debug(format_args!("ignoring architecture {arch:?}: {e}")),
            }
        }
        agents
    }

    /// Step 4: the candidate archive paths, in search order, without
    /// duplicates.
    pub(super) fn candidates(
        &self,
        metadata: &HipkMetadata,
        binary_path: &Path,
        agents: &[(&str, Vec<TargetId>)],
    ) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        let mut push = |p: PathBuf| {
            if !out.contains(&p) {
                out.push(p);
            }
        };
        if let Some(paths) = &self.config.path_override {
            self.debug(format_args!(
                "using {ENV_PATH} override: {} paths",
                paths.len()
            ));
            paths.iter().cloned().for_each(push);
            return out;
        }
        if !self.config.path_prefix.is_empty() {
            self.debug(format_args!(
                "prepending {} paths from {ENV_PATH_PREFIX}",
                self.config.path_prefix.len()
            ));
        }
        self.config.path_prefix.iter().cloned().for_each(&mut push);
        let dir = binary_path.parent().unwrap_or(Path::new(""));
        for path in &metadata.search_paths {
            if path.contains(GFXARCH) {
                for target in agents.iter().flat_map(|(_, t)| t) {
                    let expanded = dir.join(path.replace(GFXARCH, &target.to_string()));
                    self.debug(format_args!(
                        "expanded pattern: {path} -> {}",
                        expanded.display()
                    ));
                    push(expanded);
                }
            } else {
                let direct = dir.join(path);
                self.debug(format_args!("direct path: {path} -> {}", direct.display()));
                push(direct);
            }
        }
        out
    }

    /// The archives a search for this binary could find, with the targets
    /// each lists: the `ROCM_KPACK_PATH` list, or the prefix list and the
    /// embedded paths, where a `@GFXARCH@` in a file name stands for any
    /// target (every file in that directory whose name fits). Each opened
    /// once, through the cache; those that do not open are left out.
    pub fn available_archives(
        &self,
        metadata: &HipkMetadata,
        binary_path: &Path,
    ) -> Vec<(PathBuf, Vec<String>)> {
        let mut paths: Vec<PathBuf> = Vec::new();
        if let Some(list) = &self.config.path_override {
            paths.extend(list.iter().cloned());
        } else {
            paths.extend(self.config.path_prefix.iter().cloned());
            let dir = binary_path.parent().unwrap_or(Path::new(""));
            for p in &metadata.search_paths {
                paths.extend(archives_on_search_path(dir, p));
            }
        }
        let mut out: Vec<(PathBuf, Vec<String>)> = Vec::new();
        for p in paths {
            if let Ok(a) = self.archive(&p) {
                if !out.iter().any(|(c, _)| *c == a.path) {
                    out.push((a.path.clone(), a.archive.gfx_arches().to_vec()));
                }
            }
        }
        out
    }

    /// The archive at `candidate`, opened once per canonical path, or why
    /// it cannot be used.
    pub(super) fn archive(&self, candidate: &Path) -> Result<Arc<Opened>, Unusable> {
        let known = self.lock().by_candidate.get(candidate).cloned();
        let slot = match known {
            Some(slot) => slot,
            None => self.resolve(candidate),
        };
        slot.cell
            .get_or_init(|| {
                let path = slot
                    .canonical
                    .as_deref()
                    .map_err(|e| Unusable::Missing(e.clone()))?;
                match ArchiveFile::open(path) {
                    Ok(archive) => {
                        self.debug(format_args!(
                            "opened and cached archive: {}",
                            path.display()
                        ));
                        for arch in archive.gfx_arches() {
                            self.debug(format_args!("  architecture: {arch}"));
                        }
                        let targets = archive
                            .gfx_arches()
                            .iter()
                            .filter_map(|a| TargetId::parse(a).ok().map(|t| (t, a.clone())))
                            .collect();
                        Ok(Arc::new(Opened {
                            path: path.to_path_buf(),
                            archive,
                            targets,
                        }))
                    }
                    Err(e) => Err(Unusable::Failed(ErrorCode::of_open(&e), e.to_string())),
                }
            })
            .clone()
    }

    /// Map `candidate` to the slot of its canonical path (shared with other
    /// names of the same file), remembering the answer.
    fn resolve(&self, candidate: &Path) -> Arc<Slot> {
        let canonical = std::fs::canonicalize(candidate).map_err(|e| e.to_string());
        let mut state = self.lock();
        let slot = match canonical {
            Ok(c) => state
                .by_canonical
                .entry(c.clone())
                .or_insert_with(|| {
                    Arc::new(Slot {
                        canonical: Ok(c),
                        cell: OnceLock::new(),
                    })
                })
                .clone(),
            Err(e) => Arc::new(Slot {
                canonical: Err(e.clone()),
                cell: OnceLock::from(Err(Unusable::Missing(e))),
            }),
        };
        state
            .by_candidate
            .entry(candidate.to_path_buf())
            .or_insert(slot)
            .clone()
    }
}

/// One load's walk over the candidates (steps 5 and 6): each candidate is
/// opened at most once, and what was found on the way decides the error
/// when nothing has the code object.
pub(super) struct Search<'l> {
    loader: &'l Loader,
    key: &'l str,
    /// The binary's device digest, if its metadata carries one.
    digest: Option<&'l str>,
    /// Hand out code objects stored uncompressed as private mappings.
    zero_copy: bool,
    candidates: Vec<PathBuf>,
    /// Per candidate: not tried yet, or its archive (`None`: unusable or the
    /// same archive as an earlier candidate).
    opened: Vec<Option<Option<Arc<Opened>>>>,
    /// The first failure to read the code object from an archive that has it.
    read_error: Option<LoadError>,
    /// Whether some archive serves a requested target.
    target_matched: bool,
    /// What the search did, step by step, when asked (`kpack why`).
    trace: Option<&'l mut Trace>,
}

impl<'l> Search<'l> {
    pub(super) fn new(
        loader: &'l Loader,
        key: &'l str,
        digest: Option<&'l str>,
        candidates: Vec<PathBuf>,
        zero_copy: bool,
        trace: Option<&'l mut Trace>,
    ) -> Search<'l> {
        let mut trace = trace;
        if let Some(t) = trace.as_deref_mut() {
            t.candidates = candidates
                .iter()
                .map(|path| CandidateTrace {
                    path: path.clone(),
                    status: CandidateStatus::NotReached,
                })
                .collect();
        }
        Search {
            loader,
            key,
            digest,
            zero_copy,
            opened: vec![None; candidates.len()],
            candidates,
            read_error: None,
            target_matched: false,
            trace,
        }
    }

    /// Record one try of `target` on candidate `i`.
    fn attempted(&mut self, target: &TargetId, i: usize, outcome: AttemptOutcome) {
        if let Some(t) = self.trace.as_deref_mut() {
            t.attempts.push(Attempt {
                target: target.to_string(),
                candidate: i,
                outcome,
            });
        }
    }

    /// The code object for `target` from the first candidate that serves
    /// the target, has the key and reads, in a buffer from `alloc`, and
    /// where it was found. `Err` only when the buffer cannot be had.
    pub(super) fn find<B: AsMut<[u8]>>(
        &mut self,
        target: &TargetId,
        alloc: &mut impl FnMut(usize) -> Option<B>,
    ) -> Result<Option<(Loaded<B>, Hit)>, LoadError> {
        for i in 0..self.candidates.len() {
            let Some(archive) = self.candidate(i) else {
                continue;
            };
            let Some(spelling) = archive.serves(target) else {
                continue;
            };
            self.target_matched = true;
            self.loader.debug(format_args!(
                "  archive {} has architecture {spelling}",
                archive.path.display()
            ));
            let Some(entry) = archive.entry(self.key, spelling, target) else {
                self.not_here(ErrorCode::KernelNotFound, None);
                self.attempted(target, i, AttemptOutcome::KeyMissing);
                continue;
            };
            if let Err(m) = provenance::same_build(self.digest, entry) {
                // Another build's code: as if the key were missing.
                let why = format!(
                    "{}: {} for {spelling} is of another build: {m}",
                    archive.path.display(),
                    self.key
                );
                self.not_here(ErrorCode::KernelNotFound, Some(&why));
                let outcome = AttemptOutcome::OtherBuild {
                    binary: m.binary,
                    archive: m.archive,
                };
                self.attempted(target, i, outcome);
                continue;
            }
            match self.read(&archive, entry, spelling, alloc)? {
                Ok(buf) => {
                    let size = entry.original_size;
                    self.loader
                        .debug(format_args!("  found kernel: {size} bytes"));
                    self.attempted(target, i, AttemptOutcome::Loaded { size });
                    let hit = Hit {
                        archive: archive.path.clone(),
                        target: spelling.to_owned(),
                        triple: entry.metadata_str("target").map(str::to_owned),
                        same_build: self.digest.is_some()
                            && provenance::EntryDigests::of(entry).binary.as_deref() == self.digest,
                    };
                    return Ok(Some((buf, hit)));
                }
                Err(error) => self.attempted(target, i, AttemptOutcome::ReadFailed { error }),
            }
        }
        Ok(None)
    }

    /// The debug lines of a candidate that has the target but does not
    /// give the code object: the error (`KERNEL_NOT_FOUND` for a missing
    /// key) and, for a read error, why.
    fn not_here(&self, code: ErrorCode, why: Option<&str>) {
        self.loader.debug(format_args!(
            "  kernel not found in this archive (error {}), trying next candidate",
            code as i32
        ));
        if let Some(why) = why {
            self.loader.debug(format_args!("  ({why})"));
        }
    }

    /// The code object of `entry`, or (remembered) why it does not read.
    fn read<B: AsMut<[u8]>>(
        &mut self,
        archive: &Opened,
        entry: &Entry,
        spelling: &str,
        alloc: &mut impl FnMut(usize) -> Option<B>,
    ) -> Result<Result<Loaded<B>, String>, LoadError> {
        // Validate before allocating original_size bytes.
        if let Err(e) = archive.archive.check(entry) {
            return Ok(Err(self.failed(archive, spelling, e)));
        }
        let verify = |bytes: &[u8]| match self.loader.config.verify_digest {
            true => provenance::verify(entry, bytes),
            false => Ok(()),
        };
        if self.zero_copy {
            match archive.archive.map_code_object(entry) {
                Ok(Some(map)) => {
                    return Ok(match verify(&map) {
                        Ok(()) => Ok(Loaded::Mapped(map)),
                        Err(e) => Err(self.failed(archive, spelling, e)),
                    })
                }
                Ok(None) => {}
                Err(e) => return Ok(Err(self.failed(archive, spelling, e))),
            }
        }
        let size = entry.original_size;
        let out_of_memory = || LoadError::OutOfMemory {
            key: self.key.to_owned(),
            size,
        };
        let len = usize::try_from(size).map_err(|_| out_of_memory())?;
        let mut buf = alloc(len).ok_or_else(out_of_memory)?;
        match archive
            .archive
            .read_into(entry, buf.as_mut())
            .and_then(|()| verify(buf.as_mut()))
        {
            Ok(()) => Ok(Ok(Loaded::Buffer(buf))),
            Err(e) => Ok(Err(self.failed(archive, spelling, e))),
        }
    }

    /// Remember the first read error; returns its message.
    fn failed(
        &mut self,
        archive: &Opened,
        spelling: &str,
        e: crate::archive::ArchiveError,
    ) -> String {
        let why = e.to_string();
        self.not_here(
            ErrorCode::of_read(&e),
            Some(&format!(
                "{}: reading {} for {spelling}: {why}",
                archive.path.display(),
                self.key
            )),
        );
        self.read_error.get_or_insert(LoadError::Read {
            path: archive.path.clone(),
            source: e,
        });
        why
    }

    /// Why nothing was found: a read error, else a missing key, else no
    /// target served, else no archive at all.
    pub(super) fn verdict(mut self, archs: &[&str]) -> LoadError {
        // Every candidate counts, also when no target was tried (e.g. no
        // architecture parsed).
        let mut any_open = false;
        for i in 0..self.candidates.len() {
            any_open |= self.candidate(i).is_some();
        }
        let key = self.key.to_owned();
        let archs: Vec<String> = archs.iter().map(|a| a.to_string()).collect();
        if let Some(e) = self.read_error {
            e
        } else if self.target_matched {
            LoadError::KernelNotFound { key, archs }
        } else if any_open {
            LoadError::ArchNotFound { key, archs }
        } else {
            LoadError::ArchiveNotFound {
                key,
                candidates: self.candidates,
            }
        }
    }

    /// Candidate `i`, opened on first use; `None` when it cannot be used or
    /// is the same archive as an earlier one.
    fn candidate(&mut self, i: usize) -> Option<Arc<Opened>> {
        if self.opened[i].is_none() {
            let archive = self.loader.archive(&self.candidates[i]);
            match &archive {
                Ok(_) => {}
                Err(Unusable::Missing(why)) => {
                    let path = self.candidates[i].display();
                    self.loader.debug(format_args!("archive not found: {path}"));
                    self.loader.debug(format_args!("  ({why})"));
                }
                Err(Unusable::Failed(code, why)) => {
                    let path = self.candidates[i].display();
                    self.loader.debug(format_args!(
                        "failed to open archive: {path} (error {})",
                        *code as i32
                    ));
                    self.loader.debug(format_args!("  ({why})"));
                }
            }
            // The same archive under another name was already searched.
            let seen = archive.as_ref().ok().and_then(|a| {
                self.opened[..i]
                    .iter()
                    .position(|o| matches!(o, Some(Some(b)) if Arc::ptr_eq(a, b)))
            });
            if let Some(t) = self.trace.as_deref_mut() {
                t.candidates[i].status = match (&archive, seen) {
                    (_, Some(candidate)) => CandidateStatus::SameAs { candidate },
                    (Ok(a), None) => CandidateStatus::Opened {
                        canonical: a.path.clone(),
                        targets: a.archive.gfx_arches().to_vec(),
                    },
                    (Err(Unusable::Missing(error)), None) => CandidateStatus::Missing {
                        error: error.clone(),
                    },
                    (Err(Unusable::Failed(_, error)), None) => CandidateStatus::Unusable {
                        error: error.clone(),
                    },
                };
            }
            self.opened[i] = Some(if seen.is_some() { None } else { archive.ok() });
        }
        self.opened[i].clone().flatten()
    }
}

/// The archive files a search path names, relative to `base` unless
/// absolute; a `@GFXARCH@` in the file name matches any text (every file
/// of that directory whose name fits, sorted).
pub fn archives_on_search_path(base: &Path, pattern: &str) -> Vec<PathBuf> {
    let full = if Path::new(pattern).is_absolute() {
        PathBuf::from(pattern)
    } else {
        base.join(pattern)
    };
    let Some(name) = full.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Vec::new();
    };
    let Some((pre, post)) = name.split_once(GFXARCH) else {
        return if full.is_file() {
            vec![full]
        } else {
            Vec::new()
        };
    };
    let dir = match full.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.len() > pre.len() + post.len() && n.starts_with(pre) && n.ends_with(post)
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}
