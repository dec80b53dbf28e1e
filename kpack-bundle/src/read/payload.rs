//! A CCOB payload decompressed on demand (zstd or zlib), never past the
//! size its header states.

use std::io::Read;

use md5::{Digest, Md5};
use zstd::zstd_safe::{get_error_name, DCtx, InBuffer, OutBuffer, ResetDirective};

use crate::{BundleError, Method};

/// Bytes decompressed ahead of what is asked for (entry tables, padding).
pub(super) const LOOKAHEAD: usize = 64 << 10;

/// The decompressor of a payload.
enum Inflate<'a> {
    Zstd {
        dctx: DCtx<'static>,
        input: &'a [u8],
        pos: usize,
        /// Inside a frame (its end not reached yet).
        in_frame: bool,
    },
    Zlib(Box<flate2::read::ZlibDecoder<&'a [u8]>>),
}

impl Inflate<'_> {
    /// Up to `out.len()` more decompressed bytes; 0 at the end.
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let Inflate::Zstd {
            dctx,
            input,
            pos,
            in_frame,
        } = self
        else {
            let Inflate::Zlib(z) = self else {
                unreachable!()
            };
            return z.read(out);
        };
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if *pos == input.len() && !*in_frame {
                return Ok(0);
            }
            let mut ob = OutBuffer::around(&mut *out);
            let mut ib = InBuffer::around(&input[*pos..]);
            let hint = dctx
                .decompress_stream(&mut ob, &mut ib)
                .map_err(|code| std::io::Error::other(get_error_name(code)))?;
            *pos += ib.pos();
            *in_frame = hint != 0;
            let produced = ob.pos();
            if produced > 0 {
                return Ok(produced);
            }
            if ib.pos() == 0 && *in_frame {
                // Nothing consumed, nothing produced: the frame is cut off.
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "incomplete frame",
                ));
            }
        }
    }
}

/// A CCOB payload, decompressed on demand, never past the size its header
/// states; bytes come out in order through a small look-ahead buffer.
pub(super) struct Payload<'a> {
    inflate: Inflate<'a>,
    method: Method,
    /// The CCOB's offset (for errors).
    offset: usize,
    /// The uncompressed size the header states.
    pub(super) expected: u64,
    /// Decompressed offset of the next byte handed out.
    pub(super) pos: u64,
    /// Bytes the decompressor produced (handed out or in `buf`).
    produced: u64,
    buf: Vec<u8>,
    /// `buf[head..]` is decompressed and not handed out yet.
    head: usize,
    pub(super) md5: Option<Md5>,
    /// Bytes handed out are copied here while it is set.
    pub(super) record: Option<Vec<u8>>,
}

impl<'a> Payload<'a> {
    pub(super) fn new(
        input: &'a [u8],
        method: Method,
        expected: u64,
        offset: usize,
        dctx: Option<DCtx<'static>>,
        hash: bool,
    ) -> Self {
        let inflate = match method {
            Method::Zstd => {
                let mut dctx = dctx.unwrap_or_else(DCtx::create);
                // A context reused after an error may hold a frame's state.
                let _ = dctx.reset(ResetDirective::SessionOnly);
                Inflate::Zstd {
                    dctx,
                    input,
                    pos: 0,
                    in_frame: false,
                }
            }
            Method::Zlib => Inflate::Zlib(Box::new(flate2::read::ZlibDecoder::new(input))),
        };
        Payload {
            inflate,
            method,
            offset,
            expected,
            pos: 0,
            produced: 0,
            buf: Vec::new(),
            head: 0,
            md5: hash.then(Md5::new),
            record: None,
        }
    }

    /// Compressed bytes consumed so far.
    pub(super) fn input_pos(&self) -> usize {
        match &self.inflate {
            Inflate::Zstd { pos, .. } => *pos,
            Inflate::Zlib(z) => z.total_in() as usize,
        }
    }

