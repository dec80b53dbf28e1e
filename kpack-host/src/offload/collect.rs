//! The code objects of a fat binary, ready for archive writers, in bounded
//! memory.
//!
//! A plain bundle's code objects are recorded as ranges of the input file
//! (an archive writer reads each when it compresses it). A compressed
//! bundle is read as a stream (`kpack_bundle::FatbinStream`): each code
//! object is decompressed once into a buffer of its own, compressed into
//! the frame an archive writer with the same [`FrameParams`] would make,
//! and the frame appended to a spill file, which the writer then copies.
//! Code objects are compressed in parallel batches of about
//! [`STREAM_BATCH_BYTES`] while the next batch is decompressed: what is held
//! is two batches and the decompressor's window, whatever the size of the
//! binary or of one compressed bundle. Without frame parameters (archives
//! stored uncompressed), decompressed code objects are spilled as they are.
//!
//! The frames do not depend on batches or threads, so the archives are
//! byte-identical to those written from fully decompressed bundles.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rayon::prelude::*;

use crate::bundle::{Blob, FatbinStream};
use crate::error::{Error, Result, WithPath};
use crate::input::Mapped;
use crate::{FileRange, Frame, FrameCompressor, FrameParams, KernelData};

/// Decompressed bytes compressed per parallel batch.
pub const STREAM_BATCH_BYTES: usize = 32 << 20;

/// One device code object, and where its bytes are.
#[derive(Debug, Clone)]
pub struct Located {
    /// Bundle index (formats.md §1.4).
    pub bundle: usize,
    /// Position in its bundle's entry table.
    pub entry: usize,
    pub triple: String,
    pub target: String,
    /// A range of the input, a frame in the spill file, or (without frame
    /// parameters) a range of the spill file.
    pub data: KernelData<'static>,
}

/// What [`collect`] found.
#[derive(Debug)]
pub struct Collected {
    /// In the order of (bundle, entry).
    pub code_objects: Vec<Located>,
    /// Device code objects of targets left out.
    pub dropped: usize,
    pub bundles: usize,
    /// The spill file, if a compressed bundle needed one.
    pub spill: Option<PathBuf>,
}

/// How to collect.
pub struct CollectOptions<'k> {
    /// Compress decompressed code objects into frames made with these
    /// parameters; `None`: spill their bytes.
    pub frames: Option<FrameParams>,
    /// Where the spill file goes (created only when needed).
    pub spill: PathBuf,
    /// Keep only code objects of targets this accepts.
    pub keep: Option<&'k (dyn Fn(&str) -> bool + Sync)>,
    pub batch_bytes: usize,
}

impl CollectOptions<'_> {
    pub fn new(spill: impl Into<PathBuf>, frames: Option<FrameParams>) -> Self {
        CollectOptions {
            frames,
            spill: spill.into(),
            keep: None,
            batch_bytes: STREAM_BATCH_BYTES,
        }
    }
}

/// The device code objects of `section` (the bytes of `input`'s bundle
/// section), read with bounded memory. Errors name `path`; an error found
/// part-way (a damaged compressed bundle) leaves only the spill file, which
/// the caller owns.
pub fn collect(
    path: &Path,
    input: &Mapped,
    section: &[u8],
    opts: &CollectOptions,
) -> Result<Collected> {
    let dropped = AtomicUsize::new(0);
    let keep = |t: &str| {
        let k = opts.keep.is_none_or(|keep| keep(t));
        if !k {
            dropped.fetch_add(1, Ordering::Relaxed);
        }
        k
    };
    let mut stream = FatbinStream::new(section).keep(keep);
    let mut sink = Sink {
        path,
        input,
        out: Vec::new(),
        spill: Spill::new(&opts.spill),
        raw: opts.frames.is_none(),
        limit: opts.batch_bytes.max(1),
    };
    let mut batch = sink.fill(&mut stream)?;
    if let Some(params) = opts.frames {
        // Compress this batch while the next one is decompressed.
        while !batch.is_empty() {
            let (next, frames) =
                rayon::join(|| sink.fill(&mut stream), || compress(path, &batch, params));
            let (next, frames) = (next?, frames?);
            for ((slot, _), frame) in batch.into_iter().zip(frames) {
                let at = sink.spill.append(&frame)?;
                let co = &mut sink.out[slot];
                co.data = KernelData::Frame(Frame {
                    bytes: at,
                    len: co.data.len(),
                    params,
                });
            }
            batch = next;
        }
    }
    let bundles = stream.bundles();
    drop(stream);
    let Sink { mut out, spill, .. } = sink;
    let spilled = spill.finish()?;
    out.sort_by_key(|c| (c.bundle, c.entry));
    Ok(Collected {
        code_objects: out,
        dropped: dropped.into_inner(),
        bundles,
        spill: spilled,
    })
}

