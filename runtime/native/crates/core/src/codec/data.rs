//! JSON tensor data read strictly, straight into a tensor's little-endian bytes (or BYTES
//! elements), in one pass that builds no JSON values.
//!
//! A numeric tensor takes numbers only, an integer tensor integers in its range only, a
//! BOOL tensor booleans only, a BYTES tensor strings only: `null`, `"1.5"`, `true` and
//! `1.7` in the wrong tensor are a 400 naming the first offending value, never coerced.
//! The data may be flat (row-major) or nested to match the shape: nested when the shape
//! has two axes or more and the first element is a list. The errors come in a fixed order,
//! most fundamental first: the rows (or the flat length), then each depth's lists,
//! then the values' kinds, then their ranges; so the one pass records the first error of
//! each class and stops converting, and the most fundamental one is answered.

use bytes::Bytes;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::codec::{flat, repr};
use crate::error::ApiError;
use crate::tensor::{DataType, TensorData};

/// `data` (flat or nested, already known to be a JSON list) as `count` elements of
/// `datatype` in `shape` (`count`: the shape's element count, or `usize::MAX` when that is
/// past `usize`, which no data matches); `what` names the tensor in the error.
///
/// The common case, a flat list of plain numbers that all fit, is read without serde
/// ([`flat`]); anything else by the strict reader ([`read_strictly`]), which answers the
/// same for that case, bit for bit.
pub fn read(
    data: &RawValue,
    datatype: DataType,
    shape: &[usize],
    count: usize,
    what: &str,
) -> Result<TensorData, ApiError> {
    match flat::read(data.get(), datatype, count) {
        Some(raw) => Ok(TensorData::Raw(Bytes::from(raw))),
        None => read_strictly(data, datatype, shape, count, what),
    }
}

/// [`read`] by the strict one-pass reader, whatever the data: every error it answers is
/// this reader's.
pub(crate) fn read_strictly(
    data: &RawValue,
    datatype: DataType,
    shape: &[usize],
    count: usize,
    what: &str,
) -> Result<TensorData, ApiError> {
    // A JSON value takes two bytes at least ("1,"): what is reserved is bounded by the
    // body, whatever the shape declares.
    let room = count.min(data.get().len() / 2 + 1);
    let sink = match datatype.item_size() {
        Some(size) => Sink::Raw(Vec::with_capacity(room * size)),
        None => Sink::Strings(Vec::with_capacity(room)),
    };
    let mut reader = Reader {
        datatype,
        shape,
        count,
        what,
        nested: None,
        leaves: 0,
        sink,
        errors: Errors::default(),
    };
    let mut deserializer = serde_json::Deserializer::from_str(data.get());
    Top(&mut reader)
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end())
        // The body was validated as a whole already: what is left is an escape its first
        // pass did not decode (a lone surrogate), which orjson refuses as malformed JSON.
        .map_err(|error| ApiError::invalid(format!("malformed JSON request: {what}: {error}")))?;
    reader.finish()
}

enum Sink {
    Raw(Vec<u8>),
    Strings(Vec<Bytes>),
}

/// The first error of each class, most fundamental first.
#[derive(Default)]
struct Errors {
    /// The shallowest depth whose lists do not match the shape (0: the rows, or the flat
    /// length), with its message.
    structure: Option<(usize, String)>,
    kind: Option<String>,
    range: Option<String>,
    /// A float out of FP16's or FP32's range (read as infinite).
    out_of_range: bool,
}

impl Errors {
    fn any(&self) -> bool {
        self.structure.is_some() || self.kind.is_some() || self.range.is_some() || self.out_of_range
    }
}

struct Reader<'s> {
    datatype: DataType,
    shape: &'s [usize],
    count: usize,
    what: &'s str,
    /// Decided by the first element: None until then (and for empty data: flat).
    nested: Option<bool>,
    leaves: usize,
    sink: Sink,
    errors: Errors,
}

/// One scalar (or a list or object where a scalar belongs) at the leaf level.
enum Leaf<'a> {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(&'a str),
    String(String),
    Other(Value),
}

