//! MessagePack, kpack's one layer over `rmp`: archive TOCs (formats.md §3.3) and
//! HIPK metadata (§4.2).
//!
//! - [`Value`] is `rmpv`'s document model; maps keep their entries in
//!   order, so a decoded map re-encodes to the same bytes.
//! - [`decode`], [`decode_prefix`] and [`read`] parse untrusted bytes and
//!   never panic: nesting is limited to [`MAX_DEPTH`] levels, nothing is
//!   allocated for a claimed length before its bytes have been read (an
//!   `array32 0xffffffff` of 5 bytes allocates nothing), strings must be
//!   UTF-8, and extension types and the never-used marker `0xc1` are
//!   rejected. [`read`] takes a stream and reads exactly the bytes the value
//!   has, one pass, nothing after it.
//! - [`encode`] and [`to_vec`] write what Python's
//!   `msgpack.packb(obj, use_bin_type=True)` writes for the same object: the
//!   smallest integer, string, binary, array and map forms (`rmp`'s
//!   writers), strings as `str`, byte strings as `bin`, map entries in the
//!   order given.
//!
//! The decoder walks markers with `rmp`'s low-level reader instead of
//! calling `rmpv::decode::read_value`, because that one reads `0xc1` as nil,
//! keeps invalid UTF-8, accepts extension types and cannot say where in the
//! input a problem is.

use std::io::{self, Read};

use rmp::decode::RmpRead;
use rmp::Marker;
pub use rmpv::Value;

/// Maximum nesting depth of arrays and maps accepted by the decoder.
pub(crate) const MAX_DEPTH: usize = 64;

/// Why bytes are not a (supported) MessagePack value. `offset` is the byte
/// offset, within the decoded input, of the item at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("MessagePack data ends early at byte {offset}")]
    Truncated { offset: u64 },
    #[error("byte 0x{marker:02x} at byte {offset} is not a MessagePack type marker")]
    InvalidMarker { offset: u64, marker: u8 },
    #[error(
        "MessagePack extension type (marker 0x{marker:02x}) at byte {offset} is not supported"
    )]
    UnsupportedExt { offset: u64, marker: u8 },
    #[error("MessagePack string at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { offset: u64 },
    #[error("MessagePack nesting deeper than {limit} levels at byte {offset}")]
    TooDeep { offset: u64, limit: usize },
    #[error("{count} unexpected bytes after the MessagePack value, at byte {offset}")]
    TrailingBytes { offset: u64, count: u64 },
}

/// Decode one value that must span all of `bytes`.
pub fn decode(bytes: &[u8]) -> Result<Value, DecodeError> {
    let (value, used) = decode_prefix(bytes)?;
    if used != bytes.len() {
        return Err(DecodeError::TrailingBytes {
            offset: used as u64,
            count: (bytes.len() - used) as u64,
        });
    }
    Ok(value)
}

/// Decode the value at the start of `bytes`; returns it and the number of
/// bytes it used. Bytes after it are ignored.
pub fn decode_prefix(bytes: &[u8]) -> Result<(Value, usize), DecodeError> {
    let (value, used) = read(bytes)?;
    // `used` <= bytes.len(): the reader cannot hand out more.
    Ok((value, used as usize))
}

/// Decode the value at the start of stream `rd`, reading exactly its bytes
/// (a byte after the value is never asked for); returns it and the number
/// of bytes it used. An I/O error or the end of the stream inside the value
/// is [`DecodeError::Truncated`].
pub fn read(rd: impl Read) -> Result<(Value, u64), DecodeError> {
    let mut d = Decoder { rd, pos: 0 };
    let value = d.value(0)?;
    Ok((value, d.pos))
}

/// Encode `value` as Python's `msgpack.packb(value, use_bin_type=True)` does.
pub fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail; rmpv writes lengths as u32 (MessagePack
    // has no longer ones), which no value kpack builds comes near.
    rmpv::encode::write_value(&mut out, value).expect("writing to a Vec");
    out
}

