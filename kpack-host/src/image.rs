//! A rewritten binary as pieces, never whole in memory: ranges of the input
//! file, zero runs, new bytes and ranges of another file (a spill), in
//! output order. The transforms (ELF and PE: offload, prune, restore) build
//! one with the operations a byte buffer has (`write`, `fill_zero`,
//! `copy_within`, `resize`, `read`); [`Image::write_to`] then streams it
//! into a file, the input's ranges copied by the kernel
//! (`copy_file_range`, falling back to reads and writes in bounded chunks),
//! so that what is held does not grow with the host part: only the changed
//! regions (headers, wrappers, relocations, the payload) are bytes here.
//!
//! Reads of input pieces come from the input's bytes (a memory map); the
//! caller releases the map's pages once the image is built.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::ops::Range;
use std::sync::Arc;

/// Where the bytes of one piece come from.
#[derive(Clone)]
enum Source {
    /// The input, from this offset.
    Input(u64),
    /// Zeros.
    Zeros,
    /// New bytes, from this offset in them (shared: a copied piece costs
    /// nothing).
    Bytes(Arc<[u8]>, usize),
    /// Another file (a spill), from this offset.
    File(Arc<File>, u64),
}

impl Source {
    /// The same source `n` bytes further on.
    fn advanced(&self, n: u64) -> Source {
        match self {
            Source::Input(o) => Source::Input(o + n),
            Source::Zeros => Source::Zeros,
            Source::Bytes(b, o) => Source::Bytes(b.clone(), o + n as usize),
            Source::File(f, o) => Source::File(f.clone(), o + n),
        }
    }
}

/// A piece: its length and source.
#[derive(Clone)]
struct Piece {
    len: u64,
    source: Source,
}

/// A range an operation named lies outside the image (the input's headers
/// put it there): the transform reports it as a malformed input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfRange {
    pub at: u64,
    pub len: u64,
}

/// The output file as pieces (see the module comment).
#[derive(Clone)]
pub struct Image<'a> {
    input: &'a [u8],
    /// Piece start offset in the output → piece; the pieces are contiguous
    /// from 0 to `len`.
    pieces: BTreeMap<u64, Piece>,
    len: u64,
}

impl std::fmt::Debug for Image<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("len", &self.len)
            .field("pieces", &self.pieces.len())
            .finish()
    }
}

/// The size of the buffers that stream bytes not copied by the kernel.
const CHUNK: usize = 1 << 20;

impl<'a> Image<'a> {
    /// An empty image over `input` (the bytes input pieces refer to).
    pub fn new(input: &'a [u8]) -> Image<'a> {
        Image {
            input,
            pieces: BTreeMap::new(),
            len: 0,
        }
    }

    /// The image of `input` unchanged.
    pub fn of_input(input: &'a [u8]) -> Image<'a> {
        let mut image = Image::new(input);
        image
            .push_input(0..input.len() as u64)
            .expect("the whole input is in range");
        image
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many pieces it has (tests, and a measure of what is held).
    pub fn piece_count(&self) -> usize {
        self.pieces.len()
    }

    fn push(&mut self, len: u64, source: Source) {
        if len > 0 {
            self.pieces.insert(self.len, Piece { len, source });
            self.len += len;
        }
    }

    /// Append the input's bytes of `range`.
    pub fn push_input(&mut self, range: Range<u64>) -> Result<(), OutOfRange> {
        if range.start > range.end || range.end > self.input.len() as u64 {
            return Err(OutOfRange {
                at: range.start,
                len: range.end.saturating_sub(range.start),
            });
        }
        self.push(range.end - range.start, Source::Input(range.start));
        Ok(())
    }

    /// Append `n` zero bytes.
    pub fn push_zeros(&mut self, n: u64) {
        self.push(n, Source::Zeros);
    }

    /// Append new bytes.
    pub fn push_bytes(&mut self, bytes: impl Into<Arc<[u8]>>) {
        let bytes: Arc<[u8]> = bytes.into();
        self.push(bytes.len() as u64, Source::Bytes(bytes, 0));
    }

    /// Append `len` bytes of `file` from `offset` (read when the image is
    /// written: the file must hold them then).
    pub fn push_file(&mut self, file: Arc<File>, offset: u64, len: u64) {
        self.push(len, Source::File(file, offset));
    }

    /// Grow with zeros, or cut, to `len` bytes.
    pub fn resize(&mut self, len: u64) {
        if len >= self.len {
            self.push_zeros(len - self.len);
            return;
        }
        self.split_at(len);
        let _ = self.pieces.split_off(&len);
        self.len = len;
    }

    fn check(&self, at: u64, len: u64) -> Result<(), OutOfRange> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfRange { at, len }),
        }
    }