impl Reader<'_> {
    fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Whether an item at `depth` (1: the top list's items) must be a list of the shape.
    fn container(&self, depth: usize) -> bool {
        self.nested == Some(true) && depth < self.rank()
    }

    /// Decides flat or nested at the first element of the top list.
    fn decide(&mut self, depth: usize, is_list: bool) {
        if depth == 1 && self.nested.is_none() {
            self.nested = Some(is_list && self.rank() >= 2);
        }
    }

    fn structure(&mut self, depth: usize, message: impl FnOnce() -> String) {
        if self
            .errors
            .structure
            .as_ref()
            .is_none_or(|(d, _)| depth < *d)
        {
            self.errors.structure = Some((depth, message()));
        }
    }

    fn depth_mismatch(&mut self, depth: usize) {
        let (shape, dim) = (self.shape, self.shape[depth]);
        let what = self.what;
        self.structure(depth, || {
            format!(
                "{what}: nested data does not match shape {} at depth {depth} (every item \
                 there must be a list of {dim})",
                repr::shape(shape)
            )
        });
    }

    fn top_length(&mut self, length: usize) {
        let (shape, what, count) = (self.shape, self.what, self.count);
        if self.nested == Some(true) {
            if length != shape[0] {
                self.structure(0, || {
                    format!(
                        "{what}: nested data has {length} rows, shape {} needs {}",
                        repr::shape(shape),
                        shape[0]
                    )
                });
            }
        } else if length != count {
            self.structure(0, || {
                format!(
                    "{what}: data has {length} elements, shape {} needs {}",
                    repr::shape(shape),
                    // Exact even when the count is past usize (then `count` is usize::MAX).
                    repr::product(shape, 1)
                )
            });
        }
    }

    fn leaf(&mut self, leaf: Leaf<'_>) {
        let writing = self.leaves < self.count && !self.errors.any();
        self.leaves += 1;
        if self.errors.kind.is_some() && !writing {
            return;
        }
        match self.datatype {
            DataType::Bytes => self.string_leaf(leaf, writing),
            DataType::Bool => match leaf {
                Leaf::Bool(b) if writing => self.push(&[b as u8]),
                Leaf::Bool(_) => {}
                other => self.kind_error(other),
            },
            DataType::F16 | DataType::F32 | DataType::F64 => match leaf {
                Leaf::I64(i) => self.float(i as f64, writing),
                Leaf::U64(u) => self.float(u as f64, writing),
                Leaf::F64(f) => self.float(f, writing),
                other => self.kind_error(other),
            },
            _ => match leaf {
                Leaf::I64(i) => self.integer(i as i128, writing),
                Leaf::U64(u) => self.integer(u as i128, writing),
                other => self.kind_error(other),
            },
        }
    }

    fn string_leaf(&mut self, leaf: Leaf<'_>, writing: bool) {
        let element = match leaf {
            Leaf::Str(s) => Bytes::copy_from_slice(s.as_bytes()),
            Leaf::String(s) => Bytes::from(s.into_bytes()),
            other => return self.kind_error(other),
        };
        if let (true, Sink::Strings(elements)) = (writing, &mut self.sink) {
            elements.push(element);
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if let Sink::Raw(raw) = &mut self.sink {
            raw.extend_from_slice(bytes);
        }
    }

    fn float(&mut self, value: f64, writing: bool) {
        let (bytes, finite): ([u8; 8], bool) = match self.datatype {
            DataType::F16 => widen(half::f16::from_f64(value).to_le_bytes(), |b| {
                half::f16::from_le_bytes([b[0], b[1]]).is_finite()
            }),
            DataType::F32 => widen((value as f32).to_le_bytes(), |b| {
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()
            }),
            _ => (value.to_le_bytes(), true),
        };
        if !finite {
            self.errors.out_of_range = true;
        } else if writing {
            let size = self.datatype.item_size().expect("a float has a size");
            self.push(&bytes[..size]);
        }
    }

    fn integer(&mut self, value: i128, writing: bool) {
        let (low, high, numpy) = integer_range(self.datatype);
        if !(low..=high).contains(&value) {
            if self.errors.range.is_none() {
                // Worded as numpy 2's OverflowError (the words Python clients know).
                self.errors.range = Some(format!(
                    "{}: data is not a valid {} tensor: Python integer {value} out of bounds \
                     for {numpy}",
                    self.what,
                    self.datatype.name()
                ));
            }
        } else if writing {
            let size = self.datatype.item_size().expect("an integer has a size");
            // Two's complement little-endian: the low bytes are the value in any width.
            self.push(&value.to_le_bytes()[..size]);
        }
    }

    fn kind_error(&mut self, leaf: Leaf<'_>) {
        if self.errors.kind.is_some() {
            return;
        }
        let value = match leaf {
            Leaf::Null => Value::Null,
            Leaf::Bool(b) => Value::Bool(b),
            Leaf::I64(i) => Value::from(i),
            Leaf::U64(u) => Value::from(u),
            Leaf::F64(f) => Value::from(f),
            Leaf::Str(s) => Value::from(s),
            Leaf::String(s) => Value::from(s),
            Leaf::Other(v) => v,
        };
        let (what, name) = (self.what, self.datatype.name());
        self.errors.kind = Some(match self.datatype {
            DataType::Bytes => {
                format!(
                    "{what}: {name} data takes strings only; it holds {}",
                    repr::shown(&value)
                )
            }
            datatype => format!(
                "{what}: {name} data takes {} only; it holds {} ({})",
                takes(datatype),
                repr::kind(&value),
                repr::shown(&value)
            ),
        });
    }

    fn finish(self) -> Result<TensorData, ApiError> {
        let errors = self.errors;
        if let Some(message) = errors
            .structure
            .map(|(_, m)| m)
            .or(errors.kind)
            .or(errors.range)
        {
            return Err(ApiError::invalid(message));
        }
        if errors.out_of_range {
            return Err(ApiError::invalid(format!(
                "{}: data holds a value out of {}'s range",
                self.what,
                self.datatype.name()
            )));
        }
        Ok(match self.sink {
            Sink::Raw(raw) => TensorData::Raw(Bytes::from(raw)),
            Sink::Strings(elements) => TensorData::Strings(elements),
        })
    }
}

fn widen<const N: usize>(bytes: [u8; N], finite: impl Fn(&[u8]) -> bool) -> ([u8; 8], bool) {
    let mut wide = [0; 8];
    wide[..N].copy_from_slice(&bytes);
    (wide, finite(&bytes))
}

fn takes(datatype: DataType) -> &'static str {
    match datatype {
        DataType::Bool => "booleans",
        DataType::F16 | DataType::F32 | DataType::F64 => "numbers",
        _ => "integers",
    }
}

