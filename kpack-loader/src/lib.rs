//! The runtime loader (formats.md §5): given the HIPK metadata of an offloaded
//! binary, the binary's path, a code object index and the agents'
//! architectures, find the code object in `.kpack` archives.
//!
//! This is the whole search logic of `kpack_load_code_object`, as a safe
//! Rust API; the C API in `kpack-cxx` only checks pointers and maps errors.
//!
//! - `config`: [`Config`] holds the environment (`ROCM_KPACK_*`), read
//!   once.
//! - this module: [`Loader`] is the cache: archives are opened lazily,
//!   once, keyed by canonical path, and shared between threads (`Loader` is
//!   `Send + Sync`); [`Loader::load_with`] runs the steps of formats.md §5.4.
//! - `search`: the candidate archive paths, the archive cache and the walk
//!   over targets and candidates (steps 4 to 6).
//! - `discover`: [`discover_binary_path`] finds the file mapped at an
//!   address (Linux: `/proc/self/maps`); [`find_mapping`] is its pure
//!   parser.
//!
//! Search order (formats.md §5.4, step 6): for each requested architecture in order,
//! for each compatible target (most specific first), for each candidate
//! archive that lists the target in `gfx_arches`, try the key
//! `kernel_name#co_index`. An archive that has the target but not the key,
//! or fails to read it, does not end the search: the next candidate is
//! tried.
//!
//! ```no_run
//! # use kpack_loader::Loader;
//! # use std::path::Path;
//! # let metadata: &[u8] = &[];
//! let loader = Loader::from_env();
//! let code = loader.load_code_object(
//!     metadata,
//!     Path::new("/opt/rocm/lib/librocblas.so.4"),
//!     0,
//!     &["amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", "gfx9-4-generic:sramecc+:xnack-"],
//! )?;
//! # Ok::<(), kpack_loader::LoadError>(())
//! ```

#![deny(unsafe_code)]

mod config;
mod discover;
mod error;
pub mod input;
mod search;
mod trace;

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub use config::{
    flag_is_set, path_list, Config, ENV_DEBUG, ENV_DISABLE, ENV_PATH, ENV_PATH_PREFIX,
    ENV_VERIFY_DIGEST,
};
pub use discover::{discover_binary_path, find_mapping, DiscoverError, MappedFile};

use kpack_format::{archive, bytes, hipk, provenance, target};

pub use error::{report, ErrorCode, LoadError, OpenError};
use hipk::{HipkError, HipkMetadata};
pub use input::{map_file, map_file_with_handle, open_archive, ArchiveFile, Mapped, PrivateMap};
pub use search::{archives_on_search_path, Hit};
use search::{Search, State};
pub use trace::{AgentTrace, Attempt, AttemptOutcome, CandidateStatus, CandidateTrace, Trace};

/// Where a debug line goes.
type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// A code object as [`Loader::load_view`] hands it out.
#[derive(Debug)]
pub enum Loaded<B> {
    /// Decompressed (or, for a code object stored as it is that could not
    /// be mapped, copied) into a buffer from the caller's allocator.
    Buffer(B),
    /// Stored uncompressed in its archive (scheme `none`): its own private
    /// copy-on-write mapping of the archive's pages, no copy made.
    Mapped(PrivateMap),
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

    /// The debug lines of a new cache: upstream's line, then the paths of
    /// the two lists.
    fn created(&self) {
        let c = &self.config;
        let overrides = c.path_override.as_deref().unwrap_or_default();
        self.debug(format_args!(
            "cache created: disabled={}, debug={}, override_paths={}, prefix_paths={}",
            i32::from(c.disabled),
            i32::from(c.debug),
            overrides.len(),
            c.path_prefix.len(),
        ));
        for p in overrides {
            self.debug(format_args!("  {ENV_PATH}: {}", p.display()));
        }
        for p in &c.path_prefix {
            self.debug(format_args!("  {ENV_PATH_PREFIX}: {}", p.display()));
        }
        if c.verify_digest {
            self.debug(format_args!(
                "  ({ENV_VERIFY_DIGEST}: code objects checked against their TOC digests)"
            ));
        }
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
            .filter(|(_, slot)| matches!(slot.cell.get(), Some(Ok(_))))
            .map(|(p, _)| p.clone())
            .collect();
        v.sort();
        v
    }