    /// Make `at` the start of a piece (inside the image).
    fn split_at(&mut self, at: u64) {
        let Some((&start, piece)) = self.pieces.range(..at).next_back() else {
            return;
        };
        let end = start + piece.len;
        if at >= end {
            return;
        }
        let tail = Piece {
            len: end - at,
            source: piece.source.advanced(at - start),
        };
        self.pieces.get_mut(&start).expect("the piece found").len = at - start;
        self.pieces.insert(at, tail);
    }

    /// Replace the `len` bytes at `at` with `new` (pieces of that total
    /// length).
    fn replace(&mut self, at: u64, len: u64, new: Vec<Piece>) {
        self.split_at(at);
        self.split_at(at + len);
        let old: Vec<u64> = self.pieces.range(at..at + len).map(|(&s, _)| s).collect();
        for s in old {
            self.pieces.remove(&s);
        }
        let mut pos = at;
        for p in new.into_iter().filter(|p| p.len > 0) {
            let n = p.len;
            self.pieces.insert(pos, p);
            pos += n;
        }
        debug_assert_eq!(pos, at + len);
    }

    /// Overwrite the bytes at `at` with `bytes`.
    pub fn write(&mut self, at: u64, bytes: &[u8]) -> Result<(), OutOfRange> {
        let len = bytes.len() as u64;
        self.check(at, len)?;
        let piece = Piece {
            len,
            source: Source::Bytes(Arc::from(bytes), 0),
        };
        self.replace(at, len, vec![piece]);
        Ok(())
    }

    /// Overwrite the bytes of `range` with zeros.
    pub fn fill_zero(&mut self, range: Range<u64>) -> Result<(), OutOfRange> {
        let len = range.end.saturating_sub(range.start);
        self.check(range.start, len)?;
        let piece = Piece {
            len,
            source: Source::Zeros,
        };
        self.replace(range.start, len, vec![piece]);
        Ok(())
    }

    /// Overwrite the bytes at `at` with the input's bytes of `range`.
    pub fn write_input(&mut self, at: u64, range: Range<u64>) -> Result<(), OutOfRange> {
        let len = range.end.saturating_sub(range.start);
        self.check(at, len)?;
        if range.end > self.input.len() as u64 {
            return Err(OutOfRange {
                at: range.start,
                len,
            });
        }
        let piece = Piece {
            len,
            source: Source::Input(range.start),
        };
        self.replace(at, len, vec![piece]);
        Ok(())
    }

    /// Overwrite the `len` bytes at `at` with those of `file` from
    /// `offset` (read when the image is written).
    pub fn write_file(
        &mut self,
        at: u64,
        file: Arc<File>,
        offset: u64,
        len: u64,
    ) -> Result<(), OutOfRange> {
        self.check(at, len)?;
        let piece = Piece {
            len,
            source: Source::File(file, offset),
        };
        self.replace(at, len, vec![piece]);
        Ok(())
    }

    /// Copy the bytes of `from` to `to` (as `slice::copy_within`: the
    /// ranges may overlap).
    pub fn copy_within(&mut self, from: Range<u64>, to: u64) -> Result<(), OutOfRange> {
        let len = from.end.saturating_sub(from.start);
        self.check(from.start, len)?;
        self.check(to, len)?;
        let pieces = self.pieces_in(from.start, len);
        self.replace(to, len, pieces);
        Ok(())
    }

