//! A `serde` deserializer over a decoded TOC [`Value`], for the TOC's
//! `#[derive(Deserialize)]` structs. It adds the reader's rules to serde's:
//!
//! - Errors are [`ArchiveError`]s naming the field, with the paths the
//!   messages have always had (`toc["lib/a.so#0"]["gfx942"].ordinal`,
//!   `blobs[2].size`, `toc (a key)`). The path is a chain of borrowed
//!   segments on the stack, turned into a string only for an error.
//! - A struct's fields are handed to its visitor in declaration order, each
//!   exactly once: the first entry of the map with that string key, or,
//!   when there is none, a missing value (`None` for an `Option`,
//!   [`ArchiveError::TocFieldMissing`] for anything else). So the first
//!   fault in declaration order is the one reported, whatever order the
//!   file has; a key given twice counts once (the first); keys a struct
//!   does not name, and keys that are not strings, are never looked at.
//! - A present nil is a nil, not `None`: an optional field is either
//!   absent or of its type.
//! - Integers are read only as integers (no floats, no strings); a
//!   negative one where an unsigned one is expected is
//!   [`ArchiveError::TocFieldValue`], as is a `u32` that does not fit.
//! - In a map with free keys, the keys a visitor reads are at `<map> (a
//!   key)` and the values at `<map>["<key>"]`; array elements at
//!   `<array>[<index>]`.
//!
//! The value was decoded by [`crate::msgpack::decode`], which bounds its
//! depth and sizes; nothing here allocates more than the value holds.

use std::fmt::{self, Write};

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Visitor};
use serde::forward_to_deserialize_any;

use crate::archive::ArchiveError;
use crate::msgpack::{self, Value};

/// Deserialize a `T` from the TOC root `toc`.
pub(super) fn from_value<'de, T: de::Deserialize<'de>>(toc: &'de Value) -> Result<T, ArchiveError> {
    T::deserialize(De {
        value: Some(toc),
        path: Path::Root,
    })
    .map_err(|e| e.at(&Path::Root))
}

/// Where a value is in the TOC.
#[derive(Clone, Copy)]
enum Path<'p> {
    Root,
    /// A field of a struct: `.name` (`name` at the root).
    Field(&'p Path<'p>, &'static str),
    /// The value of a key of a map with free keys: `["key"]`.
    Key(&'p Path<'p>, &'p Value),
    /// An array element: `[i]`.
    Index(&'p Path<'p>, usize),
    /// A key of a map with free keys: `<map> (a key)`.
    KeyOf(&'p Path<'p>),
}

impl Path<'_> {
    fn render(&self) -> String {
        let mut out = String::new();
        match self {
            Path::Root => out.push_str("(TOC root)"),
            _ => self.write(&mut out),
        }
        out
    }

    fn write(&self, out: &mut String) {
        match *self {
            Path::Root => {}
            Path::Field(parent, name) => {
                parent.write(out);
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(name);
            }
            Path::Key(parent, key) => {
                parent.write(out);
                match key.as_str() {
                    Some(k) => write!(out, "[{k:?}]"),
                    None => write!(out, "[<{}>]", msgpack::type_name(key)),
                }
                .expect("writing to a String");
            }
            Path::Index(parent, i) => {
                parent.write(out);
                write!(out, "[{i}]").expect("writing to a String");
            }
            Path::KeyOf(parent) => {
                parent.write(out);
                out.push_str(" (a key)");
            }
        }
    }
}

/// The error of a deserialization: an [`ArchiveError`], or a message from
/// serde or a `Deserialize` impl that does not know the path yet (it
/// becomes [`ArchiveError::TocFieldValue`] of the value it came from).
#[derive(Debug)]
pub(super) enum Error {
    Toc(ArchiveError),
    Custom(String),
}

impl Error {
    /// The [`ArchiveError`], giving a message the path `path`.
    fn at(self, path: &Path<'_>) -> ArchiveError {
        match self {
            Error::Toc(e) => e,
            Error::Custom(reason) => ArchiveError::TocFieldValue {
                field: path.render(),
                reason,
            },
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Toc(e) => e.fmt(f),
            Error::Custom(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error::Custom(msg.to_string())
    }
}

/// One value of the TOC, at `path`; `None` for a struct field the map
/// does not have.
struct De<'de, 'p> {
    value: Option<&'de Value>,
    path: Path<'p>,
}

impl<'de> De<'de, '_> {
    /// The value, or the error of a missing field.
    fn present(&self) -> Result<&'de Value, Error> {
        self.value.ok_or_else(|| {
            Error::Toc(ArchiveError::TocFieldMissing {
                field: self.path.render(),
            })
        })
    }

    fn wrong_type(&self, expected: &'static str, found: &Value) -> Error {
        Error::Toc(ArchiveError::TocFieldType {
            field: self.path.render(),
            expected,
            found: msgpack::type_name(found),
        })
    }

    fn invalid(&self, reason: String) -> Error {
        Error::Toc(ArchiveError::TocFieldValue {
            field: self.path.render(),
            reason,
        })
    }

