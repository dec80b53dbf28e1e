//! The runtime loader (SPEC §4): given the HIPK metadata of an offloaded
//! binary, the binary's path, a code object index and the agents'
//! architectures, find the code object in `.kpack` archives.
//!
//! This is the whole search logic of `kpack_load_code_object`, as a safe
//! Rust API; the C API in `kpack-cxx` only checks pointers and maps errors.
//!
//! - [`Config`] holds the environment (`ROCM_KPACK_*`), read once.
//! - [`Loader`] is the cache: archives are opened lazily, once, keyed by
//!   canonical path, and shared between threads (`Loader` is `Send + Sync`).
//! - [`discover_binary_path`] finds the file mapped at an address (Linux:
//!   `/proc/self/maps`); [`find_mapping`] is its pure parser.
//!
//! Search order (SPEC §4 step 6): for each requested architecture in order,
//! for each compatible target (most specific first), for each candidate
//! archive that lists the target in `gfx_arches`, try the key
//! `kernel_name#co_index`. An archive that has the target but not the key,
//! or fails to read it, does not end the search: the next candidate is
//! tried.
//!
//! ```no_run
//! # use kpack_core::loader::Loader;
//! # use std::path::Path;
//! # let metadata: &[u8] = &[];
//! let loader = Loader::from_env();
//! let code = loader.load_code_object(
//!     metadata,
//!     Path::new("/opt/rocm/lib/librocblas.so.4"),
//!     0,
//!     &["amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", "gfx9-4-generic:sramecc+:xnack-"],
//! )?;
//! # Ok::<(), kpack_core::loader::LoadError>(())
//! ```

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use crate::archive::{Archive, ArchiveError, Entry};
use crate::hipk::{HipkError, HipkMetadata, MAX_METADATA_SIZE};
use crate::msgpack::DecodeError;
use crate::target::{TargetId, AGENT_ISA_PREFIX};

/// Set (non-empty, not starting with `0`): every load fails with
/// [`LoadError::Disabled`].
pub const ENV_DISABLE: &str = "ROCM_KPACK_DISABLE";
/// Set (same rule): diagnostic lines `kpack: ...` on stderr.
pub const ENV_DEBUG: &str = "ROCM_KPACK_DEBUG";
/// Archive paths that replace the embedded search paths.
pub const ENV_PATH: &str = "ROCM_KPACK_PATH";
/// Archive paths searched before the embedded search paths.
pub const ENV_PATH_PREFIX: &str = "ROCM_KPACK_PATH_PREFIX";
/// Stands for a target ID in embedded search paths.
pub const GFXARCH: &str = "@GFXARCH@";

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
}

impl Config {
    /// Read the `ROCM_KPACK_*` variables of this process.
    pub fn from_env() -> Config {
        Config::from_vars(|name| std::env::var_os(name))
    }

