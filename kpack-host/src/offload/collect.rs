//! The code objects of a fat binary, ready for archive writers, in bounded
//! memory.
//!
//! A plain bundle's code objects are recorded as ranges of the input file
//! (an archive writer reads each when it compresses it). A compressed
//! bundle is read by `kpack_bundle::FatbinStream` (decompressed whole when
//! its zstd window is its whole content, as clang makes them, else as a
//! stream through its window), each code object compressed into the frame
//! an archive writer with the same [`FrameParams`] would make, and the
//! frame appended to a spill file, which the writer then copies.
//!
//! A producer thread decompresses while the thread pool compresses the
//! code objects already decompressed, one frame per task (a
//! `par_bridge` over a channel). The decompressed buffers alive (handed out
//! and not compressed yet) are counted: the producer starts the next
//! compressed bundle only while they and it fit in [`STREAM_MEMORY`] (or
//! when nothing else is held: one compressed bundle larger than that is
//! still read). Memory is that, the decompressor's window when streaming,
//! and one frame per thread, whatever the size of the binary. Without
//! frame parameters (archives stored uncompressed), decompressed code
//! objects are spilled as they are, on the calling thread.
//!
//! The frames do not depend on the order they are made in, so the archives
//! are byte-identical to those written from fully decompressed bundles, for
//! any number of threads.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use rayon::prelude::*;

use crate::bundle::{Blob, FatbinStream};
use crate::error::{Error, Result, WithPath};
use crate::input::Mapped;
use crate::{FileRange, Frame, FrameCompressor, FrameParams, KernelData};

/// Decompressed bytes held at once (waiting or being compressed) before
/// the next compressed bundle is decompressed.
pub const STREAM_MEMORY: u64 = 128 << 20;

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
    /// Decompressed bytes held at once (see [`STREAM_MEMORY`]).
    pub memory: u64,
}

impl CollectOptions<'_> {
    pub fn new(spill: impl Into<PathBuf>, frames: Option<FrameParams>) -> Self {
        CollectOptions {
            frames,
            spill: spill.into(),
            keep: None,
            memory: STREAM_MEMORY,
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
    let stream = FatbinStream::new(section).keep(keep);
    let spill = Mutex::new(Spill::new(&opts.spill));
    let producer = Producer {
        path,
        input,
        section,
        spill: &spill,
        budget: Budget::new(opts.memory),
    };
    let (mut out, bundles) = match opts.frames {
        None => producer.run(stream, None)?,
        Some(params) => {
            let (tx, rx) = sync_channel::<Msg<'_>>(64);
            let done: Mutex<Vec<(usize, FileRange)>> = Mutex::new(Vec::new());
            let (produced, consumed) = std::thread::scope(|s| {
                let p = s.spawn(|| producer.run(stream, Some(tx)));
                let c = consume(path, rx, params, &spill, &done, &producer.budget);
                let p = p.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
                (p, c)
            });
            // A damaged input explains a failure of the consumer too.
            let (mut out, bundles) = produced?;
            consumed?;
            for (slot, bytes) in done.into_inner().unwrap_or_else(|e| e.into_inner()) {
                let co = &mut out[slot];
                co.data = KernelData::Frame(Frame {
                    bytes,
                    len: co.data.len(),
                    params,
                });
            }
            (out, bundles)
        }
    };
    let spilled = spill
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .finish()?;
    out.sort_by_key(|c| (c.bundle, c.entry));
    Ok(Collected {
        code_objects: out,
        dropped: dropped.into_inner(),
        bundles,
        spill: spilled,
    })
}

/// A decompressed code object to compress: its slot in the output, its
/// bytes, and the count of its buffer.
struct Msg<'a> {
    slot: usize,
    data: Blob<'a>,
    held: Arc<Held>,
}

/// Compress what the producer sends, in parallel; each frame appended to
/// the spill file, its place recorded in `done`.
fn consume(
    path: &Path,
    rx: Receiver<Msg<'_>>,
    params: FrameParams,
    spill: &Mutex<Spill>,
    done: &Mutex<Vec<(usize, FileRange)>>,
    budget: &Budget,
) -> Result<()> {
    let r = rx.into_iter().par_bridge().try_for_each_init(
        || FrameCompressor::new(params),
        |c, msg| -> Result<()> {
            let c = c.as_mut().map_err(|e| Error::io(path, clone_io(e)))?;
            let frame = c.compress(&msg.data).map_err(|e| Error::io(path, e))?;
            // The decompressed bytes go before the frame is written.
            drop(msg.data);
            drop(msg.held);
            let at = lock(spill).append(&frame)?;
            lock(done).push((msg.slot, at));
            Ok(())
        },
    );
    if r.is_err() {
        budget.abort();
    }
    r
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn clone_io(e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), e.to_string())
}

/// Reads the section: records every code object, hands decompressed ones
/// to the compressing threads (or, without them, spills them).
struct Producer<'p> {
    path: &'p Path,
    input: &'p Mapped,
    section: &'p [u8],
    spill: &'p Mutex<Spill>,
    budget: Budget,
}

