//! The engine shared by split and pack-tree: offload many files in
//! parallel, then write one archive per target.
//!
//! Phase 1 handles every file on its own (in parallel): a fat binary's
//! device code is hashed (`kpack_host::offload::digest`: the digests its
//! metadata and its archive entries carry), it is rewritten into its
//! host-only form at its destination and its code objects are recorded, not
//! copied: a code object stored plainly in the input is recorded as a range
//! of the input file. Binaries with compressed bundles are handled
//! afterwards, one binary at a time: hashed (their bundles decompressed for
//! that), rewritten, and their code objects read
//! (`kpack_host::offload::collect`: each compressed bundle decompressed
//! again, as a stream, its code objects compressed into the archives' zstd
//! frames in parallel batches while the next batch is decompressed), and
//! their frames spilled to a scratch file (in `--tmp-dir`); one binary at a
//! time, so that memory holds one decompressor's window, however many jobs
//! run. Phase 2 writes one archive per target, its code objects in the
//! order of (kernel name, bundle index): the output does not depend on
//! which thread did what. It reads each code object (or frame, which it
//! copies) with `pread` when it writes it (no maps: the pages stay in the
//! page cache, not in the process), so memory use does not grow with the
//! input. The inputs must stay as they are until the run ends (they are
//! read twice).

use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::archive::Scheme;
use crate::hipk::HipkMetadata;
use crate::input::{map_file, Mapped};
use crate::msgpack::Value;
use crate::tree::{copy_file, copy_symlink, create_file, make_dirs, Node, NodeKind};
use crate::{ArtifactError, Observer, Result};
use kpack_bundle::list_fatbin;
use kpack_bundle::BundleInfo;
use kpack_host::binary::{as_is_note, classify_parsed, could_be_binary, Class, Classified};
use kpack_host::offload::collect::{collect, CollectOptions, Located};
use kpack_host::offload::digest::{digests, Digests};
use kpack_host::offload::{archive_file_name, GFXARCH};
use kpack_host::offload::{archive_key, rewrite_binary, split_targets, write_rewritten};
use kpack_host::{ArchiveWriter, FrameParams, KernelData, WithPath};

/// One `.kpack` archive written by split or pack-tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchiveInfo {
    pub target: String,
    /// Path relative to the output directory.
    pub path: String,
    /// The install prefix it was placed in (split).
    pub prefix: Option<String>,
    pub code_objects: usize,
    /// Sum of the code objects' sizes.
    pub bytes_in: u64,
    /// Size of the archive file.
    pub bytes_out: u64,
    /// Code objects stored once for several binaries: entries that share
    /// the ordinal of an identical code object (same target, same bytes).
    pub shared_code_objects: usize,
    /// Uncompressed bytes those shared entries did not store again.
    pub bytes_saved: u64,
    /// The limits of ROCm's HRX runtime the archive exceeds (warned about
    /// by [`Packer::write_archives`]).
    #[serde(skip)]
    pub hrx_limits: Vec<kpack_format::hrx::Exceeded>,
}

/// One regular file to handle.
#[derive(Debug, Clone)]
pub(crate) struct FileJob {
    pub src: PathBuf,
    pub size: u64,
    pub mode: u32,
    /// Where the file (or its host-only form) goes.
    pub dst: PathBuf,
    /// The binary's key, if it turns out to be a fat binary (`None`: its
    /// path is not UTF-8, which is then an error).
    pub kernel_name: Option<String>,
    /// The one search path written into its metadata.
    pub search_path: String,
    /// Recorded in the archive entries' metadata (`source_prefix`).
    pub source_prefix: Option<String>,
    /// A database handler claimed the file for this target: it goes, as
    /// it is, to this destination instead (whatever it holds).
    pub database: Option<(String, PathBuf)>,
}