/// Encode a typed value (a `serde::Serialize`; structs as maps of their
/// field names) as [`encode`] would encode the same document.
pub fn to_vec<T: serde::Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    let mut ser = rmp_serde::Serializer::new(&mut out).with_struct_map();
    // Only I/O can fail, and writing to a Vec does not; kpack's schemas
    // serialize no type MessagePack lacks.
    value.serialize(&mut ser).expect("writing to a Vec");
    out
}

/// A map with string keys, in the given order.
pub fn str_map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Value {
    Value::Map(
        entries
            .into_iter()
            .map(|(k, v)| (Value::from(k.into()), v))
            .collect(),
    )
}

/// The value of the first entry whose key is the string `key`, if `map` is
/// a map. `None` for a non-map or a missing key.
pub fn get<'v>(map: &'v Value, key: &str) -> Option<&'v Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// The kind of `value`, for error messages ("int", "str", "map", ...).
pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Boolean(_) => "bool",
        Value::Integer(_) => "int",
        Value::F32(_) | Value::F64(_) => "float",
        Value::String(_) => "str",
        Value::Binary(_) => "bin",
        Value::Array(_) => "array",
        Value::Map(_) => "map",
        Value::Ext(..) => "ext",
    }
}

/// The error for an item at `at` whose bytes end early.
fn truncated<E>(at: u64) -> impl Fn(E) -> DecodeError + Copy {
    move |_| DecodeError::Truncated { offset: at }
}

/// A reader that counts the bytes it handed out.
struct Decoder<R> {
    rd: R,
    pos: u64,
}