/// Code objects decompressed, waiting for their frames: (slot in the
/// output, bytes).
type Batch<'a> = Vec<(usize, Blob<'a>)>;

/// Where code objects go as they are read.
struct Sink<'s> {
    path: &'s Path,
    input: &'s Mapped,
    out: Vec<Located>,
    spill: Spill,
    /// No frame parameters: decompressed code objects are spilled as they
    /// are read.
    raw: bool,
    limit: usize,
}

impl Sink<'_> {
    /// Record code objects until a batch of about `limit` decompressed
    /// bytes is waiting to be compressed (or the section ends).
    fn fill<'a>(&mut self, stream: &mut FatbinStream<'a>) -> Result<Batch<'a>> {
        let mut batch = Vec::new();
        let mut bytes = 0;
        while bytes < self.limit {
            let Some(co) = stream.next().with_path(self.path)? else {
                break;
            };
            let target = co.target().to_string();
            let placeholder = |len| {
                KernelData::File(FileRange {
                    path: Arc::from(Path::new("")),
                    offset: 0,
                    len,
                })
            };
            let data = match FileRange::of_slice(self.input, &co.data) {
                Some(range) if !co.compressed => KernelData::File(range),
                _ if self.raw => KernelData::File(self.spill.append(&co.data)?),
                _ => {
                    bytes += co.data.len();
                    batch.push((self.out.len(), co.data.clone()));
                    placeholder(co.data.len())
                }
            };
            self.out.push(Located {
                bundle: co.bundle,
                entry: co.entry,
                triple: co.triple,
                target,
                data,
            });
        }
        Ok(batch)
    }
}

/// The frames of a batch, compressed in parallel, in order.
fn compress(path: &Path, batch: &Batch<'_>, params: FrameParams) -> Result<Vec<Vec<u8>>> {
    batch
        .par_iter()
        .map_init(
            || FrameCompressor::new(params),
            |c, (_, data)| {
                let c = c.as_mut().map_err(|e| Error::io(path, clone_io(e)))?;
                c.compress(data).map_err(|e| Error::io(path, e))
            },
        )
        .collect()
}

fn clone_io(e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), e.to_string())
}

/// A file decompressed code objects or their frames are appended to,
/// created on first use.
struct Spill {
    path: Arc<Path>,
    file: Option<BufWriter<File>>,
    pos: u64,
}

impl Spill {
    fn new(path: &Path) -> Self {
        Spill {
            path: Arc::from(path),
            file: None,
            pos: 0,
        }
    }

    /// Append `bytes`: where they are.
    fn append(&mut self, bytes: &[u8]) -> Result<FileRange> {
        if self.file.is_none() {
            let f = File::create(&self.path).with_path(&self.path)?;
            self.file = Some(BufWriter::with_capacity(1 << 20, f));
        }
        let w = self.file.as_mut().expect("created");
        w.write_all(bytes).with_path(&self.path)?;
        let range = FileRange {
            path: self.path.clone(),
            offset: self.pos,
            len: bytes.len(),
        };
        self.pos += bytes.len() as u64;
        Ok(range)
    }

    /// Flush it: its path, if it was created.
    fn finish(self) -> Result<Option<PathBuf>> {
        match self.file {
            Some(mut w) => {
                w.flush().with_path(&self.path)?;
                Ok(Some(self.path.to_path_buf()))
            }
            None => Ok(None),
        }
    }
}