/// A code object recorded by phase 1: where its bytes are (a range of the
/// input, or a frame or range of a spill file).
pub struct CodeRef {
    pub target: String,
    pub triple: String,
    pub bundle: usize,
    /// Its position in its bundle's entry table.
    pub entry: usize,
    pub bytes: KernelData<'static>,
}

/// An offloaded binary.
pub struct Offloaded {
    pub kernel_name: String,
    pub source_prefix: Option<String>,
    pub code_objects: Vec<CodeRef>,
    pub dropped: usize,
    pub wrappers: usize,
    /// The digests of its device code, which its archive entries carry.
    pub digests: Digests,
    /// It has compressed bundles: it is hashed, rewritten and its code
    /// objects read after the parallel pass (one binary at a time).
    deferred: bool,
    /// The limits of ROCm's HRX runtime its metadata exceeds (warned about
    /// by [`Packer::write_archives`]).
    hrx_limits: Vec<kpack_format::hrx::Exceeded>,
}

/// What happened to one file.
pub enum Outcome {
    Copied,
    Database {
        target: String,
    },
    Offloaded(Box<Offloaded>),
    /// Already offloaded: copied as it is.
    AlreadyOffloaded,
    /// A relocatable object or static archive: copied as it is.
    LinkInput,
    /// A debug-info file (`objcopy --only-keep-debug`): no device code,
    /// copied as it is.
    DebugOnly,
    /// A host binary with a `.hip_fatbin` that holds no device code
    /// (empty, zeros only, NOBITS: [`HostBinary::empty_fatbin`]): copied as
    /// it is.
    NoDeviceCode,
}

/// The note a summary gets for a file `src` copied as it is although it
/// looks like a binary: the words of [`as_is_note`], which every command
/// uses.
fn as_is(src: &Path, note: &str) -> String {
    format!("{}: {note}: copied as it is", src.display())
}

pub struct Done {
    pub outcome: Outcome,
    pub bytes_out: u64,
    /// What is said of a file copied as it is ([`as_is_note`]).
    pub note: Option<String>,
}

/// What split and pack-tree count of the tree they pack; both summaries
/// carry it (flattened into their JSON).
#[derive(Debug, Clone, Default, Serialize)]
pub struct TreeCounts {
    pub files: usize,
    pub symlinks: usize,
    pub directories: usize,
    /// Fat binaries offloaded.
    pub binaries: usize,
    pub wrappers: usize,
    pub already_offloaded: usize,
    /// Debug-info files (`objcopy --only-keep-debug`), copied as they are.
    pub debug_only: usize,
    pub link_inputs: usize,
    pub code_objects: usize,
    /// Code objects of targets left out (`--gpu-targets`, `--gfx-arches`).
    pub dropped_code_objects: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl TreeCounts {
    /// A regular file of `size` bytes read.
    pub fn file(&mut self, size: u64) {
        self.files += 1;
        self.bytes_in += size;
    }
}

/// Put the walked node `n` in the output tree at `dst`, counted: a
/// directory made (kept even when empty), a symlink copied. A regular file
/// is left to the caller, which makes it a job: its size is returned.
pub fn place(counts: &mut TreeCounts, n: &Node, dst: &Path) -> Result<Option<u64>> {
    match &n.kind {
        NodeKind::Dir => {
            counts.directories += 1;
            make_dirs(dst)?;
            Ok(None)
        }
        NodeKind::Symlink(link) => {
            counts.symlinks += 1;
            copy_symlink(link, dst)?;
            Ok(None)
        }
        NodeKind::File { size } => {
            counts.file(*size);
            Ok(Some(*size))
        }
    }
}

/// Phase 1's outcomes, counted.
pub(crate) struct Recorded<'d> {
    /// The offloaded binaries, in job order (phase 2 archives them).
    pub binaries: Vec<&'d Offloaded>,
    /// Database files: the job's index and the target the handler gave.
    pub databases: Vec<(usize, &'d str)>,
}

/// Count what phase 1 did to each job into `counts`; each outcome's note
/// (files copied as they are although they look like binaries) goes to
/// `note`, in job order.
pub(crate) fn record_outcomes<'d>(
    done: &'d [Done],
    jobs: &[FileJob],
    counts: &mut TreeCounts,
    mut note: impl FnMut(String),
) -> Recorded<'d> {
    let mut r = Recorded {
        binaries: Vec::new(),
        databases: Vec::new(),
    };
    for (i, (d, job)) in done.iter().zip(jobs).enumerate() {
        counts.bytes_out += d.bytes_out;
        match &d.outcome {
            Outcome::Copied => {}
            Outcome::Database { target } => r.databases.push((i, target)),
            Outcome::Offloaded(b) => {
                counts.binaries += 1;
                counts.wrappers += b.wrappers;
                counts.code_objects += b.code_objects.len();
                counts.dropped_code_objects += b.dropped;
                r.binaries.push(b.as_ref());
            }
            Outcome::DebugOnly => counts.debug_only += 1,
            Outcome::AlreadyOffloaded => counts.already_offloaded += 1,
            Outcome::LinkInput => counts.link_inputs += 1,
            Outcome::NoDeviceCode => {}
        }
        if let Some(n) = &d.note {
            note(as_is(&job.src, n));
        }
    }
    r
}