    /// Drop the resident pages of every archive opened so far
    /// ([`ArchiveFile::release_pages`]): tools that read every code object
    /// (restore) call it between bundles, so that their memory does not
    /// grow with the archives. Archives stay open.
    pub fn release_pages(&self) {
        let state = self.lock();
        for slot in state.by_canonical.values() {
            if let Some(Ok(opened)) = slot.cell.get() {
                opened.archive().release_pages();
            }
        }
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
            vec_of,
        )
    }

    /// [`Loader::load_code_object`] with the metadata decoded on demand
    /// (after the argument and `ROCM_KPACK_DISABLE` checks, as formats.md §5.4
    /// orders them) and the output buffer made by `alloc(size)`, which must
    /// return a buffer of exactly `size` bytes, or `None` when out of
    /// memory. The code object is read straight into that buffer.
    pub fn load_with<B: AsMut<[u8]>>(
        &self,
        metadata: impl FnOnce() -> Result<HipkMetadata, HipkError>,
        binary_path: &Path,
        co_index: u32,
        archs: &[&str],
        alloc: impl FnMut(usize) -> Option<B>,
    ) -> Result<B, LoadError> {
        match self.load_traced(metadata, binary_path, co_index, archs, alloc, false, None)? {
            (Loaded::Buffer(buf), _) => Ok(buf),
            // Not asked for: a search without zero copy reads every code
            // object into a buffer.
            (Loaded::Mapped(_), _) => unreachable!("a mapped code object without zero copy"),
        }
    }

    /// [`Loader::load_with`], except that a code object the archive stores
    /// uncompressed (scheme `none`) comes without a copy, as its own
    /// private copy-on-write mapping of the archive's pages
    /// ([`Loaded::Mapped`]): valid until dropped, even after the loader is.
    /// Compressed ones are decompressed into a buffer from `alloc`.
    pub fn load_view<B: AsMut<[u8]>>(
        &self,
        metadata: impl FnOnce() -> Result<HipkMetadata, HipkError>,
        binary_path: &Path,
        co_index: u32,
        archs: &[&str],
        alloc: impl FnMut(usize) -> Option<B>,
    ) -> Result<Loaded<B>, LoadError> {
        self.load_traced(metadata, binary_path, co_index, archs, alloc, true, None)
            .map(|(loaded, _)| loaded)
    }

    /// What [`Loader::load_code_object`] would do, step by step: the same
    /// search, reporting to a [`Trace`]. Returns the code object's size and
    /// where it was found, or the error the load returns, and the trace.
    pub fn explain(
        &self,
        metadata: &HipkMetadata,
        binary_path: &Path,
        co_index: u32,
        archs: &[&str],
    ) -> (Result<(u64, Hit), LoadError>, Trace) {
        let mut trace = Trace::default();
        let result = self.load_traced(
            || Ok(metadata.clone()),
            binary_path,
            co_index,
            archs,
            vec_of,
            true,
            Some(&mut trace),
        );
        let size = |loaded: &Loaded<Vec<u8>>| match loaded {
            Loaded::Buffer(b) => b.len() as u64,
            Loaded::Mapped(m) => m.len() as u64,
        };
        (result.map(|(loaded, hit)| (size(&loaded), hit)), trace)
    }

    /// [`Loader::load_code_object`] of decoded metadata, with its bytes and
    /// where they were found, and the [`Trace`] of the search.
    pub fn load_explained(
        &self,
        metadata: &HipkMetadata,
        binary_path: &Path,
        co_index: u32,
        archs: &[&str],
    ) -> (Result<(Vec<u8>, Hit), LoadError>, Trace) {
        let mut trace = Trace::default();
        let metadata = || Ok(metadata.clone());
        let result = self.load_traced(
            metadata,
            binary_path,
            co_index,
            archs,
            vec_of,
            false,
            Some(&mut trace),
        );
        let result = result.map(|(loaded, hit)| match loaded {
            Loaded::Buffer(b) => (b, hit),
            Loaded::Mapped(m) => (m.to_vec(), hit),
        });
        (result, trace)
    }

    /// The code object `kernel_name#co_index` for exactly `target` (no
    /// less specific target in its place), through the same search: the
    /// first candidate that lists the target and has the key. `Ok(None)`
    /// when none has it; `Err` for a read error of one that has it.
    pub fn load_target(
        &self,
        metadata: &HipkMetadata,
        binary_path: &Path,
        co_index: u32,
        target: &crate::target::TargetId,
    ) -> Result<Option<(Vec<u8>, Hit)>, LoadError> {
        self.load_target_traced(metadata, binary_path, co_index, target, None)
    }

    /// [`Loader::load_target`], reporting to `trace` when given (the
    /// verifiers read the archives passed over in it).
    pub fn load_target_traced(
        &self,
        metadata: &HipkMetadata,
        binary_path: &Path,
        co_index: u32,
        target: &crate::target::TargetId,
        trace: Option<&mut Trace>,
    ) -> Result<Option<(Vec<u8>, Hit)>, LoadError> {
        if self.config.disabled {
            return Err(LoadError::Disabled);
        }
        let key = format!("{}#{}", metadata.kernel_name, co_index);
        let name = target.to_string();
        let agents = vec![(name.as_str(), vec![target.clone()])];
        let candidates = self.candidates(metadata, binary_path, &agents);
        let digest = metadata.device_digest.as_deref();
        let mut search = Search::new(self, &key, digest, candidates, false, trace);
        let found = search.find(target, &mut |size| Some(vec![0u8; size]))?;
        match found {
            Some((Loaded::Buffer(buf), hit)) => Ok(Some((buf, hit))),
            Some((Loaded::Mapped(map), hit)) => Ok(Some((map.to_vec(), hit))),
            None => match search.verdict(&[name.as_str()]) {
                e @ LoadError::Read { .. } => Err(e),
                _ => Ok(None),
            },
        }
    }

    /// The steps of formats.md §5.4, reporting to `trace` when given;
    /// `zero_copy`: code objects stored uncompressed come as mappings.
    ///
    /// With `ROCM_KPACK_DEBUG`, the debug lines are upstream's runtime's,
    /// in its format (`kpack: ` and the message; a line about one archive
    /// or try indented by two spaces), in the order of kpack's search; a
    /// line in parentheses after one of them gives kpack's reason.
    #[allow(clippy::too_many_arguments)]
    fn load_traced<B: AsMut<[u8]>>(
        &self,
        metadata: impl FnOnce() -> Result<HipkMetadata, HipkError>,
        binary_path: &Path,
        co_index: u32,
        archs: &[&str],
        mut alloc: impl FnMut(usize) -> Option<B>,
        zero_copy: bool,
        mut trace: Option<&mut Trace>,
    ) -> Result<(Loaded<B>, Hit), LoadError> {
        // Step 1.
        if archs.is_empty() {
            return Err(LoadError::NoArchitectures);
        }
        if self.config.disabled {
            self.debug(format_args!("kpack disabled via {ENV_DISABLE}"));
            return Err(LoadError::Disabled);
        }
        // Steps 2 and 3.
        let metadata = metadata().inspect_err(|e| {
            self.debug(format_args!("failed to parse HIPK metadata"));
            self.debug(format_args!("  ({e})"));
        })?;
        let key = format!("{}#{}", metadata.kernel_name, co_index);
        self.debug(format_args!(
            "parsed HIPK metadata: kernel_name='{}', co_index={co_index}, lookup_key='{key}', {} search paths",
            metadata.kernel_name,
            metadata.search_paths.len()
        ));
        let agents = self.agents(archs);
        if let Some(t) = trace.as_deref_mut() {
            t.key = key.clone();
            t.agents = agents
                .iter()
                .map(|(arch, targets)| AgentTrace {
                    arch: arch.to_string(),
                    targets: targets.iter().map(|t| t.to_string()).collect(),
                })
                .collect();
        }
        // Step 4.
        let candidates = self.candidates(&metadata, binary_path, &agents);
        // Steps 5 and 6.
        let candidate_count = candidates.len();
        let digest = metadata.device_digest.as_deref();
        let mut search = Search::new(self, &key, digest, candidates, zero_copy, trace);
        for (arch, targets) in &agents {
            self.debug(format_args!("trying architecture: {arch}"));
            for target in targets {
                if let Some(mut found) = search.find(target, &mut alloc)? {
                    // Upstream's line exactly; kpack's remark on a line of
                    // its own.
                    let (size, mapped) = match &mut found.0 {
                        Loaded::Buffer(b) => (b.as_mut().len(), false),
                        Loaded::Mapped(m) => (m.len(), true),
                    };
                    self.debug(format_args!("loaded code object: {size} bytes"));
                    if mapped {
                        self.debug(format_args!("  (mapped from the archive, no copy)"));
                    }
                    return Ok(found);
                }
            }
        }
        let err = search.verdict(archs);
        match &err {
            LoadError::Read { .. } | LoadError::KernelNotFound { .. } => self.debug(format_args!(
                "kernel not found in any compatible archive (last error {})",
                err.code() as i32
            )),
            LoadError::ArchNotFound { .. } => self.debug(format_args!(
                "no archive with compatible architecture found"
            )),
            _ => self.debug(format_args!(
                "no valid archives found in {candidate_count} kpack paths"
            )),
        }
        self.debug(format_args!("  ({err})"));
        Err(err)
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

/// A zeroed buffer of `size` bytes, or `None` when it cannot be had.
fn vec_of(size: usize) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(size).ok()?;
    v.resize(size, 0);
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::ArchiveError;
    use kpack_host::ArchiveWriter;
    use std::sync::Mutex as StdMutex;

    fn meta(kernel_name: &str, paths: &[&str]) -> Vec<u8> {
        HipkMetadata::new(kernel_name, paths.iter().map(|p| p.to_string()).collect()).encode()
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
            &HipkMetadata::new("x", vec![]).encode(),
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
                .filter(|l| l.contains("opened and cached archive"))
                .count(),
            2
        );
        assert!(lines.iter().all(|l| l.starts_with("kpack: ")));
        // Upstream's lines: the archive with the target, then the miss.
        assert!(
            lines.windows(2).any(|w| {
                w[0].starts_with("kpack:   archive ")
                    && w[0].ends_with("lib_gfx90a:xnack-.kpack has architecture gfx90a:xnack-")
                    && w[1]
                        == "kpack:   kernel not found in this archive (error 5), trying next candidate"
            }),
            "{lines:#?}"
        );
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
        let len0 = crate::bytes::u32_at(&bytes, 68).unwrap() as usize;
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
            .filter(|l| l.contains("opened and cached archive"))
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
        let d = dir.path().display();
        // Upstream's lines, in its format, then kpack's reasons.
        let want = [
            "kpack: cache created: disabled=0, debug=1, override_paths=0, prefix_paths=1".to_string(),
            format!("kpack:   ROCM_KPACK_PATH_PREFIX: {d}/p.kpack"),
            "kpack: parsed HIPK metadata: kernel_name='k', co_index=0, lookup_key='k#0', 1 search paths".into(),
            "kpack: prepending 1 paths from ROCM_KPACK_PATH_PREFIX".into(),
            format!("kpack: expanded pattern: m_@GFXARCH@.kpack -> {d}/m_gfx90a:xnack-.kpack"),
            format!("kpack: expanded pattern: m_@GFXARCH@.kpack -> {d}/m_gfx90a.kpack"),
            "kpack: trying architecture: gfx90a:xnack-".into(),
            format!("kpack: archive not found: {d}/p.kpack"),
            "kpack:   (No such file or directory (os error 2))".into(),
            format!("kpack: archive not found: {d}/m_gfx90a:xnack-.kpack"),
            "kpack:   (No such file or directory (os error 2))".into(),
            format!("kpack: archive not found: {d}/m_gfx90a.kpack"),
            "kpack:   (No such file or directory (os error 2))".into(),
            "kpack: no valid archives found in 3 kpack paths".into(),
        ];
        assert_eq!(lines[..want.len()], want[..], "{lines:#?}");
        assert!(
            lines[want.len()].starts_with("kpack:   (k#0: none of 3 candidate archive(s)"),
            "{lines:#?}"
        );
        assert_eq!(lines.len(), want.len() + 1, "{lines:#?}");
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