impl Producer<'_> {
    /// Every code object, in stream order, and the number of bundles.
    fn run<'a>(
        &self,
        mut stream: FatbinStream<'a>,
        tx: Option<SyncSender<Msg<'a>>>,
    ) -> Result<(Vec<Located>, usize)> {
        let mut pages = Pages::new(self.input, self.section);
        let mut out = Vec::new();
        let mut current: Option<(usize, Weak<Held>)> = None;
        loop {
            if tx.is_some() && !self.budget.wait(stream.upcoming()) {
                // The compressing side failed: its error is reported.
                break;
            }
            let Some(co) = stream.next().with_path(self.path)? else {
                break;
            };
            let target = co.target().to_string();
            let len = co.data.len();
            let data = match (FileRange::of_slice(self.input, &co.data), &tx) {
                (Some(range), _) if !co.compressed => KernelData::File(range),
                (_, None) => KernelData::File(lock(self.spill).append(&co.data)?),
                (_, Some(tx)) => {
                    let held = self.held(&mut current, &co.data);
                    let msg = Msg {
                        slot: out.len(),
                        data: co.data.clone(),
                        held,
                    };
                    if tx.send(msg).is_err() {
                        break;
                    }
                    // Replaced by the frame once made.
                    placeholder(len)
                }
            };
            out.push(Located {
                bundle: co.bundle,
                entry: co.entry,
                triple: co.triple,
                target,
                data,
            });
            pages.release(&stream);
        }
        pages.release(&stream);
        Ok((out, stream.bundles()))
    }

    /// The count of the buffer `data` is a slice of: the last one's if the
    /// same and still counted (the producer keeps no count alive itself:
    /// it would never be released), else a new one.
    fn held(&self, current: &mut Option<(usize, Weak<Held>)>, data: &Blob) -> Arc<Held> {
        let (key, bytes) = match data {
            Blob::Shared(buf, _) => (Arc::as_ptr(buf) as *const u8 as usize, buf.len() as u64),
            Blob::Borrowed(b) => (b.as_ptr() as usize, b.len() as u64),
        };
        if let Some(h) = current
            .as_ref()
            .filter(|(k, _)| *k == key)
            .and_then(|(_, h)| h.upgrade())
        {
            return h;
        }
        let h = Arc::new(self.budget.hold(bytes));
        *current = Some((key, Arc::downgrade(&h)));
        h
    }
}

fn placeholder(len: usize) -> KernelData<'static> {
    KernelData::File(FileRange {
        path: Arc::from(Path::new("")),
        offset: 0,
        len,
    })
}

/// Decompressed bytes alive, against a limit.
struct Budget {
    state: Arc<(Mutex<u64>, Condvar)>,
    limit: u64,
    aborted: Arc<AtomicBool>,
}

/// Bytes of one decompressed buffer, counted in a [`Budget`] until
/// dropped.
struct Held {
    state: Arc<(Mutex<u64>, Condvar)>,
    bytes: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        let (m, cv) = &*self.state;
        *lock(m) -= self.bytes;
        cv.notify_all();
    }
}

impl Budget {
    fn new(limit: u64) -> Self {
        Budget {
            state: Arc::new((Mutex::new(0), Condvar::new())),
            limit,
            aborted: Arc::new(AtomicBool::new(false)),
        }
    }

    fn hold(&self, bytes: u64) -> Held {
        *lock(&self.state.0) += bytes;
        Held {
            state: self.state.clone(),
            bytes,
        }
    }

    /// Wait until `upcoming` more bytes fit beside those held (or nothing
    /// is held); `false` if the consumer gave up.
    fn wait(&self, upcoming: u64) -> bool {
        let (m, cv) = &*self.state;
        let mut held = lock(m);
        while *held > 0 && *held + upcoming > self.limit {
            if self.aborted.load(Ordering::Relaxed) {
                return false;
            }
            held = cv
                .wait_timeout(held, Duration::from_millis(50))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        !self.aborted.load(Ordering::Relaxed)
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
        self.state.1.notify_all();
    }
}

/// The input's pages read through the map, dropped as the stream moves on
/// (compressed bytes are read once; plain bundles' code objects are read
/// again through the file, not the map): touched pages of a map count in
/// the process's resident size.
pub(crate) struct Pages<'m> {
    input: &'m Mapped,
    /// The section's offset in the input, if it is a slice of the map.
    at: Option<usize>,
    /// Offset in the input up to which pages were dropped (a page
    /// boundary).
    released: usize,
}

impl<'m> Pages<'m> {
    pub(crate) fn new(input: &'m Mapped, section: &[u8]) -> Self {
        let at = input.offset_of(section).map(|o| o as usize);
        Pages {
            input,
            at,
            released: at.unwrap_or(0) / 4096 * 4096,
        }
    }

    pub(crate) fn release(&mut self, stream: &FatbinStream) {
        let Some(at) = self.at else { return };
        let upto = (at + stream.consumed()) / 4096 * 4096;
        if upto > self.released {
            self.input.release(self.released..upto);
            self.released = upto;
        }
    }
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