/// `"../" * depth + ".kpack/<group>_@GFXARCH@.kpack"`: the search path of
/// a binary at `rel` (relative to its install prefix) to the archives of
/// `group` at that prefix.
pub fn search_path(rel: &str, group: &str) -> String {
    let depth = rel.split('/').count().saturating_sub(1);
    format!(
        "{}.kpack/{}",
        "../".repeat(depth),
        archive_file_name(group, GFXARCH)
    )
}

/// Where the archive of a target goes, given the sorted source prefixes
/// that contributed to it: the absolute path, and the path to report.
pub(crate) type Place<'a> = dyn Fn(&str, &[String]) -> (PathBuf, String) + Sync + 'a;

pub(crate) struct Packer<'a> {
    pub scheme: Scheme,
    pub level: i32,
    /// Where decompressed code objects are spilled.
    pub scratch: &'a Path,
    pub observer: &'a dyn Observer,
    /// Keep only code objects of targets this accepts (pack-tree's
    /// `--gfx-arches`).
    pub keep_target: Option<&'a (dyn Fn(&str) -> bool + Sync)>,
}

impl Packer<'_> {
    /// Phase 1: every job, in parallel; results in job order. The first
    /// error in job order is returned, so that the error reported does not
    /// depend on scheduling either. Then the code objects of compressed
    /// bundles, one binary at a time (each in parallel batches).
    pub fn run(&self, jobs: &[FileJob]) -> Result<Vec<Done>> {
        let results: Vec<Result<Done>> = jobs
            .par_iter()
            .enumerate()
            .map(|(i, job)| {
                let r = self.process(i, job);
                self.observer.advance(job.size);
                r
            })
            .collect();
        let mut done: Vec<Done> = results.into_iter().collect::<Result<_>>()?;
        for (i, (d, job)) in done.iter_mut().zip(jobs).enumerate() {
            let Done {
                outcome, bytes_out, ..
            } = d;
            if let Outcome::Offloaded(b) = outcome {
                if b.deferred {
                    let mapped = map_file(&job.src)?;
                    let classified = classify_parsed(&mapped);
                    let section = fatbin_section(&job.src, &classified)?;
                    let bundles = list_fatbin(section).with_path(&job.src)?;
                    *bytes_out = self.finish(i, job, &mapped, &classified, &bundles, b)?;
                }
            }
        }
        Ok(done)
    }

    /// The archive writer of a target.
    fn writer(&self, group: &str, family: String, target: &str) -> ArchiveWriter<'static> {
        ArchiveWriter::new(group, family, vec![target.to_string()])
            .scheme(self.scheme)
            .zstd_level(self.level)
    }

    /// The frames the archive writers make, if they compress.
    fn frame_params(&self) -> Option<FrameParams> {
        self.writer("", String::new(), "").frames()
    }

    fn process(&self, index: usize, job: &FileJob) -> Result<Done> {
        // A database claim comes before the binary rules: MIOpen's
        // per-target CK libraries are fat binaries that belong, as they
        // are, in their target's artifact.
        if let Some((target, dst)) = &job.database {
            let n = copy_file(&job.src, dst, job.mode)?;
            return Ok(Done {
                outcome: Outcome::Database {
                    target: target.clone(),
                },
                bytes_out: n,
                note: None,
            });
        }
        if could_be_binary(&read_head(&job.src)?) {
            let mapped = map_file(&job.src)?;
            let classified = classify_parsed(&mapped);
            let outcome = match classified.class {
                // Device code with something wrong: offloading reports what.
                Class::Fat | Class::Inconsistent(_) => {
                    return self.offload(index, job, &mapped, &classified)
                }
                Class::Offloaded => Some(Outcome::AlreadyOffloaded),
                Class::DebugOnly => Some(Outcome::DebugOnly),
                Class::Relocatable { .. } | Class::StaticArchive => Some(Outcome::LinkInput),
                Class::HostOnly => as_is_note(&classified).map(|_| Outcome::NoDeviceCode),
                _ => None,
            };
            if let Some(outcome) = outcome {
                let bytes_out = copy_file(&job.src, &job.dst, job.mode)?;
                let note = as_is_note(&classified);
                return Ok(Done {
                    outcome,
                    bytes_out,
                    note,
                });
            }
        }
        let n = copy_file(&job.src, &job.dst, job.mode)?;
        Ok(Done {
            outcome: Outcome::Copied,
            bytes_out: n,
            note: None,
        })
    }

    /// A fat binary: hashed, its host-only form written to the destination,
    /// its code objects (those `keep_target` takes) recorded where their
    /// bytes are; one with compressed bundles is left to [`Packer::run`]'s
    /// second pass.
    fn offload(
        &self,
        index: usize,
        job: &FileJob,
        mapped: &Mapped,
        classified: &Classified,
    ) -> Result<Done> {
        let kernel_name = job
            .kernel_name
            .clone()
            .ok_or_else(|| ArtifactError::input(&job.src, "file name is not valid UTF-8"))?;
        // A binary that does not parse is reported before its bundles.
        (classified.binary.as_ref()).map_err(|e| kpack_host::Error::binary(&job.src, e.clone()))?;
        // Bundles are listed from their entry tables (errors in them are
        // reported as the bundles' own, before the rewrite's).
        let section = fatbin_section(&job.src, classified)?;
        let bundles = list_fatbin(section).with_path(&job.src)?;
        let deferred = bundles.iter().any(|b| b.compressed.is_some());
        let mut b = Offloaded {
            kernel_name,
            source_prefix: job.source_prefix.clone(),
            code_objects: Vec::new(),
            dropped: 0,
            wrappers: 0,
            digests: Digests::default(),
            deferred,
            hrx_limits: Vec::new(),
        };
        let bytes_out = match deferred {
            true => 0,
            false => self.finish(index, job, mapped, classified, &bundles, &mut b)?,
        };
        Ok(Done {
            outcome: Outcome::Offloaded(Box::new(b)),
            bytes_out,
            note: None,
        })
    }

    /// A fat binary with these bundles: its device code hashed, its
    /// host-only form (carrying the device digest) written to the
    /// destination, its code objects collected. Returns the bytes written.
    fn finish(
        &self,
        index: usize,
        job: &FileJob,
        mapped: &Mapped,
        classified: &Classified,
        bundles: &[BundleInfo],
        b: &mut Offloaded,
    ) -> Result<u64> {
        let bin = (classified.binary.as_ref())
            .map_err(|e| kpack_host::Error::binary(&job.src, e.clone()))?;
        let section = fatbin_section(&job.src, classified)?;
        let d = digests(&job.src, mapped, section)?;
        let keep = self.keep_target.map(|k| k as &dyn Fn(&str) -> bool);
        let metadata = HipkMetadata::new(b.kernel_name.clone(), vec![job.search_path.clone()])
            .with_bundle_targets(&split_targets(bundles, keep))
            .with_device_digest(Some(d.device.clone()));
        let t = rewrite_binary(&job.src, bin, &metadata)?;
        b.hrx_limits = kpack_format::hrx::check_metadata(&metadata);
        let targets = metadata.targets.as_ref().map_or(0, Vec::len);
        b.hrx_limits
            .extend(kpack_format::hrx::check_archive_count(targets));
        let source = File::open(&job.src).map_err(|e| ArtifactError::io(&job.src, e))?;
        create_file(&job.dst, job.mode, |f| {
            Ok(write_rewritten(&job.src, &t, Some(&source), f)?)
        })?;
        // The pages the rewrite read of the host part are not needed again.
        mapped.release(0..mapped.len());
        b.wrappers = t.wrappers.len();
        b.digests = d;
        self.collect(index, job, mapped, classified, b)?;
        Ok(t.len())
    }

    /// The code objects to keep of an offloaded binary, recorded where
    /// their bytes are: ranges of the input (plain bundles), or frames (or,
    /// for archives stored uncompressed, bytes) in this job's spill file in
    /// the scratch directory (compressed bundles). Phase 2 reads them
    /// through the files, not the map.
    fn collect(
        &self,
        index: usize,
        job: &FileJob,
        mapped: &Mapped,
        classified: &Classified,
        b: &mut Offloaded,
    ) -> Result<()> {
        let section = fatbin_section(&job.src, classified)?;
        let spill = self.scratch.join(format!("code-objects-{index}.bin"));
        let mut opts = CollectOptions::new(spill, self.frame_params());
        opts.keep = self.keep_target;
        let c = collect(&job.src, mapped, section, &opts)?;
        b.dropped = c.dropped;
        b.code_objects = c.code_objects.into_iter().map(code_ref).collect();
        b.deferred = false;
        Ok(())
    }

    /// Phase 2: one archive per target. `place(target, prefixes)` says
    /// where the archive of `target` goes (absolute path, and the path to
    /// report) given the sorted source prefixes that contributed to it;
    /// `family(target)` gives its `gfx_arch_family`.
    pub fn write_archives(
        &self,
        binaries: &[&Offloaded],
        group: &str,
        family: &(dyn Fn(&str) -> String + Sync),
        place: &Place<'_>,
    ) -> Result<Vec<ArchiveInfo>> {
        let targets = by_target(binaries);
        let work: u64 = targets
            .iter()
            .flat_map(|(_, list)| list)
            .map(|(_, co)| co.bytes.len() as u64)
            .sum();
        self.observer.add_work(work);
        let results: Vec<Result<ArchiveInfo>> = targets
            .par_iter()
            .map(|(target, list)| self.write_archive(target, list, group, family, place))
            .collect();
        let archives = results.into_iter().collect::<Result<Vec<_>>>()?;
        self.warn_hrx_limits(binaries, &archives);
        Ok(archives)
    }

    /// Warn of the limits of ROCm's HRX runtime the outputs exceed (they
    /// are valid all the same): each binary's (in job order, named by its
    /// kernel name), then each archive's (in target order).
    fn warn_hrx_limits(&self, binaries: &[&Offloaded], archives: &[ArchiveInfo]) {
        for b in binaries {
            for e in &b.hrx_limits {
                self.observer.warn(&format!("{}: {e}", b.kernel_name));
            }
        }
        for a in archives {
            for e in &a.hrx_limits {
                self.observer.warn(&format!("{}: {e}", a.path));
            }
        }
    }

    /// The archive of one target: its code objects in the order given.
    fn write_archive(
        &self,
        target: &str,
        list: &[(&Offloaded, &CodeRef)],
        group: &str,
        family: &(dyn Fn(&str) -> String + Sync),
        place: &Place<'_>,
    ) -> Result<ArchiveInfo> {
        let mut prefixes: Vec<String> = list
            .iter()
            .filter_map(|(b, _)| b.source_prefix.clone())
            .collect();
        prefixes.sort();
        prefixes.dedup();
        let (path, shown) = place(target, &prefixes);
        let mut w = self.writer(group, family(target), target);
        for (b, co) in list {
            let mut meta = vec![("target".to_string(), Value::from(co.triple.as_str()))];
            if let Some(p) = &b.source_prefix {
                meta.push(("source_prefix".to_string(), Value::from(p.as_str())));
            }
            meta.extend(b.digests.entry_metadata(co.bundle, co.entry));
            w.add(
                archive_key(&b.kernel_name, co.bundle),
                target.to_string(),
                co.bytes.clone(),
                Some(meta),
            )
            .map_err(|source| kpack_host::Error::Archive {
                path: path.clone(),
                source,
            })?;
        }
        if path.exists() {
            return Err(ArtifactError::input(
                &path,
                "an archive of this name is already in the output (the input has one at the same path)",
            ));
        }
        if let Some(dir) = path.parent() {
            make_dirs(dir)?;
        }
        let s = w.write(&path)?;
        self.observer.advance(s.bytes_in);
        Ok(ArchiveInfo {
            target: target.to_string(),
            path: shown,
            prefix: prefixes.first().cloned(),
            code_objects: s.kernels,
            bytes_in: s.bytes_in,
            bytes_out: s.bytes_out,
            shared_code_objects: s.shared,
            bytes_saved: s.bytes_saved,
            hrx_limits: w.hrx_limits(),
        })
    }
}