    /// Build a configuration from a variable lookup (`name -> value`).
    pub fn from_vars(mut var: impl FnMut(&str) -> Option<OsString>) -> Config {
        let list = path_list(var(ENV_PATH).as_deref());
        Config {
            disabled: flag_is_set(var(ENV_DISABLE).as_deref()),
            debug: flag_is_set(var(ENV_DEBUG).as_deref()),
            path_override: (!list.is_empty()).then_some(list),
            path_prefix: path_list(var(ENV_PATH_PREFIX).as_deref()),
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

/// Split a path list (`:`-separated; `;` on Windows), dropping empty
/// components.
pub fn path_list(value: Option<&OsStr>) -> Vec<PathBuf> {
    match value {
        Some(v) => std::env::split_paths(v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect(),
        None => Vec::new(),
    }
}

/// Why a code object could not be loaded. Each variant is one error code of
/// the C API.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// No architecture was given (`INVALID_ARGUMENT`).
    #[error("no architecture given")]
    NoArchitectures,
    /// `ROCM_KPACK_DISABLE` was set when the loader was created
    /// (`NOT_IMPLEMENTED`).
    #[error("kpack is disabled by {ENV_DISABLE}")]
    Disabled,
    /// The HIPK metadata is not valid (`INVALID_METADATA`).
    #[error(transparent)]
    Metadata(#[from] HipkError),
    /// An archive that lists a matching target failed to read the code
    /// object (`DECOMPRESSION_FAILED`, or `IO_ERROR` for
    /// [`ArchiveError::Io`]), and no other candidate had it.
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: ArchiveError,
    },
    /// Some archive lists a matching target, but none has the key
    /// (`KERNEL_NOT_FOUND`).
    #[error("no code object {key} for {} in the archives that serve those targets", archs.join(", "))]
    KernelNotFound { key: String, archs: Vec<String> },
    /// Archives opened, but none lists a target compatible with the
    /// requested architectures (`ARCH_NOT_FOUND`).
    #[error("{key}: no archive serves {}", archs.join(", "))]
    ArchNotFound { key: String, archs: Vec<String> },
    /// No candidate archive could be opened (`ARCHIVE_NOT_FOUND`).
    #[error("{key}: none of {} candidate archive(s) could be opened", candidates.len())]
    ArchiveNotFound {
        key: String,
        candidates: Vec<PathBuf>,
    },
    /// The buffer for the code object could not be allocated
    /// (`OUT_OF_MEMORY`).
    #[error("{key}: cannot allocate {size} bytes")]
    OutOfMemory { key: String, size: u64 },
}

/// Where a debug line goes.
type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// An archive the loader opened, with its `gfx_arches` parsed once.
struct Opened {
    path: PathBuf,
    archive: Archive,
    /// `(parsed, as written)` for each `gfx_arches` entry that parses.
    targets: Vec<(TargetId, String)>,
}

impl Opened {
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

/// One archive, opened at most once. `canonical` is `None` when the
/// candidate path does not resolve (the cell then holds `None`).
struct Slot {
    canonical: Option<PathBuf>,
    cell: OnceLock<Option<Arc<Opened>>>,
}

#[derive(Default)]
struct State {
    /// Candidate path as built -> its archive.
    by_candidate: HashMap<PathBuf, Arc<Slot>>,
    /// Canonical path -> its archive (shared by every candidate naming it).
    by_canonical: HashMap<PathBuf, Arc<Slot>>,
}

/// The loader and its archive cache (the C API's `kpack_cache_t`).
///
/// Thread-safe: any number of threads may load through one `Loader`.
/// Archives are opened on first use, once, and stay open (memory-mapped)
/// until the loader is dropped. A candidate path that did not resolve or
/// failed to open is remembered as such and not retried by this loader.
pub struct Loader {
    config: Config,
    log: Option<LogSink>,
    state: Mutex<State>,
}

impl fmt::Debug for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loader")
            .field("config", &self.config)
            .field("open_archives", &self.open_archives())
            .finish()
    }
}

impl Loader {
    /// A loader configured from the environment (read now, once).
    pub fn from_env() -> Loader {
        Loader::new(Config::from_env())
    }

    /// A loader with an explicit configuration.
    pub fn new(config: Config) -> Loader {
        let loader = Loader {
            config,
            log: None,
            state: Mutex::new(State::default()),
        };
        loader.created();
        loader
    }

    /// A loader whose debug lines (when `config.debug`) go to `sink`
    /// instead of stderr; for tests and embedders with their own logging.
    pub fn with_log_sink(config: Config, sink: impl Fn(&str) + Send + Sync + 'static) -> Loader {
        let loader = Loader {
            config,
            log: Some(Arc::new(sink)),
            state: Mutex::new(State::default()),
        };
        loader.created();
        loader
    }

    fn created(&self) {
        let c = &self.config;
        self.debug(format_args!(
            "cache created: disabled={}, {}={}, {}={}",
            c.disabled,
            ENV_PATH,
            c.path_override
                .as_ref()
                .map_or_else(|| "(unset)".to_string(), |l| show_paths(l)),
            ENV_PATH_PREFIX,
            show_paths(&c.path_prefix),
        ));
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Canonical paths of the archives opened so far, sorted.
    pub fn open_archives(&self) -> Vec<PathBuf> {
        let state = self.lock();
        let mut v: Vec<PathBuf> = state
            .by_canonical
            .iter()
            .filter(|(_, slot)| matches!(slot.cell.get(), Some(Some(_))))
            .map(|(p, _)| p.clone())
            .collect();
        v.sort();
        v
    }

    /// Load the code object `kernel_name#co_index` described by the HIPK
    /// metadata `metadata` (its bytes; bytes after the map are ignored) of
    /// the binary at `binary_path`, for the first architecture of `archs`
    /// (in priority order) that some archive serves.
    pub fn load_code_object(
        &self,
        metadata: &[u8],
        binary_path: &Path,
        co_index: u32,
        archs: &[&str],
    ) -> Result<Vec<u8>, LoadError> {
        self.load_with(
            || HipkMetadata::decode(metadata),
            binary_path,
            co_index,
            archs,
            |size| {
                let mut v = Vec::new();
                v.try_reserve_exact(size).ok()?;
                v.resize(size, 0);
                Some(v)
            },
        )
    }

    /// [`Loader::load_code_object`] with the metadata decoded on demand
    /// (after the argument and `ROCM_KPACK_DISABLE` checks, as SPEC §4
    /// orders them) and the output buffer made by `alloc(size)`, which must
    /// return a buffer of exactly `size` bytes, or `None` when out of
    /// memory. The code object is read straight into that buffer.
    pub fn load_with<B: AsMut<[u8]>>(
        &self,
        metadata: impl FnOnce() -> Result<HipkMetadata, HipkError>,
        binary_path: &Path,
        co_index: u32,
        archs: &[&str],
        mut alloc: impl FnMut(usize) -> Option<B>,
    ) -> Result<B, LoadError> {
        // Step 1.
        if archs.is_empty() {
            return Err(LoadError::NoArchitectures);
        }
        if self.config.disabled {
            self.debug(format_args!("disabled by {ENV_DISABLE}"));
            return Err(LoadError::Disabled);
        }
        // Steps 2 and 3.
        let metadata = metadata().inspect_err(|e| self.debug(format_args!("{e}")))?;
        let key = format!("{}#{}", metadata.kernel_name, co_index);
        self.debug(format_args!(
            "load {key} for {} (binary {})",
            archs.join(", "),
            binary_path.display()
        ));
        let agents = self.agents(archs);
        // Step 4.
        let candidates = self.candidates(&metadata, binary_path, &agents);
        // Steps 5 and 6.
        let mut opened: Vec<Option<Option<Arc<Opened>>>> = vec![None; candidates.len()];
        let mut read_error: Option<LoadError> = None;
        let mut target_matched = false;
        for (_, targets) in &agents {
            for target in targets {
                for i in 0..candidates.len() {
                    let Some(archive) = self.candidate(&candidates, &mut opened, i) else {
                        continue;
                    };
                    let Some(spelling) = archive.serves(target) else {
                        continue;
                    };
                    target_matched = true;
                    let Some(entry) = archive.entry(&key, spelling, target) else {
                        self.debug(format_args!(
                            "{}: has {spelling} but not {key}",
                            archive.path.display()
                        ));
                        continue;
                    };
                    // Validate before allocating original_size bytes.
                    if let Err(e) = archive.archive.check(entry) {
                        self.debug(format_args!(
                            "{}: reading {key} for {spelling} failed: {e}",
                            archive.path.display()
                        ));
                        read_error.get_or_insert(LoadError::Read {
                            path: archive.path.clone(),
                            source: e,
                        });
                        continue;
                    }
                    let size = entry.original_size;
                    let out_of_memory = || LoadError::OutOfMemory {
                        key: key.clone(),
                        size,
                    };
                    let len = usize::try_from(size).map_err(|_| out_of_memory())?;
                    let mut buf = alloc(len).ok_or_else(out_of_memory)?;
                    match archive.archive.read_into(entry, buf.as_mut()) {
                        Ok(()) => {
                            self.debug(format_args!(
                                "loaded {key} for {spelling} from {} ({size} bytes)",
                                archive.path.display()
                            ));
                            return Ok(buf);
                        }
                        Err(e) => {
                            self.debug(format_args!(
                                "{}: reading {key} for {spelling} failed: {e}",
                                archive.path.display()
                            ));
                            read_error.get_or_insert(LoadError::Read {
                                path: archive.path.clone(),
                                source: e,
                            });
                        }
                    }
                }
            }
        }
        // Every candidate counts for the verdict, also when no target was
        // tried (e.g. no architecture parsed).
        let mut any_open = false;
        for i in 0..candidates.len() {
            any_open |= self.candidate(&candidates, &mut opened, i).is_some();
        }
        let archs: Vec<String> = archs.iter().map(|a| a.to_string()).collect();
        let err = if let Some(e) = read_error {
            e
        } else if target_matched {
            LoadError::KernelNotFound { key, archs }
        } else if any_open {
            LoadError::ArchNotFound { key, archs }
        } else {
            LoadError::ArchiveNotFound { key, candidates }
        };
        self.debug(format_args!("{err}"));
        Err(err)
    }

    /// The compatible targets of each requested architecture, most
    /// specific first; architectures that are not target IDs are skipped.
    fn agents<'a>(&self, archs: &[&'a str]) -> Vec<(&'a str, Vec<TargetId>)> {
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
    fn candidates(
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
            paths.iter().cloned().for_each(push);
            return out;
        }
        self.config.path_prefix.iter().cloned().for_each(&mut push);
        let dir = binary_path.parent().unwrap_or(Path::new(""));
        for path in &metadata.search_paths {
            if path.contains(GFXARCH) {
                for target in agents.iter().flat_map(|(_, t)| t) {
                    push(dir.join(path.replace(GFXARCH, &target.to_string())));
                }
            } else {
                push(dir.join(path));
            }
        }
        out
    }

    /// Candidate `i`, opened on first use (memoized in `opened`); `None`
    /// when it cannot be used or is the same archive as an earlier one.
    fn candidate(
        &self,
        candidates: &[PathBuf],
        opened: &mut [Option<Option<Arc<Opened>>>],
        i: usize,
    ) -> Option<Arc<Opened>> {
        if opened[i].is_none() {
            let archive = self.archive(&candidates[i]);
            // The same archive under another name was already searched.
            let seen = archive.as_ref().is_some_and(|a| {
                opened[..i]
                    .iter()
                    .any(|o| matches!(o, Some(Some(b)) if Arc::ptr_eq(a, b)))
            });
            opened[i] = Some(if seen { None } else { archive });
        }
        opened[i].clone().flatten()
    }

    /// The archive at `candidate`, opened once per canonical path.
    fn archive(&self, candidate: &Path) -> Option<Arc<Opened>> {
        let known = self.lock().by_candidate.get(candidate).cloned();
        let slot = match known {
            Some(slot) => slot,
            None => self.resolve(candidate),
        };
        slot.cell
            .get_or_init(|| {
                let path = slot.canonical.as_deref()?;
                match Archive::open(path) {
                    Ok(archive) => {
                        self.debug(format_args!(
                            "opened archive {}: targets [{}], {} code objects",
                            path.display(),
                            archive.gfx_arches().join(", "),
                            archive.kernel_count()
                        ));
                        let targets = archive
                            .gfx_arches()
                            .iter()
                            .filter_map(|a| TargetId::parse(a).ok().map(|t| (t, a.clone())))
                            .collect();
                        Some(Arc::new(Opened {
                            path: path.to_path_buf(),
                            archive,
                            targets,
                        }))
                    }
                    Err(e) => {
                        self.debug(format_args!("skipping archive: {e}"));
                        None
                    }
                }
            })
            .clone()
    }

    /// Map `candidate` to the slot of its canonical path (shared with other
    /// names of the same file), remembering the answer.
    fn resolve(&self, candidate: &Path) -> Arc<Slot> {
        let canonical = match std::fs::canonicalize(candidate) {
            Ok(c) => Some(c),
            Err(e) => {
                self.debug(format_args!(
                    "skipping archive {}: {e}",
                    candidate.display()
                ));
                None
            }
        };
        let mut state = self.lock();
        let slot = match canonical {
            Some(c) => state
                .by_canonical
                .entry(c.clone())
                .or_insert_with(|| {
                    Arc::new(Slot {
                        canonical: Some(c),
                        cell: OnceLock::new(),
                    })
                })
                .clone(),
            None => Arc::new(Slot {
                canonical: None,
                cell: OnceLock::from(None),
            }),
        };
        state
            .by_candidate
            .entry(candidate.to_path_buf())
            .or_insert(slot)
            .clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked: every
        // update is a single insert.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Write one diagnostic line `kpack: ...` when debugging is on.
    fn debug(&self, args: fmt::Arguments<'_>) {
        if !self.config.debug {
            return;
        }
        let line = format!("kpack: {args}");
        match &self.log {
            Some(sink) => sink(&line),
            None => {
                // One write per line so that threads do not interleave;
                // a failing stderr is not the loader's problem.
                let _ = writeln!(std::io::stderr().lock(), "{line}");
            }
        }
    }
}

fn show_paths(paths: &[PathBuf]) -> String {
    let v: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    format!("[{}]", v.join(", "))
}

/// Decode HIPK metadata of unknown length through `window`, where
/// `window(n)` returns the first `n` bytes of the metadata.
///
/// For a caller that has only a pointer (the C API): the window grows only
/// by as many bytes as the decoder proves it needs, so for valid metadata no
/// byte past its end is ever requested, and never more than
/// [`MAX_METADATA_SIZE`] bytes in all. If `window` returns fewer than `n`
/// bytes, decoding stops with what it got.
pub fn decode_metadata_window<'a>(
    mut window: impl FnMut(usize) -> &'a [u8],
) -> Result<HipkMetadata, HipkError> {
    let mut len = 1;
    loop {
        let bytes = window(len);
        let result = HipkMetadata::decode(bytes);
        match result {
            Err(HipkError::Msgpack(DecodeError::Truncated { needed, .. }))
                if bytes.len() >= len && len < MAX_METADATA_SIZE =>
            {
                let needed = usize::try_from(needed).unwrap_or(usize::MAX).max(1);
                len = len.saturating_add(needed).min(MAX_METADATA_SIZE);
            }
            other => return other,
        }
    }
}

/// A file mapped into this process, as [`discover_binary_path`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    /// The file's path, without the ` (deleted)` suffix Linux appends to
    /// files removed or replaced since they were mapped.
    pub path: PathBuf,
    /// The address's offset in the file.
    pub offset: u64,
}

