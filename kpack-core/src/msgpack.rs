//! The MessagePack subset used by kpack: archive TOCs (§3) and HIPK metadata
//! (§2.2).
//!
//! - [`Value`] is a small owned document model; maps keep their entries in
//!   order, so a decoded map re-encodes to the same bytes.
//! - [`decode`] / [`decode_prefix`] parse untrusted bytes and never panic:
//!   every length is checked against the bytes that remain before anything is
//!   allocated, and nesting is limited to [`MAX_DEPTH`] levels.
//! - [`encode`] writes exactly what Python's
//!   `msgpack.packb(obj, use_bin_type=True)` writes for the same object: the
//!   smallest integer, string, binary, array and map forms, strings as `str`,
//!   byte strings as `bin`, map entries in insertion order, floats as
//!   float64 (or float32 for [`Value::F32`]).
//!
//! Extension types (`fixext*`, `ext*`) and the never-used marker `0xc1` are
//! rejected with an error.

use std::fmt;

/// Maximum nesting depth of arrays and maps accepted by the decoder.
pub const MAX_DEPTH: usize = 64;

/// A MessagePack value.
///
/// Integers: the decoder returns [`Value::UInt`] for every non-negative
/// integer and [`Value::Int`] for every negative one; the `From` conversions
/// follow the same rule. The encoder accepts either variant for any value and
/// always picks the smallest encoding, so `Int(5)` and `UInt(5)` encode alike.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Nil,
    Bool(bool),
    /// A signed integer (negative, when produced by the decoder).
    Int(i64),
    /// A non-negative integer.
    UInt(u64),
    F32(f32),
    F64(f64),
    /// A `str`: always valid UTF-8.
    Str(String),
    /// A `bin`.
    Bin(Vec<u8>),
    Array(Vec<Value>),
    /// A map, entries in the order they were written.
    Map(Vec<(Value, Value)>),
}

impl Value {
    /// The kind of value, for error messages ("int", "str", "map", ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::UInt(_) => "int",
            Value::F32(_) | Value::F64(_) => "float",
            Value::Str(_) => "str",
            Value::Bin(_) => "bin",
            Value::Array(_) => "array",
            Value::Map(_) => "map",
        }
    }

    /// The string, if this is a `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer as `u64`, if this is an integer in `u64` range.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::UInt(u) => Some(u),
            Value::Int(i) => u64::try_from(i).ok(),
            _ => None,
        }
    }

    /// The integer as `i64`, if this is an integer in `i64` range.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Int(i) => Some(i),
            Value::UInt(u) => i64::try_from(u).ok(),
            _ => None,
        }
    }

    /// Whether this is an integer (of any range).
    pub fn is_int(&self) -> bool {
        matches!(self, Value::Int(_) | Value::UInt(_))
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The entries, if this is a map.
    pub fn as_map(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    /// The value of the first entry whose key is the string `key`, if this is
    /// a map. `None` for a non-map or a missing key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// A map with string keys, in the given order.
    pub fn str_map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Value::Str(k.into()), v))
                .collect(),
        )
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}
impl From<u64> for Value {
    fn from(u: u64) -> Self {
        Value::UInt(u)
    }
}
impl From<u32> for Value {
    fn from(u: u32) -> Self {
        Value::UInt(u.into())
    }
}
impl From<usize> for Value {
    fn from(u: usize) -> Self {
        // usize is at most 64 bits on every supported platform.
        Value::UInt(u as u64)
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Self {
        match u64::try_from(i) {
            Ok(u) => Value::UInt(u),
            Err(_) => Value::Int(i),
        }
    }
}
impl From<i32> for Value {
    fn from(i: i32) -> Self {
        Value::from(i64::from(i))
    }
}
impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::F64(f)
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}
impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}
impl From<Vec<u8>> for Value {
    fn from(b: Vec<u8>) -> Self {
        Value::Bin(b)
    }
}
impl From<Vec<Value>> for Value {
    fn from(a: Vec<Value>) -> Self {
        Value::Array(a)
    }
}