    /// The value as an unsigned integer.
    fn unsigned(&self) -> Result<u64, Error> {
        match self.present()? {
            Value::Integer(i) => match i.as_u64() {
                Some(u) => Ok(u),
                None => {
                    Err(self.invalid(format!("{} is negative", i.as_i64().unwrap_or_default())))
                }
            },
            other => Err(self.wrong_type("int", other)),
        }
    }

    /// A visitor's error that has no path yet gets this one.
    fn fix<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        r.map_err(|e| Error::Toc(e.at(&self.path)))
    }
}

impl<'de> de::Deserializer<'de> for De<'de, '_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let path = &self.path;
        let r = match self.present()? {
            Value::Nil => visitor.visit_unit(),
            Value::Boolean(b) => visitor.visit_bool(*b),
            // An integer is a u64 or else a (negative) i64.
            Value::Integer(i) => match i.as_u64() {
                Some(u) => visitor.visit_u64(u),
                None => visitor.visit_i64(i.as_i64().unwrap_or_default()),
            },
            Value::F32(x) => visitor.visit_f32(*x),
            Value::F64(x) => visitor.visit_f64(*x),
            Value::String(s) => match s.as_str() {
                Some(s) => visitor.visit_borrowed_str(s),
                // The decoder accepts UTF-8 strings only.
                None => visitor.visit_borrowed_bytes(s.as_bytes()),
            },
            Value::Binary(b) => visitor.visit_borrowed_bytes(b),
            Value::Array(items) => visitor.visit_seq(Seq {
                items: items.iter().enumerate(),
                path,
            }),
            Value::Map(entries) => visitor.visit_map(Map {
                entries: entries.iter(),
                path,
            }),
            // The decoder rejects extension types.
            Value::Ext(..) => Err(de::Error::custom("extension types are not supported")),
        };
        self.fix(r)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let u = self.unsigned()?;
        self.fix(visitor.visit_u64(u))
    }

    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let u = self.unsigned()?;
        let u =
            u32::try_from(u).map_err(|_| self.invalid(format!("{u} does not fit in 32 bits")))?;
        self.fix(visitor.visit_u32(u))
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let v = self.present()?;
        match v.as_str() {
            Some(s) => self.fix(visitor.visit_borrowed_str(s)),
            None => Err(self.wrong_type("str", v)),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.present()? {
            Value::Array(items) => {
                let r = visitor.visit_seq(Seq {
                    items: items.iter().enumerate(),
                    path: &self.path,
                });
                self.fix(r)
            }
            other => Err(self.wrong_type("array", other)),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.present()? {
            Value::Map(entries) => {
                let r = visitor.visit_map(Map {
                    entries: entries.iter(),
                    path: &self.path,
                });
                self.fix(r)
            }
            other => Err(self.wrong_type("map", other)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.present()? {
            Value::Map(entries) => {
                let r = visitor.visit_map(Struct {
                    entries,
                    fields,
                    next: 0,
                    path: &self.path,
                });
                self.fix(r)
            }
            other => Err(self.wrong_type("map", other)),
        }
    }

    /// Absent is `None`; anything present, nil included, is `Some`.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            None => visitor.visit_none(),
            Some(_) => visitor.visit_some(self),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u128 f32 f64 char bytes byte_buf unit
        unit_struct newtype_struct tuple tuple_struct enum identifier
    }
}

/// A struct's map: its fields in declaration order.
struct Struct<'de, 'p> {
    entries: &'de [(Value, Value)],
    fields: &'static [&'static str],
    next: usize,
    path: &'p Path<'p>,
}

impl<'de> de::MapAccess<'de> for Struct<'de, '_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.fields.get(self.next) {
            None => Ok(None),
            Some(&name) => seed
                .deserialize(BorrowedStrDeserializer::new(name))
                .map(Some),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let name = self.fields[self.next];
        self.next += 1;
        let value = self
            .entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .map(|(_, v)| v);
        seed.deserialize(De {
            value,
            path: Path::Field(self.path, name),
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.fields.len() - self.next)
    }
}

/// A map with free keys, in file order.
struct Map<'de, 'p> {
    /// From the entry whose key was read last (its value is next).
    entries: std::slice::Iter<'de, (Value, Value)>,
    path: &'p Path<'p>,
}

impl<'de> de::MapAccess<'de> for Map<'de, '_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((k, _)) = self.entries.as_slice().first() else {
            return Ok(None);
        };
        seed.deserialize(De {
            value: Some(k),
            path: Path::KeyOf(self.path),
        })
        .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let (k, v) = self
            .entries
            .next()
            .ok_or_else(|| Error::Custom("value asked for before its key".into()))?;
        seed.deserialize(De {
            value: Some(v),
            path: Path::Key(self.path, k),
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// An array's elements.
struct Seq<'de, 'p> {
    items: std::iter::Enumerate<std::slice::Iter<'de, Value>>,
    path: &'p Path<'p>,
}

impl<'de> de::SeqAccess<'de> for Seq<'de, '_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some((i, v)) = self.items.next() else {
            return Ok(None);
        };
        seed.deserialize(De {
            value: Some(v),
            path: Path::Index(self.path, i),
        })
        .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}