    /// The pieces covering `[at, at + len)`, cut to it.
    fn pieces_in(&self, at: u64, len: u64) -> Vec<Piece> {
        let end = at + len;
        let first = self.pieces.range(..=at).next_back().map_or(at, |(&s, _)| s);
        self.pieces
            .range(first..end)
            .filter_map(|(&s, p)| {
                let (lo, hi) = (s.max(at), (s + p.len).min(end));
                (hi > lo).then(|| Piece {
                    len: hi - lo,
                    source: p.source.advanced(lo - s),
                })
            })
            .collect()
    }

    /// The `len` bytes at `at`.
    pub fn read(&self, at: u64, len: u64) -> Result<Vec<u8>, OutOfRange> {
        self.check(at, len)?;
        let mut out = vec![0u8; len as usize];
        self.read_into(at, &mut out)?;
        Ok(out)
    }

    /// Fill `out` with the bytes at `at`.
    pub fn read_into(&self, at: u64, out: &mut [u8]) -> Result<(), OutOfRange> {
        let len = out.len() as u64;
        self.check(at, len)?;
        let mut pos = 0usize;
        for p in self.pieces_in(at, len) {
            let dst = &mut out[pos..pos + p.len as usize];
            self.fill(&p, dst).map_err(|_| OutOfRange { at, len })?;
            pos += p.len as usize;
        }
        Ok(())
    }

    /// The bytes of piece `p` (as long as `dst`) into `dst`.
    fn fill(&self, p: &Piece, dst: &mut [u8]) -> io::Result<()> {
        match &p.source {
            Source::Input(o) => dst.copy_from_slice(&self.input[*o as usize..][..dst.len()]),
            Source::Zeros => dst.fill(0),
            Source::Bytes(b, o) => dst.copy_from_slice(&b[*o..*o + dst.len()]),
            Source::File(f, o) => read_exact_at(f, dst, *o)?,
        }
        Ok(())
    }

    /// Every byte, in memory (for tests and small outputs).
    pub fn to_vec(&self) -> Vec<u8> {
        self.read(0, self.len).expect("the whole image is in range")
    }

    /// Stream the image into `out` from its current position: the input's
    /// pieces are copied from `input` (the input file, from which the
    /// input bytes were mapped) by the kernel where it can, else through a
    /// bounded buffer; without `input`, from the input bytes.
    pub fn write_to(&self, out: &mut File, input: Option<&File>) -> io::Result<()> {
        let mut buf = Vec::with_capacity(CHUNK);
        for p in self.pieces.values() {
            match (&p.source, input) {
                (Source::Input(o), Some(file)) => {
                    flush(out, &mut buf)?;
                    copy_range(file, *o, p.len, out)?;
                }
                (Source::File(f, o), _) => {
                    flush(out, &mut buf)?;
                    copy_range(f, *o, p.len, out)?;
                }
                _ => self.buffered(p, out, &mut buf)?,
            }
        }
        flush(out, &mut buf)
    }

    /// Piece `p` through `buf`, flushed to `out` whenever it is full.
    fn buffered(&self, p: &Piece, out: &mut File, buf: &mut Vec<u8>) -> io::Result<()> {
        let mut done = 0u64;
        while done < p.len {
            let n = (p.len - done).min((CHUNK - buf.len()) as u64) as usize;
            let start = buf.len();
            buf.resize(start + n, 0);
            let piece = Piece {
                len: n as u64,
                source: p.source.advanced(done),
            };
            self.fill(&piece, &mut buf[start..])?;
            done += n as u64;
            if buf.len() == CHUNK {
                flush(out, buf)?;
            }
        }
        Ok(())
    }
}

fn flush(out: &mut File, buf: &mut Vec<u8>) -> io::Result<()> {
    out.write_all(buf)?;
    buf.clear();
    Ok(())
}