impl fmt::Display for Value {
    /// A compact, Python-like rendering (for listings and messages).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Nil => f.write_str("nil"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::UInt(u) => write!(f, "{u}"),
            Value::F32(x) => write!(f, "{x}"),
            Value::F64(x) => write!(f, "{x}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Bin(b) => {
                f.write_str("b\"")?;
                for byte in b {
                    write!(f, "\\x{byte:02x}")?;
                }
                f.write_str("\"")
            }
            Value::Array(a) => {
                f.write_str("[")?;
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Value::Map(m) => {
                f.write_str("{")?;
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}: {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

/// Why bytes are not a (supported) MessagePack value. `offset` is the byte
/// offset, within the decoded slice, of the item at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("MessagePack data ends early at byte {offset}: {needed} more bytes needed")]
    Truncated { offset: usize, needed: u64 },
    #[error("byte 0x{marker:02x} at byte {offset} is not a MessagePack type marker")]
    InvalidMarker { offset: usize, marker: u8 },
    #[error(
        "MessagePack extension type (marker 0x{marker:02x}) at byte {offset} is not supported"
    )]
    UnsupportedExt { offset: usize, marker: u8 },
    #[error("MessagePack string at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { offset: usize },
    #[error("MessagePack nesting deeper than {limit} levels at byte {offset}")]
    TooDeep { offset: usize, limit: usize },
    #[error("{count} unexpected bytes after the MessagePack value, at byte {offset}")]
    TrailingBytes { offset: usize, count: usize },
}

/// Decode one value that must span all of `bytes`.
pub fn decode(bytes: &[u8]) -> Result<Value, DecodeError> {
    let (value, used) = decode_prefix(bytes)?;
    if used != bytes.len() {
        return Err(DecodeError::TrailingBytes {
            offset: used,
            count: bytes.len() - used,
        });
    }
    Ok(value)
}

/// Decode the value at the start of `bytes`; returns it and the number of
/// bytes it used. Bytes after it are ignored.
pub fn decode_prefix(bytes: &[u8]) -> Result<(Value, usize), DecodeError> {
    let mut d = Decoder { bytes, pos: 0 };
    let value = d.value(0)?;
    Ok((value, d.pos))
}