/// Why [`discover_binary_path`] failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("cannot read /proc/self/maps: {0}")]
    Io(#[from] std::io::Error),
    #[error("address {0:#x} is not in a file mapping")]
    NotMapped(usize),
    #[error("binary path discovery is not implemented on this platform")]
    Unsupported,
}

/// The file mapped at `address` in this process, and the address's offset
/// in it (Linux: from `/proc/self/maps`, which unlike `dladdr` also covers
/// data addresses).
pub fn discover_binary_path(address: usize) -> Result<MappedFile, DiscoverError> {
    if cfg!(target_os = "linux") {
        let maps = std::fs::read("/proc/self/maps")?;
        find_mapping(&maps, address as u64).ok_or(DiscoverError::NotMapped(address))
    } else {
        Err(DiscoverError::Unsupported)
    }
}

/// The file mapping of `/proc/<pid>/maps` text (`maps`) that contains
/// `address`; `None` when no mapping contains it or the one that does is
/// not a file (anonymous memory, `[heap]`, `[stack]`, ...).
pub fn find_mapping(maps: &[u8], address: u64) -> Option<MappedFile> {
    maps.split(|&b| b == b'\n')
        .filter_map(parse_maps_line)
        .find(|m| m.start <= address && address < m.end)
        .and_then(|m| {
            let path = m.path.strip_suffix(b" (deleted)").unwrap_or(m.path);
            if path.is_empty() || path.starts_with(b"[") {
                return None;
            }
            Some(MappedFile {
                path: bytes_to_path(path),
                offset: m.offset.checked_add(address - m.start)?,
            })
        })
}