/// An integer datatype's bounds and numpy's name for it (which the range error names).
pub(super) fn integer_range(datatype: DataType) -> (i128, i128, &'static str) {
    match datatype {
        DataType::U8 => (0, u8::MAX.into(), "uint8"),
        DataType::U16 => (0, u16::MAX.into(), "uint16"),
        DataType::U32 => (0, u32::MAX.into(), "uint32"),
        DataType::U64 => (0, u64::MAX.into(), "uint64"),
        DataType::I8 => (i8::MIN.into(), i8::MAX.into(), "int8"),
        DataType::I16 => (i16::MIN.into(), i16::MAX.into(), "int16"),
        DataType::I32 => (i32::MIN.into(), i32::MAX.into(), "int32"),
        _ => (i64::MIN.into(), i64::MAX.into(), "int64"),
    }
}

/// The top list (the caller checked it is one).
struct Top<'r, 's>(&'r mut Reader<'s>);

impl<'de> DeserializeSeed<'de> for Top<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Top<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut length = 0;
        while seq
            .next_element_seed(Node {
                reader: &mut *self.0,
                depth: 1,
            })?
            .is_some()
        {
            length += 1;
        }
        self.0.top_length(length);
        Ok(())
    }
}

/// An item at `depth` (1: the top list's items).
struct Node<'r, 's> {
    reader: &'r mut Reader<'s>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Node<'_, '_> {
    fn scalar(self, leaf: Leaf<'_>) {
        self.reader.decide(self.depth, false);
        if self.reader.container(self.depth) {
            self.reader.depth_mismatch(self.depth);
        } else {
            self.reader.leaf(leaf);
        }
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("tensor data")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (reader, depth) = (self.reader, self.depth);
        reader.decide(depth, true);
        if !reader.container(depth) {
            // A list where a value belongs: shown in the error, if it is the first.
            let mut items = Vec::new();
            if reader.errors.kind.is_none() {
                while let Some(item) = seq.next_element::<Value>()? {
                    items.push(item);
                }
            }
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            reader.leaf(Leaf::Other(Value::Array(items)));
            return Ok(());
        }
        let mut length = 0;
        while seq
            .next_element_seed(Node {
                reader: &mut *reader,
                depth: depth + 1,
            })?
            .is_some()
        {
            length += 1;
        }
        if length != reader.shape[depth] {
            reader.depth_mismatch(depth);
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut object = Map::new();
        if self.reader.errors.kind.is_none() && !self.reader.container(self.depth) {
            while let Some((key, value)) = map.next_entry::<String, Value>()? {
                object.insert(key, value);
            }
        }
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        self.scalar(Leaf::Other(Value::Object(object)));
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.scalar(Leaf::Null);
        Ok(())
    }

    fn visit_bool<E>(self, value: bool) -> Result<(), E> {
        self.scalar(Leaf::Bool(value));
        Ok(())
    }

    fn visit_i64<E>(self, value: i64) -> Result<(), E> {
        self.scalar(Leaf::I64(value));
        Ok(())
    }

    fn visit_u64<E>(self, value: u64) -> Result<(), E> {
        self.scalar(Leaf::U64(value));
        Ok(())
    }

    fn visit_f64<E>(self, value: f64) -> Result<(), E> {
        self.scalar(Leaf::F64(value));
        Ok(())
    }

    fn visit_str<E>(self, value: &str) -> Result<(), E> {
        self.scalar(Leaf::Str(value));
        Ok(())
    }

    fn visit_string<E>(self, value: String) -> Result<(), E> {
        self.scalar(Leaf::String(value));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