struct Decoder<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Take `n` bytes, or fail with `Truncated` reporting `at`.
    fn take(&mut self, n: u64, at: usize) -> Result<&'a [u8], DecodeError> {
        let rem = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= rem => {
                let s = &self.bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(s)
            }
            _ => Err(DecodeError::Truncated {
                offset: at,
                needed: n - rem as u64,
            }),
        }
    }

    fn array<const N: usize>(&mut self, at: usize) -> Result<[u8; N], DecodeError> {
        let s = self.take(N as u64, at)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, at: usize) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(at)?[0])
    }
    fn u16(&mut self, at: usize) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(at)?))
    }
    fn u32(&mut self, at: usize) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(at)?))
    }
    fn u64(&mut self, at: usize) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(at)?))
    }

    fn str(&mut self, len: u64, at: usize) -> Result<Value, DecodeError> {
        let s = self.take(len, at)?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(Value::Str(s.to_owned())),
            Err(_) => Err(DecodeError::InvalidUtf8 { offset: at }),
        }
    }

    fn bin(&mut self, len: u64, at: usize) -> Result<Value, DecodeError> {
        Ok(Value::Bin(self.take(len, at)?.to_vec()))
    }

    fn seq(&mut self, len: u64, at: usize, depth: usize) -> Result<Value, DecodeError> {
        if depth >= MAX_DEPTH {
            return Err(DecodeError::TooDeep {
                offset: at,
                limit: MAX_DEPTH,
            });
        }
        // Every element takes at least one byte: a count beyond the remaining
        // bytes cannot be satisfied, so don't allocate for it.
        if len > self.remaining() as u64 {
            return Err(DecodeError::Truncated {
                offset: at,
                needed: len - self.remaining() as u64,
            });
        }
        let mut items = Vec::with_capacity(len as usize);
        for i in 0..len {
            // Truncated: the elements not started need a byte each too, so
            // that a caller growing its window by `needed` (the C API's
            // metadata reader) gets there in few steps, not one per element.
            let v = self
                .value(depth + 1)
                .map_err(|e| more_needed(e, len - i - 1))?;
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, len: u64, at: usize, depth: usize) -> Result<Value, DecodeError> {
        if depth >= MAX_DEPTH {
            return Err(DecodeError::TooDeep {
                offset: at,
                limit: MAX_DEPTH,
            });
        }
        // Every entry takes at least two bytes.
        let max = self.remaining() as u64 / 2;
        if len > max {
            let needed = len.saturating_mul(2) - self.remaining() as u64;
            return Err(DecodeError::Truncated { offset: at, needed });
        }
        let mut entries = Vec::with_capacity(len as usize);
        for i in 0..len {
            // As in `seq`: entries not started need two bytes each, a value
            // not started one.
            let rest = (len - i - 1).saturating_mul(2);
            let k = self
                .value(depth + 1)
                .map_err(|e| more_needed(e, rest.saturating_add(1)))?;
            let v = self.value(depth + 1).map_err(|e| more_needed(e, rest))?;
            entries.push((k, v));
        }
        Ok(Value::Map(entries))
    }

    fn value(&mut self, depth: usize) -> Result<Value, DecodeError> {
        let at = self.pos;
        let marker = self.u8(at)?;
        Ok(match marker {
            0x00..=0x7f => Value::UInt(u64::from(marker)),
            0x80..=0x8f => return self.map(u64::from(marker & 0x0f), at, depth),
            0x90..=0x9f => return self.seq(u64::from(marker & 0x0f), at, depth),
            0xa0..=0xbf => return self.str(u64::from(marker & 0x1f), at),
            0xc0 => Value::Nil,
            0xc1 => return Err(DecodeError::InvalidMarker { offset: at, marker }),
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4 => {
                let n = self.u8(at)?;
                return self.bin(n.into(), at);
            }
            0xc5 => {
                let n = self.u16(at)?;
                return self.bin(n.into(), at);
            }
            0xc6 => {
                let n = self.u32(at)?;
                return self.bin(n.into(), at);
            }
            0xc7..=0xc9 | 0xd4..=0xd8 => {
                return Err(DecodeError::UnsupportedExt { offset: at, marker })
            }
            0xca => Value::F32(f32::from_bits(self.u32(at)?)),
            0xcb => Value::F64(f64::from_bits(self.u64(at)?)),
            0xcc => Value::UInt(self.u8(at)?.into()),
            0xcd => Value::UInt(self.u16(at)?.into()),
            0xce => Value::UInt(self.u32(at)?.into()),
            0xcf => Value::UInt(self.u64(at)?),
            0xd0 => Value::from(i64::from(self.u8(at)? as i8)),
            0xd1 => Value::from(i64::from(self.u16(at)? as i16)),
            0xd2 => Value::from(i64::from(self.u32(at)? as i32)),
            0xd3 => Value::from(self.u64(at)? as i64),
            0xd9 => {
                let n = self.u8(at)?;
                return self.str(n.into(), at);
            }
            0xda => {
                let n = self.u16(at)?;
                return self.str(n.into(), at);
            }
            0xdb => {
                let n = self.u32(at)?;
                return self.str(n.into(), at);
            }
            0xdc => {
                let n = self.u16(at)?;
                return self.seq(n.into(), at, depth);
            }
            0xdd => {
                let n = self.u32(at)?;
                return self.seq(n.into(), at, depth);
            }
            0xde => {
                let n = self.u16(at)?;
                return self.map(n.into(), at, depth);
            }
            0xdf => {
                let n = self.u32(at)?;
                return self.map(n.into(), at, depth);
            }
            0xe0..=0xff => Value::Int(i64::from(marker as i8)),
        })
    }
}

/// A `Truncated` error needing `more` bytes beyond what it already says.
fn more_needed(e: DecodeError, more: u64) -> DecodeError {
    match e {
        DecodeError::Truncated { offset, needed } => DecodeError::Truncated {
            offset,
            needed: needed.saturating_add(more),
        },
        e => e,
    }
}

/// Encode `value` as Python's `msgpack.packb(value, use_bin_type=True)` does.
///
/// Strings, binaries, arrays and maps longer than `u32::MAX` (which
/// MessagePack cannot represent) are a programming error and panic.
pub fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(value, &mut out);
    out
}