impl<R: Read> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.rd.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read> Decoder<R> {
    /// The value starting here, nested `depth` levels deep.
    fn value(&mut self, depth: usize) -> Result<Value, DecodeError> {
        let at = self.pos;
        let cut = truncated(at);
        let marker = rmp::decode::read_marker(self).map_err(truncated(at))?;
        Ok(match marker {
            Marker::Null => Value::Nil,
            Marker::True => Value::Boolean(true),
            Marker::False => Value::Boolean(false),
            Marker::FixPos(v) => Value::from(v),
            Marker::FixNeg(v) => Value::from(v),
            Marker::U8 => Value::from(self.read_data_u8().map_err(cut)?),
            Marker::U16 => Value::from(self.read_data_u16().map_err(cut)?),
            Marker::U32 => Value::from(self.read_data_u32().map_err(cut)?),
            Marker::U64 => Value::from(self.read_data_u64().map_err(cut)?),
            Marker::I8 => Value::from(self.read_data_i8().map_err(cut)?),
            Marker::I16 => Value::from(self.read_data_i16().map_err(cut)?),
            Marker::I32 => Value::from(self.read_data_i32().map_err(cut)?),
            Marker::I64 => Value::from(self.read_data_i64().map_err(cut)?),
            Marker::F32 => Value::F32(self.read_data_f32().map_err(cut)?),
            Marker::F64 => Value::F64(self.read_data_f64().map_err(cut)?),
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                let bytes = self.bytes(marker, at)?;
                match String::from_utf8(bytes) {
                    Ok(s) => Value::from(s),
                    Err(_) => return Err(DecodeError::InvalidUtf8 { offset: at }),
                }
            }
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => Value::Binary(self.bytes(marker, at)?),
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
                let len = self.len(marker, at)?;
                self.nest(depth, at)?;
                let mut items = Vec::new();
                for _ in 0..len {
                    items.push(self.value(depth + 1)?);
                }
                Value::Array(items)
            }
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
                let len = self.len(marker, at)?;
                self.nest(depth, at)?;
                let mut entries = Vec::new();
                for _ in 0..len {
                    let k = self.value(depth + 1)?;
                    entries.push((k, self.value(depth + 1)?));
                }
                Value::Map(entries)
            }
            Marker::Reserved => {
                return Err(DecodeError::InvalidMarker {
                    offset: at,
                    marker: marker.to_u8(),
                })
            }
            _ => {
                return Err(DecodeError::UnsupportedExt {
                    offset: at,
                    marker: marker.to_u8(),
                })
            }
        })
    }

    /// Fail if a container at `depth` would nest too deep.
    fn nest(&self, depth: usize, at: u64) -> Result<(), DecodeError> {
        if depth >= MAX_DEPTH {
            return Err(DecodeError::TooDeep {
                offset: at,
                limit: MAX_DEPTH,
            });
        }
        Ok(())
    }

    /// The length of the str, bin, array or map whose marker was read.
    fn len(&mut self, marker: Marker, at: u64) -> Result<u32, DecodeError> {
        let cut = truncated(at);
        match marker {
            Marker::FixStr(n) | Marker::FixArray(n) | Marker::FixMap(n) => Ok(n.into()),
            Marker::Str8 | Marker::Bin8 => self.read_data_u8().map(u32::from).map_err(cut),
            Marker::Str16 | Marker::Bin16 | Marker::Array16 | Marker::Map16 => {
                self.read_data_u16().map(u32::from).map_err(cut)
            }
            _ => self.read_data_u32().map_err(cut),
        }
    }

    /// The payload of a str or bin: read as it arrives, so a claimed length
    /// allocates only what the input really holds.
    fn bytes(&mut self, marker: Marker, at: u64) -> Result<Vec<u8>, DecodeError> {
        let len = self.len(marker, at)?;
        // A short payload (nearly every string of a TOC: keys, targets,
        // field names) is read whole into the stack, then copied into an
        // allocation of its size: `read_to_end` below probes and grows,
        // which cost more than the rest of decoding such a string.
        let mut stack = [0u8; 64];
        if let Some(short) = stack.get_mut(..len as usize) {
            self.read_exact(short).map_err(truncated(at))?;
            return Ok(short.to_vec());
        }
        let mut buf = Vec::new();
        match self.by_ref().take(len.into()).read_to_end(&mut buf) {
            Ok(n) if n as u64 == u64::from(len) => Ok(buf),
            _ => Err(DecodeError::Truncated { offset: at }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Encodings produced by Python msgpack 1.1 `packb(x, use_bin_type=True)`.
    #[test]
    fn integers_match_python() {
        let cases: &[(Value, &str)] = &[
            (Value::from(0i64), "00"),
            (Value::from(1i64), "01"),
            (Value::from(127i64), "7f"),
            (Value::from(128i64), "cc80"),
            (Value::from(255i64), "ccff"),
            (Value::from(256i64), "cd0100"),
            (Value::from(65535i64), "cdffff"),
            (Value::from(65536i64), "ce00010000"),
            (Value::from(u64::from(u32::MAX)), "ceffffffff"),
            (Value::from(1u64 << 32), "cf0000000100000000"),
            (Value::from(u64::MAX), "cfffffffffffffffff"),
            (Value::from(-1i64), "ff"),
            (Value::from(-5i64), "fb"),
            (Value::from(-32i64), "e0"),
            (Value::from(-33i64), "d0df"),
            (Value::from(-128i64), "d080"),
            (Value::from(-129i64), "d1ff7f"),
            (Value::from(-32768i64), "d18000"),
            (Value::from(-32769i64), "d2ffff7fff"),
            (Value::from(i64::from(i32::MIN)), "d280000000"),
            (Value::from(i64::from(i32::MIN) - 1), "d3ffffffff7fffffff"),
            (Value::from(i64::MIN), "d38000000000000000"),
            // Every integer type encodes alike.
            (Value::from(300i32), "cd012c"),
            (Value::from(300u16), "cd012c"),
            (Value::from(5u8), "05"),
        ];
        for (v, want) in cases {
            let got = encode(v);
            assert_eq!(hex(&got), *want, "{v:?}");
            assert_eq!(&decode(&got).unwrap(), v);
            assert_eq!(to_vec(v), got, "serde path: {v:?}");
        }
    }

    #[test]
    fn scalars_match_python() {
        let cases: &[(Value, &str)] = &[
            (Value::Nil, "c0"),
            (Value::Boolean(true), "c3"),
            (Value::Boolean(false), "c2"),
            (Value::F64(1.5), "cb3ff8000000000000"),
            (Value::F64(3.25), "cb400a000000000000"),
            (Value::from(""), "a0"),
            (Value::Binary(vec![]), "c400"),
            (Value::Array(vec![]), "90"),
            (Value::Map(vec![]), "80"),
        ];
        for (v, want) in cases {
            let got = encode(v);
            assert_eq!(hex(&got), *want, "{v:?}");
            assert_eq!(&decode(&got).unwrap(), v);
            assert_eq!(to_vec(v), got, "serde path: {v:?}");
        }
        assert_eq!(decode(&unhex("ca3fc00000")).unwrap(), Value::F32(1.5));
        assert_eq!(encode(&Value::F32(1.5)), unhex("ca3fc00000"));
    }

    /// (value, total length, first bytes) from Python.
    #[test]
    fn lengths_match_python() {
        let s = |n: usize| Value::from("a".repeat(n));
        let b = |n: usize| Value::Binary(vec![b'x'; n]);
        let a = |n: usize| Value::Array((0..n).map(|i| Value::from(i as u64 % 128)).collect());
        let cases: &[(Value, usize, &str)] = &[
            (s(31), 32, "bf61"),
            (s(32), 34, "d92061"),
            (s(255), 257, "d9ff61"),
            (s(256), 259, "da010061"),
            (s(65535), 65538, "daffff61"),
            (s(65536), 65541, "db0001000061"),
            (b(255), 257, "c4ff78"),
            (b(256), 259, "c5010078"),
            (b(65536), 65541, "c60001000078"),
            (a(15), 16, "9f0001"),
            (a(16), 19, "dc00100001"),
            (a(65536), 65536 + 5, "dd0001000000"),
        ];
        for (v, len, prefix) in cases {
            let got = encode(v);
            assert_eq!(got.len(), *len, "{}", type_name(v));
            assert!(
                hex(&got).starts_with(prefix),
                "{} {}",
                type_name(v),
                hex(&got[..8])
            );
            assert_eq!(&decode(&got).unwrap(), v);
            assert_eq!(to_vec(v), got, "serde path: {}", type_name(v));
        }
    }

    #[test]
    fn maps_keep_order_and_match_python() {
        // {str(i): i for i in range(15)} / range(16)
        let m = |n: usize| str_map((0..n).map(|i| (i.to_string(), Value::from(i as u64))));
        let e15 = encode(&m(15));
        assert_eq!(e15.len(), 51);
        assert!(hex(&e15).starts_with("8fa13000a13101a13202a133"));
        let e16 = encode(&m(16));
        assert_eq!(e16.len(), 57);
        assert!(hex(&e16).starts_with("de0010a13000a13101a13202"));
        assert_eq!(decode(&e16).unwrap(), m(16));

        let hipk = str_map([
            (
                "kpack_search_paths",
                Value::Array(vec!["../.kpack/blas_@GFXARCH@.kpack".into()]),
            ),
            ("kernel_name", "lib/librocblas.so".into()),
        ]);
        let want =
            "82b26b7061636b5f7365617263685f706174687391be2e2e2f2e6b7061636b2f626c61735f40474658\
             41524348402e6b7061636bab6b65726e656c5f6e616d65b16c69622f6c6962726f63626c61732e736f";
        assert_eq!(hex(&encode(&hipk)), want);
        assert_eq!(hex(&to_vec(&hipk)), want);
        assert_eq!(
            get(&hipk, "kernel_name").and_then(Value::as_str),
            Some("lib/librocblas.so")
        );
        assert_eq!(get(&hipk, "nope"), None);
        assert_eq!(get(&Value::from(1u8), "kernel_name"), None);
    }

    #[test]
    fn truncated_inputs_fail_cleanly() {
        let full = encode(&str_map([
            ("a", Value::Array(vec![Value::from(70000u64), "xyz".into()])),
            ("b", Value::Binary(vec![1, 2, 3])),
            ("c", Value::F64(2.0)),
        ]));
        for cut in 0..full.len() {
            let err = decode(&full[..cut]).unwrap_err();
            assert!(matches!(err, DecodeError::Truncated { .. }), "{cut}: {err}");
        }
        assert!(decode(&full).is_ok());
        // The offset is that of the item cut short.
        assert_eq!(
            decode(&full[..full.len() - 1]),
            Err(DecodeError::Truncated {
                offset: full.len() as u64 - 9
            })
        );
    }

    #[test]
    fn huge_lengths_do_not_allocate() {
        // array32 / map32 / str32 / bin32 claiming 4 GiB with nothing after:
        // the first element (at 5) or the payload (of the item at 0) is
        // missing.
        for (m, offset) in [(0xdd, 5), (0xdf, 5), (0xdb, 0), (0xc6, 0)] {
            let err = decode(&[m, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
            assert_eq!(err, DecodeError::Truncated { offset }, "{m:02x}");
        }
        // A str32 claiming 4 GiB with a few bytes after: what is there is
        // read, nothing more is reserved.
        let err = decode(&[0xdb, 0xff, 0xff, 0xff, 0xff, b'a', b'b']).unwrap_err();
        assert_eq!(err, DecodeError::Truncated { offset: 0 });
        // A map claiming more entries than there are bytes.
        let err = decode(&[0x82, 0x01, 0x02, 0x03]).unwrap_err();
        assert_eq!(err, DecodeError::Truncated { offset: 4 });
    }

    #[test]
    fn rejects_ext_and_bad_markers() {
        assert_eq!(
            decode(&[0xc1]),
            Err(DecodeError::InvalidMarker {
                offset: 0,
                marker: 0xc1
            })
        );
        for m in [0xc7u8, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8] {
            assert_eq!(
                decode(&[0x91, m, 0, 0, 0, 0, 0]),
                Err(DecodeError::UnsupportedExt {
                    offset: 1,
                    marker: m
                })
            );
        }
    }

    #[test]
    fn rejects_invalid_utf8() {
        assert_eq!(
            decode(&[0x91, 0xa2, 0xff, 0xfe]),
            Err(DecodeError::InvalidUtf8 { offset: 1 })
        );
        // but the same bytes as bin are fine
        assert_eq!(
            decode(&[0xc4, 0x02, 0xff, 0xfe]).unwrap(),
            Value::Binary(vec![0xff, 0xfe])
        );
    }

    #[test]
    fn depth_limit() {
        let mut ok = vec![0x91; MAX_DEPTH];
        ok.push(0xc0);
        assert!(decode(&ok).is_ok());
        let mut deep = vec![0x91; MAX_DEPTH + 1];
        deep.push(0xc0);
        assert_eq!(
            decode(&deep),
            Err(DecodeError::TooDeep {
                offset: MAX_DEPTH as u64,
                limit: MAX_DEPTH
            })
        );
        // Very deep input does not overflow the stack.
        let deep = vec![0x81; 1_000_000];
        assert!(matches!(decode(&deep), Err(DecodeError::TooDeep { .. })));
    }

    #[test]
    fn trailing_bytes() {
        assert_eq!(
            decode(&[0x01, 0x02]),
            Err(DecodeError::TrailingBytes {
                offset: 1,
                count: 1
            })
        );
        assert_eq!(decode_prefix(&[0x01, 0x02]), Ok((Value::from(1u8), 1)));
    }

    /// `read` asks the stream for no byte after the value.
    #[test]
    fn read_stops_at_the_value() {
        struct Strict<'a> {
            data: &'a [u8],
            end: usize,
            pos: usize,
        }
        impl Read for Strict<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(self.data.len() - self.pos);
                assert!(self.pos + n <= self.end, "read past the value");
                buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
                self.pos += n;
                Ok(n)
            }
        }
        let v = str_map([
            ("k", Value::Array(vec!["x".repeat(300).into(), Value::Nil])),
            ("b", Value::Binary(vec![7; 70_000])),
        ]);
        let mut data = encode(&v);
        let end = data.len();
        data.extend_from_slice(&[0xc1; 64]);
        let rd = Strict {
            data: &data,
            end,
            pos: 0,
        };
        assert_eq!(read(rd).unwrap(), (v, end as u64));
    }

    #[test]
    fn never_panics_on_noise() {
        // Deterministic pseudo-random inputs, plus every 1- and 2-byte input.
        for a in 0..=255u8 {
            let _ = decode(&[a]);
            for b in 0..=255u8 {
                let _ = decode(&[a, b]);
            }
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let len = (x % 40) as usize;
            let mut buf = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf.push(x as u8);
            }
            if let Ok(v) = decode(&buf) {
                // Whatever decodes re-decodes from its own encoding (compared
                // as bytes: NaN != NaN).
                let e = encode(&v);
                assert_eq!(encode(&decode(&e).unwrap()), e);
            }
        }
    }
}
