//! A request body's JSON read loosely, in the one pass that validates it: objects as their
//! fields' raw text, lists of them, and anything of another kind as "not that" rather than
//! serde's error, so that a field of the wrong kind is answered with the protocol's own
//! 400 naming the field (`inputs must be a non-empty list`). Tensor data stays raw text
//! for [`crate::codec::data`] to read straight into the tensor: nothing is built for it.
//!
//! A key given twice keeps its last value, as orjson does. A
//! key the decoder does not read is parsed and dropped: its numbers and escapes are checked
//! as orjson checks them (a raw value's are not until it is read).

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// An object's fields, each its value's raw JSON text.
pub type Fields<'a> = HashMap<String, &'a RawValue>;

/// An input's fields (those the decoder reads: [`INPUT_FIELDS`]), or None when the value is
/// not an object.
pub struct ObjectOf<'a>(pub Option<Fields<'a>>);

/// A JSON list of `T`, or None when the value is not a list.
pub struct ListOf<T>(pub Option<Vec<T>>);

/// An infer request's top level: None when it is not an object; else its fields, its
/// `inputs` (when given) read as a list of objects in the same pass.
pub struct RequestTop<'a>(pub Option<(Fields<'a>, Option<ListOf<ObjectOf<'a>>>)>);

/// The field of the top level read as a list of objects.
const INPUTS: &str = "inputs";

/// The top level's other fields the decoder reads.
pub const REQUEST_FIELDS: [&str; 3] = ["id", "parameters", "outputs"];

/// An input's fields the decoder reads.
pub const INPUT_FIELDS: [&str; 5] = ["name", "datatype", "shape", "parameters", "data"];

/// The next value: kept raw when `key` is one of `known`, else parsed and dropped.
fn keep_known<'de, A: MapAccess<'de>>(
    map: &mut A,
    fields: &mut Fields<'de>,
    key: String,
    known: &[&str],
) -> Result<(), A::Error> {
    if known.contains(&key.as_str()) {
        fields.insert(key, map.next_value()?);
    } else {
        map.next_value::<Checked>()?;
    }
    Ok(())
}

/// Visitor methods for the scalar kinds: each is "not the kind wanted".
macro_rules! scalars_are_not {
    ($not:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($not)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($not)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($not)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($not)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($not)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($not)
        }
    };
}

fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<Checked>()?.is_some() {}
    Ok(())
}

fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<Checked, Checked>()?.is_some() {}
    Ok(())
}

/// A value parsed and dropped: serde's `IgnoredAny` would only skip it (serde_json's skip
/// checks neither a number's range nor a string's escapes).
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    scalars_are_not!(Checked);

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq)?;
        Ok(Checked)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map)?;
        Ok(Checked)
    }
}

struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = ObjectOf<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    scalars_are_not!(ObjectOf(None));

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq)?;
        Ok(ObjectOf(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Fields::new();
        while let Some(key) = map.next_key::<String>()? {
            keep_known(&mut map, &mut fields, key, &INPUT_FIELDS)?;
        }
        Ok(ObjectOf(Some(fields)))
    }
}

impl<'de> Deserialize<'de> for ObjectOf<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ObjectVisitor)
    }
}

struct ListVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
    type Value = ListOf<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    scalars_are_not!(ListOf(None));

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(ListOf(Some(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map)?;
        Ok(ListOf(None))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ListOf<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ListVisitor(PhantomData))
    }
}

struct RequestVisitor;

impl<'de> Visitor<'de> for RequestVisitor {
    type Value = RequestTop<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    scalars_are_not!(RequestTop(None));

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq)?;
        Ok(RequestTop(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut fields, mut inputs) = (Fields::new(), None);
        while let Some(key) = map.next_key::<String>()? {
            if key == INPUTS {
                inputs = Some(map.next_value()?);
            } else {
                keep_known(&mut map, &mut fields, key, &REQUEST_FIELDS)?;
            }
        }
        Ok(RequestTop(Some((fields, inputs))))
    }
}

impl<'de> Deserialize<'de> for RequestTop<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RequestVisitor)
    }
}

#[cfg(test)]
mod tests;