/// Append the encoding of `value` to `out` (see [`encode`]).
pub fn encode_into(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Nil => out.push(0xc0),
        Value::Bool(false) => out.push(0xc2),
        Value::Bool(true) => out.push(0xc3),
        Value::UInt(u) => encode_uint(*u, out),
        Value::Int(i) => match u64::try_from(*i) {
            Ok(u) => encode_uint(u, out),
            Err(_) => encode_negative(*i, out),
        },
        Value::F32(x) => {
            out.push(0xca);
            out.extend_from_slice(&x.to_bits().to_be_bytes());
        }
        Value::F64(x) => {
            out.push(0xcb);
            out.extend_from_slice(&x.to_bits().to_be_bytes());
        }
        Value::Str(s) => {
            let n = s.len();
            if n < 32 {
                out.push(0xa0 | n as u8);
            } else {
                encode_len(n, [0xd9, 0xda, 0xdb], out);
            }
            out.extend_from_slice(s.as_bytes());
        }
        Value::Bin(b) => {
            encode_len(b.len(), [0xc4, 0xc5, 0xc6], out);
            out.extend_from_slice(b);
        }
        Value::Array(a) => {
            if a.len() < 16 {
                out.push(0x90 | a.len() as u8);
            } else {
                encode_len16(a.len(), [0xdc, 0xdd], out);
            }
            for v in a {
                encode_into(v, out);
            }
        }
        Value::Map(m) => {
            if m.len() < 16 {
                out.push(0x80 | m.len() as u8);
            } else {
                encode_len16(m.len(), [0xde, 0xdf], out);
            }
            for (k, v) in m {
                encode_into(k, out);
                encode_into(v, out);
            }
        }
    }
}

fn encode_uint(u: u64, out: &mut Vec<u8>) {
    if u < 0x80 {
        out.push(u as u8);
    } else if let Ok(b) = u8::try_from(u) {
        out.extend_from_slice(&[0xcc, b]);
    } else if let Ok(h) = u16::try_from(u) {
        out.push(0xcd);
        out.extend_from_slice(&h.to_be_bytes());
    } else if let Ok(w) = u32::try_from(u) {
        out.push(0xce);
        out.extend_from_slice(&w.to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&u.to_be_bytes());
    }
}

fn encode_negative(i: i64, out: &mut Vec<u8>) {
    if i >= -32 {
        out.push(i as u8);
    } else if let Ok(b) = i8::try_from(i) {
        out.extend_from_slice(&[0xd0, b as u8]);
    } else if let Ok(h) = i16::try_from(i) {
        out.push(0xd1);
        out.extend_from_slice(&h.to_be_bytes());
    } else if let Ok(w) = i32::try_from(i) {
        out.push(0xd2);
        out.extend_from_slice(&w.to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&i.to_be_bytes());
    }
}

/// 8/16/32-bit length prefix (str8.. or bin8..).
fn encode_len(n: usize, markers: [u8; 3], out: &mut Vec<u8>) {
    if let Ok(b) = u8::try_from(n) {
        out.extend_from_slice(&[markers[0], b]);
    } else {
        encode_len16(n, [markers[1], markers[2]], out);
    }
}