/// An archive's code objects, each with its binary.
type Entries<'b> = Vec<(&'b Offloaded, &'b CodeRef)>;

/// The code objects of `binaries` by target (sorted), each target's in the
/// order of (kernel name, bundle index): the archives do not depend on
/// which thread offloaded what.
fn by_target<'b>(binaries: &[&'b Offloaded]) -> Vec<(&'b str, Entries<'b>)> {
    let mut sorted: Vec<&Offloaded> = binaries.to_vec();
    sorted.sort_by(|a, b| a.kernel_name.cmp(&b.kernel_name));
    let mut by_target: BTreeMap<&str, Entries<'b>> = BTreeMap::new();
    for b in &sorted {
        for co in &b.code_objects {
            by_target.entry(&co.target).or_default().push((b, co));
        }
    }
    for list in by_target.values_mut() {
        list.sort_by(|x, y| {
            (x.0.kernel_name.as_str(), x.1.bundle).cmp(&(y.0.kernel_name.as_str(), y.1.bundle))
        });
    }
    by_target.into_iter().collect()
}

fn code_ref(c: Located) -> CodeRef {
    CodeRef {
        target: c.target,
        triple: c.triple,
        bundle: c.bundle,
        entry: c.entry,
        bytes: c.data,
    }
}

/// The bytes of a fat binary's bundle section.
pub(crate) fn fatbin_section<'a>(src: &Path, classified: &Classified<'a>) -> Result<&'a [u8]> {
    let bin =
        (classified.binary.as_ref()).map_err(|e| kpack_host::Error::binary(src, e.clone()))?;
    match bin.fatbin().with_path(src)? {
        Some(s) => Ok(s.data),
        None => Err(ArtifactError::input(src, "no device code section")),
    }
}

/// The first 8 bytes of a file (fewer if it is shorter).
pub(crate) fn read_head(path: &Path) -> Result<Vec<u8>> {
    let mut head = Vec::with_capacity(8);
    File::open(path)
        .and_then(|f| f.take(8).read_to_end(&mut head))
        .map_err(|e| ArtifactError::io(path, e))?;
    Ok(head)
}