struct MapsLine<'a> {
    start: u64,
    end: u64,
    offset: u64,
    path: &'a [u8],
}

/// `start-end perms offset dev inode [path]`; the path is the rest of the
/// line after the blanks that follow the inode (it may contain spaces).
fn parse_maps_line(line: &[u8]) -> Option<MapsLine<'_>> {
    fn field<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
        let s = rest.trim_ascii_start();
        let end = s.iter().position(|&b| b == b' ').unwrap_or(s.len());
        let (f, r) = s.split_at(end);
        *rest = r;
        (!f.is_empty()).then_some(f)
    }
    fn hex(b: &[u8]) -> Option<u64> {
        u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok()
    }
    let mut rest = line;
    let range = field(&mut rest)?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let (start, end) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
    let _perms = field(&mut rest)?;
    let offset = hex(field(&mut rest)?)?;
    let _dev = field(&mut rest)?;
    let _inode = field(&mut rest)?;
    Some(MapsLine {
        start,
        end,
        offset,
        path: rest.trim_ascii_start(),
    })
}

#[cfg(unix)]
fn bytes_to_path(b: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(OsStr::from_bytes(b))
}

#[cfg(not(unix))]
fn bytes_to_path(b: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(b).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::ArchiveWriter;
    use std::sync::Mutex as StdMutex;

    fn meta(kernel_name: &str, paths: &[&str]) -> Vec<u8> {
        HipkMetadata {
            kernel_name: kernel_name.into(),
            search_paths: paths.iter().map(|p| p.to_string()).collect(),
        }
        .encode()
    }

    fn code(key: &str, target: &str) -> Vec<u8> {
        format!("code object {key} for {target}").into_bytes()
    }

    /// Write an archive serving `arches` with `kernels` = (key, target).
    fn write_archive(path: &Path, arches: &[&str], kernels: &[(&str, &str)]) {
        let mut w = ArchiveWriter::new(
            "lib",
            arches[0],
            arches.iter().map(|a| a.to_string()).collect(),
        );
        for (k, t) in kernels {
            w.add(*k, *t, code(k, t), None).unwrap();
        }
        w.write(path).unwrap();
    }

    fn quiet() -> Loader {
        Loader::new(Config::default())
    }

    /// A loader that records its debug lines.
    fn recording(mut config: Config) -> (Loader, Arc<StdMutex<Vec<String>>>) {
        config.debug = true;
        let lines = Arc::new(StdMutex::new(Vec::new()));
        let sink = lines.clone();
        let loader = Loader::with_log_sink(config, move |l| sink.lock().unwrap().push(l.into()));
        (loader, lines)
    }

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
        ]);
        assert!(c.disabled && !c.debug);
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

    const MAPS: &str = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 1311 /usr/bin/cat