/// 16/32-bit length prefix.
fn encode_len16(n: usize, markers: [u8; 2], out: &mut Vec<u8>) {
    if let Ok(h) = u16::try_from(n) {
        out.push(markers[0]);
        out.extend_from_slice(&h.to_be_bytes());
    } else {
        let w = u32::try_from(n).expect("MessagePack cannot represent lengths above u32::MAX");
        out.push(markers[1]);
        out.extend_from_slice(&w.to_be_bytes());
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
            // Either integer variant encodes alike.
            (Value::Int(300), "cd012c"),
            (Value::UInt(300), "cd012c"),
        ];
        for (v, want) in cases {
            let got = encode(v);
            assert_eq!(hex(&got), *want, "{v:?}");
            // And back: non-negative decode as UInt, negative as Int.
            let back = decode(&got).unwrap();
            assert_eq!(
                back.as_i64()
                    .map(i128::from)
                    .or(back.as_u64().map(i128::from)),
                v.as_i64().map(i128::from).or(v.as_u64().map(i128::from))
            );
            assert!(matches!(back, Value::UInt(_)) == v.as_u64().is_some());
        }
    }

    #[test]
    fn scalars_match_python() {
        let cases: &[(Value, &str)] = &[
            (Value::Nil, "c0"),
            (Value::Bool(true), "c3"),
            (Value::Bool(false), "c2"),
            (Value::F64(1.5), "cb3ff8000000000000"),
            (Value::F64(3.25), "cb400a000000000000"),
            (Value::from(""), "a0"),
            (Value::Bin(vec![]), "c400"),
            (Value::Array(vec![]), "90"),
            (Value::Map(vec![]), "80"),
        ];
        for (v, want) in cases {
            let got = encode(v);
            assert_eq!(hex(&got), *want, "{v:?}");
            assert_eq!(&decode(&got).unwrap(), v);
        }
        assert_eq!(decode(&unhex("ca3fc00000")).unwrap(), Value::F32(1.5));
        assert_eq!(encode(&Value::F32(1.5)), unhex("ca3fc00000"));
    }

    /// (value, total length, first bytes) from Python.
    #[test]
    fn lengths_match_python() {
        let s = |n: usize| Value::Str("a".repeat(n));
        let b = |n: usize| Value::Bin(vec![b'x'; n]);
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
            assert_eq!(got.len(), *len, "{}", v.type_name());
            assert!(
                hex(&got).starts_with(prefix),
                "{} {}",
                v.type_name(),
                hex(&got[..8])
            );
            assert_eq!(&decode(&got).unwrap(), v);
        }
    }

    #[test]
    fn maps_keep_order_and_match_python() {
        // {str(i): i for i in range(15)} / range(16)
        let m = |n: usize| Value::str_map((0..n).map(|i| (i.to_string(), Value::from(i))));
        let e15 = encode(&m(15));
        assert_eq!(e15.len(), 51);
        assert!(hex(&e15).starts_with("8fa13000a13101a13202a133"));
        let e16 = encode(&m(16));
        assert_eq!(e16.len(), 57);
        assert!(hex(&e16).starts_with("de0010a13000a13101a13202"));
        assert_eq!(decode(&e16).unwrap(), m(16));

        let hipk = Value::str_map([
            (
                "kpack_search_paths",
                Value::Array(vec!["../.kpack/blas_@GFXARCH@.kpack".into()]),
            ),
            ("kernel_name", "lib/librocblas.so".into()),
        ]);
        assert_eq!(
            hex(&encode(&hipk)),
            "82b26b7061636b5f7365617263685f706174687391be2e2e2f2e6b7061636b2f626c61735f40474658\
             41524348402e6b7061636bab6b65726e656c5f6e616d65b16c69622f6c6962726f63626c61732e736f"
        );
        assert_eq!(
            hipk.get("kernel_name").and_then(Value::as_str),
            Some("lib/librocblas.so")
        );
        assert_eq!(hipk.get("nope"), None);
    }

    #[test]
    fn truncated_inputs_fail_cleanly() {
        let full = encode(&Value::str_map([
            ("a", Value::Array(vec![Value::from(70000u64), "xyz".into()])),
            ("b", Value::Bin(vec![1, 2, 3])),
            ("c", Value::F64(2.0)),
        ]));
        for cut in 0..full.len() {
            let err = decode(&full[..cut]).unwrap_err();
            assert!(matches!(err, DecodeError::Truncated { .. }), "{cut}: {err}");
        }
        assert!(decode(&full).is_ok());
    }

    #[test]
    fn huge_lengths_do_not_allocate() {
        // array32 / map32 / str32 / bin32 claiming 4 GiB with nothing after.
        for m in [0xdd, 0xdf, 0xdb, 0xc6] {
            let err = decode(&[m, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
            assert!(
                matches!(err, DecodeError::Truncated { offset: 0, .. }),
                "{err}"
            );
        }
        // A map claiming more entries than half the remaining bytes.
        let err = decode(&[0x82, 0x01, 0x02, 0x03]).unwrap_err();
        assert_eq!(
            err,
            DecodeError::Truncated {
                offset: 0,
                needed: 1
            }
        );
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
            Value::Bin(vec![0xff, 0xfe])
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
                offset: MAX_DEPTH,
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
        assert_eq!(decode_prefix(&[0x01, 0x02]), Ok((Value::UInt(1), 1)));
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

    #[test]
    fn display() {
        let v = Value::str_map([
            (
                "a",
                Value::Array(vec![Value::from(1i64), Value::from(-2i64), Value::Nil]),
            ),
            ("b", Value::Bin(vec![0xab])),
        ]);
        assert_eq!(v.to_string(), r#"{"a": [1, -2, nil], "b": b"\xab"}"#);
    }
}