/// `len` bytes of `from` at `offset` appended to `out`: by the kernel
/// (`copy_file_range`, at an explicit offset: `from`'s own position is
/// left alone) where the system can, else through a bounded buffer.
fn copy_range(from: &File, offset: u64, len: u64, out: &mut File) -> io::Result<()> {
    let done = kernel_copy(from, offset, len, out)?;
    copy_buffered(from, offset + done, len - done, out)
}

/// [`copy_range`] through a buffer of at most [`CHUNK`] bytes.
fn copy_buffered(from: &File, offset: u64, len: u64, out: &mut impl Write) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK.min(len as usize)];
    let mut pos = 0u64;
    while pos < len {
        let n = ((len - pos) as usize).min(buf.len());
        read_exact_at(from, &mut buf[..n], offset + pos)?;
        out.write_all(&buf[..n])?;
        pos += n as u64;
    }
    Ok(())
}

/// As much of [`copy_range`] as `copy_file_range` does: the bytes copied
/// (fewer than `len` where the system or the file systems cannot).
#[cfg(target_os = "linux")]
fn kernel_copy(from: &File, offset: u64, len: u64, out: &mut File) -> io::Result<u64> {
    let mut done = 0u64;
    while done < len {
        let mut at = offset + done;
        let want = (len - done).min(1 << 30) as usize;
        match rustix::fs::copy_file_range(from, Some(&mut at), &*out, None, want) {
            Ok(0) => break,
            Ok(n) => done += n as u64,
            Err(rustix::io::Errno::INTR) => {}
            // Not supported between these files (another file system, an
            // old kernel, a special file): the buffered copy takes over.
            Err(_) => break,
        }
    }
    Ok(done)
}

#[cfg(not(target_os = "linux"))]
fn kernel_copy(_: &File, _: u64, _: u64, _: &mut File) -> io::Result<u64> {
    Ok(0)
}

#[cfg(unix)]
fn read_exact_at(f: &File, dst: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, dst, offset)
}