55d0c0a02000-55d0c0a07000 r-xp 00002000 08:01 1311 /usr/bin/cat
55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000010000 r--p 00010000 fd:00 42   /opt/rocm/lib/lib with space.so
7f0000010000-7f0000020000 r--p 00004000 fd:00 43   /tmp/replaced.so (deleted)
7f0000020000-7f0000030000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn maps_parsing() {
        let find = |a: u64| find_mapping(MAPS.as_bytes(), a);
        assert_eq!(
            find(0x55d0c0a03010),
            Some(MappedFile {
                path: "/usr/bin/cat".into(),
                offset: 0x3010
            })
        );
        assert_eq!(find(0x55d0c0a00000).unwrap().offset, 0);
        assert_eq!(
            find(0x7f000000ffff),
            Some(MappedFile {
                path: "/opt/rocm/lib/lib with space.so".into(),
                offset: 0x1ffff
            })
        );
        // " (deleted)" is not part of the path.
        assert_eq!(
            find(0x7f0000010008),
            Some(MappedFile {
                path: "/tmp/replaced.so".into(),
                offset: 0x4008
            })
        );
        // Heap, stack, anonymous memory, unmapped addresses.
        for a in [
            0x55d0c1000010,
            0x7ffd00000100,
            0x7f0000020000,
            0x1000,
            0x55d0c0a07000,
        ] {
            assert_eq!(find(a), None, "{a:#x}");
        }
        // Junk lines are skipped.
        let junk = b"garbage\n\nzz-10 r--p 0 0 0 /x\n1000-2000 r--p 0 08:01 1 /ok\n";
        assert_eq!(find_mapping(junk, 0x1800).unwrap().path, Path::new("/ok"));
    }

    #[test]
    fn discovers_own_binary() {
        static MARKER: u8 = 7;
        let m = discover_binary_path(&MARKER as *const u8 as usize).unwrap();
        assert_eq!(
            std::fs::canonicalize(&m.path).unwrap(),
            std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap()
        );
        let local = 0u8;
        assert!(matches!(
            discover_binary_path(&local as *const u8 as usize),
            Err(DiscoverError::NotMapped(_))
        ));
    }

    #[test]
    fn metadata_window_reads_no_byte_past_the_map() {
        let m = meta("lib/libfoo.so", &["../.kpack/foo_@GFXARCH@.kpack", "x"]);
        let mut padded = m.clone();
        padded.extend_from_slice(&[0xc1; 100]);
        let mut max_asked = 0;
        let got = decode_metadata_window(|n| {
            max_asked = max_asked.max(n);
            &padded[..n]
        })
        .unwrap();
        assert_eq!(got.kernel_name, "lib/libfoo.so");
        assert_eq!(max_asked, m.len());
        // Garbage: an error, never more than 64 KiB asked for.
        let junk = vec![0xdfu8; 2 * MAX_METADATA_SIZE];
        let mut asked = 0;
        assert!(decode_metadata_window(|n| {
            asked = asked.max(n);
            &junk[..n]
        })
        .is_err());
        assert!(asked <= MAX_METADATA_SIZE);
        // A short window ends the search.
        assert!(matches!(
            decode_metadata_window(|n| &m[..n.min(5)]),
            Err(HipkError::Msgpack(DecodeError::Truncated { .. }))
        ));
        // Not a map.
        assert!(matches!(
            decode_metadata_window(|n| &b"\x93\x01\x02\x03"[..n]),
            Err(HipkError::NotAMap { .. })
        ));
    }

    #[test]
    fn argument_disable_and_metadata_errors() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin/app");
        let m = meta("bin/app", &["../a.kpack"]);
        assert!(matches!(
            quiet().load_code_object(&m, &bin, 0, &[]),
            Err(LoadError::NoArchitectures)
        ));
        let disabled = Loader::new(Config {
            disabled: true,
            ..Config::default()
        });
        assert!(matches!(
            disabled.load_code_object(&m, &bin, 0, &["gfx900"]),
            Err(LoadError::Disabled)
        ));
        // Disabled wins over bad metadata (step 1 before step 2).
        assert!(matches!(
            disabled.load_code_object(b"junk", &bin, 0, &["gfx900"]),
            Err(LoadError::Disabled)
        ));
        for bad in [
            &b""[..],
            b"\xc1",
            b"\x90",
            &HipkMetadata {
                kernel_name: "x".into(),
                search_paths: vec![],
            }
            .encode(),
        ] {
            assert!(matches!(
                quiet().load_code_object(bad, &bin, 0, &["gfx900"]),
                Err(LoadError::Metadata(_))
            ));
        }
    }

    /// The PyTorch case: `lib_gfx90a:xnack-.kpack` holds some code objects,
    /// `lib_gfx90a.kpack` all; an `xnack-` agent gets every one.
    #[test]
    fn falls_through_to_the_next_archive() {
        let dir = tempfile::tempdir().unwrap();
        let kp = dir.path().join(".kpack");
        std::fs::create_dir_all(&kp).unwrap();
        std::fs::create_dir_all(dir.path().join("lib")).unwrap();
        write_archive(
            &kp.join("lib_gfx90a:xnack-.kpack"),
            &["gfx90a:xnack-"],
            &[("lib/libtorch.so#0", "gfx90a:xnack-")],
        );
        write_archive(
            &kp.join("lib_gfx90a.kpack"),
            &["gfx90a"],
            &[
                ("lib/libtorch.so#0", "gfx90a"),
                ("lib/libtorch.so#1", "gfx90a"),
                ("lib/libtorch.so#2", "gfx90a"),
            ],
        );
        let bin = dir.path().join("lib/libtorch.so");
        let m = meta("lib/libtorch.so", &["../.kpack/lib_@GFXARCH@.kpack"]);
        let (loader, lines) = recording(Config::default());
        let agent = "amdgcn-amd-amdhsa--gfx90a:xnack-";
        assert_eq!(
            loader.load_code_object(&m, &bin, 0, &[agent]).unwrap(),
            code("lib/libtorch.so#0", "gfx90a:xnack-")
        );
        for i in 1..3 {
            let key = format!("lib/libtorch.so#{i}");
            assert_eq!(
                loader.load_code_object(&m, &bin, i, &[agent]).unwrap(),
                code(&key, "gfx90a")
            );
        }
        assert!(matches!(
            loader.load_code_object(&m, &bin, 3, &[agent]),
            Err(LoadError::KernelNotFound { ref key, .. }) if key == "lib/libtorch.so#3"
        ));
        // Each archive opened once.
        assert_eq!(loader.open_archives().len(), 2);
        let lines = lines.lock().unwrap();
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.contains("opened archive"))
                .count(),
            2
        );
        assert!(lines.iter().all(|l| l.starts_with("kpack: ")));
        assert!(lines
            .iter()
            .any(|l| l.contains("has gfx90a:xnack- but not lib/libtorch.so#1")));
        // An xnack+ agent never takes xnack- code.
        let plus = quiet()
            .load_code_object(&m, &bin, 0, &["gfx90a:xnack+"])
            .unwrap();
        assert_eq!(plus, code("lib/libtorch.so#0", "gfx90a"));
    }

    #[test]
    fn targets_in_priority_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("all.kpack");
        write_archive(
            &a,
            &[
                "gfx942",
                "gfx942:sramecc+",
                "gfx942:xnack-",
                "gfx9-4-generic",
            ],
            &[
                ("k#0", "gfx942"),
                ("k#0", "gfx942:sramecc+"),
                ("k#1", "gfx942"),
                ("k#1", "gfx942:xnack-"),
                ("k#2", "gfx9-4-generic"),
                ("k#3", "gfx942"),
            ],
        );
        let m = meta("k", &[a.to_str().unwrap()]);
        let bin = dir.path().join("k");
        let l = quiet();
        let agent = [
            "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-",
            "gfx9-4-generic",
        ];
        let get = |i: u32, archs: &[&str]| l.load_code_object(&m, &bin, i, archs);
        assert_eq!(get(0, &agent).unwrap(), code("k#0", "gfx942:sramecc+"));
        assert_eq!(get(1, &agent).unwrap(), code("k#1", "gfx942:xnack-"));
        // The generic target only as the caller's second choice.
        assert_eq!(get(2, &agent).unwrap(), code("k#2", "gfx9-4-generic"));
        assert!(matches!(
            get(2, &agent[..1]),
            Err(LoadError::KernelNotFound { .. })
        ));
        assert_eq!(get(3, &agent).unwrap(), code("k#3", "gfx942"));
        // Another processor: the archive opened, no target matched.
        assert!(matches!(
            get(0, &["gfx1100"]),
            Err(LoadError::ArchNotFound { .. })
        ));
        // Not a target ID at all: skipped.
        assert!(matches!(
            get(0, &["sm_90", "gfx942"]),
            Ok(ref v) if *v == code("k#0", "gfx942")
        ));
    }

    #[test]
    fn error_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.kpack");
        write_archive(&good, &["gfx1100"], &[("k#0", "gfx1100")]);
        // An archive whose only frame is damaged.
        let bad = dir.path().join("bad.kpack");
        let mut w = ArchiveWriter::new("lib", "gfx1100", vec!["gfx1100".into()]);
        w.add("k#0", "gfx1100", vec![7u8; 4000], None).unwrap();
        w.add("k#1", "gfx1100", vec![8u8; 4000], None).unwrap();
        let mut bytes = w.to_vec().unwrap();
        let len0 = u32::from_le_bytes(bytes[68..72].try_into().unwrap()) as usize;
        bytes[72 + len0 - 1] ^= 0xff;
        std::fs::write(&bad, &bytes).unwrap();
        let bin = dir.path().join("x");
        let load =
            |paths: &[&str], i| quiet().load_code_object(&meta("k", paths), &bin, i, &["gfx1100"]);
        // A read error on one archive moves on to the next...
        assert_eq!(
            load(&["bad.kpack", "good.kpack"], 0).unwrap(),
            code("k#0", "gfx1100")
        );
        // ...and is what is reported when nothing else has it.
        assert!(load(&["missing.kpack", "bad.kpack", "good.kpack"], 0).is_ok());
        match load(&["bad.kpack"], 0) {
            Err(LoadError::Read {
                path,
                source: ArchiveError::Decompress { .. },
            }) => {
                assert_eq!(path, std::fs::canonicalize(&bad).unwrap())
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(load(&["bad.kpack"], 1).unwrap(), vec![8u8; 4000]);
        assert!(matches!(
            load(&["good.kpack", "bad.kpack"], 5),
            Err(LoadError::KernelNotFound { .. })
        ));
        // A file that is not an archive is skipped like a missing one.
        std::fs::write(dir.path().join("junk.kpack"), b"not an archive").unwrap();
        match load(&["missing.kpack", "junk.kpack"], 0) {
            Err(LoadError::ArchiveNotFound { candidates, .. }) => {
                assert_eq!(candidates.len(), 2);
                assert!(candidates[0].ends_with("missing.kpack"));
            }
            other => panic!("{other:?}"),
        }
        let l = quiet();
        assert!(matches!(
            l.load_code_object(&meta("k", &["good.kpack"]), &bin, 0, &["gfx90a"]),
            Err(LoadError::ArchNotFound { .. })
        ));
    }

    #[test]
    fn override_and_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let embedded = dir.path().join("lib_gfx1100.kpack");
        let extra = dir.path().join("extra.kpack");
        write_archive(
            &embedded,
            &["gfx1100"],
            &[("k#0", "gfx1100"), ("k#1", "gfx1100")],
        );
        write_archive(&extra, &["gfx1100"], &[("k#0", "gfx1100")]);
        // Make the extra archive's code object distinguishable.
        let mut w = ArchiveWriter::new("x", "gfx1100", vec!["gfx1100".into()]);
        w.add("k#0", "gfx1100", b"from extra".to_vec(), None)
            .unwrap();
        w.write(&extra).unwrap();
        let bin = dir.path().join("k");
        let m = meta("k", &["lib_@GFXARCH@.kpack"]);
        let archs = ["gfx1100"];
        // Prefix first, then the embedded paths.
        let l = Loader::new(Config {
            path_prefix: vec![extra.clone(), dir.path().join("nope.kpack")],
            ..Config::default()
        });
        assert_eq!(
            l.load_code_object(&m, &bin, 0, &archs).unwrap(),
            b"from extra"
        );
        assert_eq!(
            l.load_code_object(&m, &bin, 1, &archs).unwrap(),
            code("k#1", "gfx1100")
        );
        // Override: the embedded paths are not searched at all; no
        // @GFXARCH@ expansion in its entries.
        let l = Loader::new(Config {
            path_override: Some(vec![extra.clone()]),
            path_prefix: vec![embedded.clone()],
            ..Config::default()
        });
        assert_eq!(
            l.load_code_object(&m, &bin, 0, &archs).unwrap(),
            b"from extra"
        );
        assert!(matches!(
            l.load_code_object(&m, &bin, 1, &archs),
            Err(LoadError::KernelNotFound { .. })
        ));
        let l = Loader::new(Config {
            path_override: Some(vec![dir.path().join("lib_@GFXARCH@.kpack")]),
            ..Config::default()
        });
        assert!(matches!(
            l.load_code_object(&m, &bin, 0, &archs),
            Err(LoadError::ArchiveNotFound { .. })
        ));
    }

    #[test]
    fn one_archive_per_canonical_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("lib/sub")).unwrap();
        let a = dir.path().join("a.kpack");
        write_archive(&a, &["gfx1100"], &[("k#0", "gfx1100")]);
        #[cfg(unix)]
        std::os::unix::fs::symlink(&a, dir.path().join("link.kpack")).unwrap();
        let (l, lines) = recording(Config::default());
        let bin = dir.path().join("lib/sub/k");
        for paths in [
            &["../../a.kpack"][..],
            &["../../lib/../a.kpack"],
            &[a.to_str().unwrap()],
            &["../../link.kpack"],
        ] {
            assert_eq!(
                l.load_code_object(&meta("k", paths), &bin, 0, &["gfx1100"])
                    .unwrap(),
                code("k#0", "gfx1100")
            );
        }
        assert_eq!(l.open_archives(), vec![std::fs::canonicalize(&a).unwrap()]);
        let opened = lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("opened archive"))
            .count();
        assert_eq!(opened, 1);
    }

    #[test]
    fn debug_lines() {
        let dir = tempfile::tempdir().unwrap();
        let (l, lines) = recording(Config {
            path_prefix: vec![dir.path().join("p.kpack")],
            ..Config::default()
        });
        let r = l.load_code_object(
            &meta("k", &["m_@GFXARCH@.kpack"]),
            &dir.path().join("b"),
            0,
            &["gfx90a:xnack-"],
        );
        assert!(
            matches!(r, Err(LoadError::ArchiveNotFound { ref candidates, .. }) if candidates.len() == 3)
        );
        let lines = lines.lock().unwrap();
        assert!(
            lines[0].starts_with("kpack: cache created: disabled=false"),
            "{lines:?}"
        );
        for want in [
            "load k#0 for gfx90a:xnack-",
            "p.kpack: No such file",
            "m_gfx90a:xnack-.kpack: No such file",
            "m_gfx90a.kpack: No such file",
            "none of 3 candidate archive(s) could be opened",
        ] {
            assert!(lines.iter().any(|l| l.contains(want)), "{want}: {lines:?}");
        }
        // Without debug, nothing is written to the sink.
        let quiet_lines = Arc::new(StdMutex::new(0));
        let q = quiet_lines.clone();
        let l = Loader::with_log_sink(Config::default(), move |_| *q.lock().unwrap() += 1);
        let _ = l.load_code_object(b"", Path::new("x"), 0, &["gfx900"]);
        assert_eq!(*quiet_lines.lock().unwrap(), 0);
    }

    #[test]
    fn threads_share_one_loader() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("t_gfx1100.kpack");
        let kernels: Vec<(String, &str)> = (0..8).map(|i| (format!("k#{i}"), "gfx1100")).collect();
        let refs: Vec<(&str, &str)> = kernels.iter().map(|(k, t)| (k.as_str(), *t)).collect();
        write_archive(&a, &["gfx1100"], &refs);
        let l = quiet();
        let m = meta("k", &["t_@GFXARCH@.kpack"]);
        let bin = dir.path().join("k");
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let (l, m, bin) = (&l, &m, &bin);
                s.spawn(move || {
                    for n in 0..50u32 {
                        let i = (t + n) % 8;
                        let got = l.load_code_object(m, bin, i, &["gfx1100"]).unwrap();
                        assert_eq!(got, code(&format!("k#{i}"), "gfx1100"));
                    }
                });
            }
        });
        assert_eq!(l.open_archives().len(), 1);
    }
}