    pub(super) fn into_dctx(self) -> Option<DCtx<'static>> {
        match self.inflate {
            Inflate::Zstd { dctx, .. } => Some(dctx),
            Inflate::Zlib(_) => None,
        }
    }

    fn fail(&self, e: std::io::Error) -> BundleError {
        BundleError::Decompress {
            offset: self.offset,
            method: self.method,
            message: e.to_string(),
        }
    }

    fn short(&self) -> BundleError {
        BundleError::SizeMismatch {
            offset: self.offset,
            expected: self.expected,
            actual: self.produced,
        }
    }

    /// Decompress into `out`, at most `limit` bytes more than `produced`
    /// allows past `expected` + 1; returns how many came.
    fn inflate_into(&mut self, out: &mut [u8]) -> Result<usize, BundleError> {
        // Never more than one byte past the stated size.
        let room = (self.expected + 1).saturating_sub(self.produced);
        let n = out.len().min(room.min(usize::MAX as u64) as usize);
        if n == 0 {
            return Ok(0);
        }
        let got = self.inflate.read(&mut out[..n]).map_err(|e| self.fail(e))?;
        if let Some(m) = self.md5.as_mut() {
            // The byte past the stated size never counts: it is an error.
            let counted = (self.expected.saturating_sub(self.produced) as usize).min(got);
            m.update(&out[..counted]);
        }
        self.produced += got as u64;
        if self.produced > self.expected {
            return Err(BundleError::SizeMismatch {
                offset: self.offset,
                expected: self.expected,
                actual: self.produced,
            });
        }
        Ok(got)
    }

    /// The next `n` bytes without handing them out (fewer at the end of
    /// the stated size).
    pub(super) fn peek(&mut self, n: usize) -> Result<&[u8], BundleError> {
        let n = n.min((self.expected - self.pos) as usize);
        if self.buf.len() - self.head < n {
            self.buf.drain(..self.head);
            self.head = 0;
            // The buffer grows with the data the stream actually gives (a
            // lying length in an entry table cannot make it allocate).
            let cap = n.max(LOOKAHEAD);
            while self.buf.len() < n {
                let have = self.buf.len();
                let want = (have + LOOKAHEAD).max(have.saturating_mul(2)).min(cap);
                self.buf.resize(want, 0);
                let got = self.inflate_into_buf(have)?;
                self.buf.truncate(have + got);
                if got == 0 {
                    return Err(self.short());
                }
            }
        }
        Ok(&self.buf[self.head..self.head + n])
    }

    fn inflate_into_buf(&mut self, from: usize) -> Result<usize, BundleError> {
        let mut buf = std::mem::take(&mut self.buf);
        let r = self.inflate_into(&mut buf[from..]);
        self.buf = buf;
        r
    }

    /// Hand out the next `n` bytes (all within the stated size).
    pub(super) fn take(&mut self, n: usize) -> Result<&[u8], BundleError> {
        self.peek(n)?;
        let (from, to) = (self.head, self.head + n);
        self.head = to;
        self.pos += n as u64;
        if let Some(r) = self.record.as_mut() {
            r.extend_from_slice(&self.buf[from..to]);
        }
        Ok(&self.buf[from..to])
    }

    /// Skip `n` bytes.
    pub(super) fn skip(&mut self, n: u64) -> Result<(), BundleError> {
        let mut left = n;
        while left > 0 {
            let step = left.min(LOOKAHEAD as u64) as usize;
            self.take(step)?;
            left -= step as u64;
        }
        Ok(())
    }

    /// Skip to decompressed offset `to` (at or after the current one).
    pub(super) fn skip_to(&mut self, to: u64) -> Result<(), BundleError> {
        self.skip(to.saturating_sub(self.pos))
    }

    /// Fill `out` with the next bytes.
    pub(super) fn read_exact(&mut self, out: &mut [u8]) -> Result<(), BundleError> {
        let buffered = (self.buf.len() - self.head).min(out.len());
        out[..buffered].copy_from_slice(&self.buf[self.head..self.head + buffered]);
        self.head += buffered;
        let mut filled = buffered;
        while filled < out.len() {
            let got = self.inflate_into(&mut out[filled..])?;
            if got == 0 {
                return Err(self.short());
            }
            filled += got;
        }
        self.pos += out.len() as u64;
        Ok(())
    }

    /// At the stated size: check that the payload ends there.
    pub(super) fn finish(&mut self) -> Result<(), BundleError> {
        debug_assert_eq!(self.pos, self.expected);
        let mut one = [0u8; 1];
        if self.produced == self.expected {
            self.inflate_into(&mut one)?;
        }
        Ok(())
    }

    /// Decompress the rest, discarding it: an error it gives, if any.
    pub(super) fn drain(&mut self) -> Result<(), BundleError> {
        self.record = None;
        let mut scratch = vec![0u8; LOOKAHEAD];
        loop {
            if self.inflate_into(&mut scratch)? == 0 {
                break;
            }
        }
        if self.produced != self.expected {
            return Err(self.short());
        }
        Ok(())
    }
}

/// Decompress a whole payload (exactly `expected` bytes).
pub(super) fn decompress_all(
    input: &[u8],
    method: Method,
    expected: u64,
    offset: usize,
) -> Result<Vec<u8>, BundleError> {
    let mut p = Payload::new(input, method, expected, offset, None, false);
    // A lying header cannot make us allocate: the buffer grows with the
    // data actually produced.
    let mut out = Vec::with_capacity(expected.min(64 << 20) as usize);
    loop {
        let have = out.len();
        let want = (have + LOOKAHEAD).max(have * 2).min(expected as usize + 1);
        out.resize(want.max(have + 1), 0);
        let got = p.inflate_into(&mut out[have..])?;
        out.truncate(have + got);
        if got == 0 {
            break;
        }
    }
    if p.produced != expected {
        return Err(p.short());
    }
    Ok(out)
}