#[cfg(not(unix))]
fn read_exact_at(f: &File, dst: &mut [u8], offset: u64) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = f.try_clone()?;
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An image and the `Vec` it must equal after the same operations.
    fn model(input: &[u8]) -> (Image<'_>, Vec<u8>) {
        (Image::of_input(input), input.to_vec())
    }

    #[test]
    fn operations_match_a_byte_buffer() {
        let input: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let (mut img, mut v) = model(&input);
        img.write(100, b"hello").unwrap();
        v[100..105].copy_from_slice(b"hello");
        img.fill_zero(50..120).unwrap();
        v[50..120].fill(0);
        img.copy_within(90..3000, 20).unwrap();
        v.copy_within(90..3000, 20);
        img.copy_within(10..500, 400).unwrap();
        v.copy_within(10..500, 400);
        img.resize(12_000);
        v.resize(12_000, 0);
        img.push_bytes(vec![7u8; 33]);
        v.extend([7u8; 33]);
        img.write(
            11_990,
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
        )
        .unwrap();
        v[11_990..12_006].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        img.resize(9_000);
        v.truncate(9_000);
        assert_eq!(img.len(), v.len() as u64);
        assert_eq!(img.to_vec(), v);
        assert_eq!(img.read(17, 4000).unwrap(), v[17..4017]);
    }

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
        }

        fn range(&mut self, len: u64) -> Range<u64> {
            let start = self.below(len + 1);
            start..start + self.below(len - start + 1)
        }
    }

    /// One random operation on both the image and its model.
    fn random_op(rng: &mut Rng, img: &mut Image, v: &mut Vec<u8>, input_len: u64) {
        let len = v.len() as u64;
        match rng.below(6) {
            0 => {
                let r = rng.range(len);
                let bytes: Vec<u8> = (0..r.end - r.start).map(|_| rng.below(256) as u8).collect();
                img.write(r.start, &bytes).unwrap();
                v[r.start as usize..r.end as usize].copy_from_slice(&bytes);
            }
            1 => {
                let r = rng.range(len);
                img.fill_zero(r.clone()).unwrap();
                v[r.start as usize..r.end as usize].fill(0);
            }
            2 => {
                let r = rng.range(len);
                let to = rng.below(len - (r.end - r.start) + 1);
                img.copy_within(r.clone(), to).unwrap();
                v.copy_within(r.start as usize..r.end as usize, to as usize);
            }
            3 => {
                let n = rng.below(len / 2 + 64);
                let grow = len + n;
                let new_len = if rng.below(2) == 0 {
                    grow
                } else {
                    len - n.min(len)
                };
                img.resize(new_len);
                v.resize(new_len as usize, 0);
            }
            4 => {
                let src = rng.range(input_len);
                let at = rng.below(len.saturating_sub(src.end - src.start) + 1);
                if at + (src.end - src.start) <= len {
                    img.write_input(at, src.clone()).unwrap();
                    let from = &img.input[src.start as usize..src.end as usize];
                    v[at as usize..(at + src.end - src.start) as usize].copy_from_slice(from);
                }
            }
            _ => {
                let r = rng.range(input_len);
                img.push_input(r.clone()).unwrap();
                v.extend_from_slice(&img.input[r.start as usize..r.end as usize]);
            }
        }
    }

    #[test]
    fn random_operations_match_a_byte_buffer() {
        let input: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        for seed in 1..=200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let (mut img, mut v) = model(&input);
            for step in 0..40 {
                random_op(&mut rng, &mut img, &mut v, input.len() as u64);
                assert_eq!(img.len(), v.len() as u64, "seed {seed} step {step}");
            }
            assert_eq!(img.to_vec(), v, "seed {seed}");
        }
    }

    #[test]
    fn the_buffered_copy_copies_any_range() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..CHUNK as u32 * 2 + 5).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("in"), &data).unwrap();
        let from = File::open(dir.path().join("in")).unwrap();
        let mut out = Vec::new();
        copy_buffered(&from, 3, CHUNK as u64 + 9, &mut out).unwrap();
        assert_eq!(out, data[3..CHUNK + 12]);
        let short = copy_buffered(&from, data.len() as u64 - 2, 4, &mut Vec::new());
        assert_eq!(short.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn out_of_range_is_an_error() {
        let input = [1u8; 64];
        let mut img = Image::of_input(&input);
        assert_eq!(img.write(60, &[0; 8]), Err(OutOfRange { at: 60, len: 8 }));
        assert!(img.fill_zero(10..65).is_err());
        assert!(img.copy_within(0..10, 60).is_err());
        assert!(img.read(u64::MAX, 2).is_err());
        assert!(img.push_input(10..65).is_err());
        assert_eq!(img.to_vec(), input);
    }

    #[test]
    fn streams_through_the_kernel_or_the_bytes_alike() {
        let dir = tempfile::tempdir().unwrap();
        let input: Vec<u8> = (0..3 * CHUNK as u32 + 17).map(|i| (i * 31) as u8).collect();
        let in_path = dir.path().join("in");
        std::fs::write(&in_path, &input).unwrap();
        let spill_path = dir.path().join("spill");
        std::fs::write(&spill_path, b"0123456789").unwrap();
        let spill = Arc::new(File::open(&spill_path).unwrap());
        let mut img = Image::new(&input);
        img.push_input(5..CHUNK as u64 * 2).unwrap();
        img.push_zeros(CHUNK as u64 + 3);
        img.push_file(spill, 2, 6);
        img.push_input(7..input.len() as u64).unwrap();
        img.write(CHUNK as u64, b"patched").unwrap();
        let expected = img.to_vec();
        let from = File::open(&in_path).unwrap();
        for input_file in [Some(&from), None] {
            let out_path = dir.path().join("out");
            let mut out = File::create(&out_path).unwrap();
            img.write_to(&mut out, input_file).unwrap();
            drop(out);
            assert_eq!(std::fs::read(&out_path).unwrap(), expected);
        }
    }
}
