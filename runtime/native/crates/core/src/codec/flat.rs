//! The common case of JSON tensor data read without serde: a flat list of plain numbers
//! for a numeric tensor, every one in its datatype's range, as many as the shape holds.
//!
//! The text is a `RawValue`'s, so it is JSON already (the body's first pass checked it):
//! this scans `[`, numbers between commas and JSON whitespace, `]`. A float number is read
//! whole by `fast-float2` (which takes every JSON number, correctly rounded as serde_json's
//! `float_roundtrip` parser rounds it) to an f64, then narrowed as [`data`]'s reader
//! narrows it; an integer number is read by hand. Anything else is not read here: a nested
//! list, a value that is not a number, a length other than the count, a float out of its
//! datatype's range (or out of f64's, which serde_json refuses), an integer out of its
//! datatype's bounds (or past u64's, or `-0`, which serde_json reads as floats), a float
//! number in an integer tensor, a BOOL or BYTES tensor. For those [`read`] answers None
//! and the strict reader ([`data`]) reads the data as ever, with its errors in its order;
//! so what is answered is always what that reader answers, bit for bit.
//!
//! [`data`]: crate::codec::data

use crate::tensor::DataType;

/// The scan of an integer tensor whose elements are `$int`: each number read as an
/// integer, then kept only within `$int`'s bounds.
macro_rules! integers {
    ($text:expr, $count:expr, $int:ty) => {
        scan($text, $count, |text| {
            let (value, used) = integer(text)?;
            Some((<$int>::try_from(value).ok()?.to_le_bytes(), used))
        })
    };
}

/// `text` (a JSON value) as `count` elements of `datatype`, little-endian, when it is a
/// flat list of plain numbers that the strict reader would take as they are; None for
/// anything else, which the strict reader then reads.
pub fn read(text: &str, datatype: DataType, count: usize) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    match datatype {
        DataType::F16 => scan(text, count, |text| {
            let (value, used) = float(text)?;
            let value = half::f16::from_f64(value);
            value.is_finite().then(|| (value.to_le_bytes(), used))
        }),
        DataType::F32 => scan(text, count, |text| {
            let (value, used) = float(text)?;
            let value = value as f32;
            value.is_finite().then(|| (value.to_le_bytes(), used))
        }),
        DataType::F64 => scan(text, count, |text| {
            float(text).map(|(value, used)| (value.to_le_bytes(), used))
        }),
        DataType::U8 => integers!(text, count, u8),
        DataType::U16 => integers!(text, count, u16),
        DataType::U32 => integers!(text, count, u32),
        DataType::U64 => integers!(text, count, u64),
        DataType::I8 => integers!(text, count, i8),
        DataType::I16 => integers!(text, count, i16),
        DataType::I32 => integers!(text, count, i32),
        DataType::I64 => integers!(text, count, i64),
        DataType::Bool | DataType::Bytes => None,
    }
}

/// The list's numbers, each converted by `element` from the text where it starts to its
/// bytes and its length there (None: not read here), when the list is flat and holds
/// exactly `count` of them.
#[inline(always)]
fn scan<const N: usize>(
    text: &[u8],
    count: usize,
    element: impl Fn(&[u8]) -> Option<([u8; N], usize)>,
) -> Option<Vec<u8>> {
    let mut at = whitespace(text, 0);
    if text.get(at) != Some(&b'[') {
        return None;
    }
    at = whitespace(text, at + 1);
    // What is reserved is bounded by the text, whatever the count (as the strict reader's).
    let mut raw = Vec::with_capacity(count.min(text.len() / 2 + 1) * N);
    let mut length = 0;
    if text.get(at) == Some(&b']') {
        at += 1;
    } else {
        loop {
            // A number starts with a sign or a digit (not a list, null, true, false, a
            // string or an object).
            if length == count || !matches!(text.get(at), Some(b'-' | b'0'..=b'9')) {
                return None;
            }
            let (bytes, used) = element(&text[at..])?;
            raw.extend_from_slice(&bytes);
            length += 1;
            at = whitespace(text, at + used);
            match text.get(at) {
                Some(b',') => at = whitespace(text, at + 1),
                Some(b']') => {
                    at += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    (length == count && whitespace(text, at) == text.len()).then_some(raw)
}

#[inline(always)]
fn whitespace(text: &[u8], mut at: usize) -> usize {
    while matches!(text.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// The float number that `text` starts with, correctly rounded, and its length; None past
/// f64's range (which serde_json refuses as out of range). The number is JSON's (the text
/// is a `RawValue`'s), which `fast-float2` reads whole: what it takes besides (`inf`, `nan`)
/// reads as infinite or NaN, which is left to the strict reader too.
#[inline(always)]
fn float(text: &[u8]) -> Option<(f64, usize)> {
    let (value, used) = fast_float2::parse_partial::<f64, _>(text).ok()?;
    value.is_finite().then_some((value, used))
}

/// The integer number that `text` starts with and its length, when serde_json reads it as
/// an integer (I64 or U64): not a fraction or exponent, not `-0`, not past u64 nor below
/// i64's least.
#[inline(always)]
fn integer(text: &[u8]) -> Option<(i128, usize)> {
    let negative = text.first() == Some(&b'-');
    let digits = &text[usize::from(negative)..];
    let mut magnitude: u64 = 0;
    let mut length = 0;
    for &byte in digits {
        if !byte.is_ascii_digit() {
            break;
        }
        magnitude = magnitude
            .checked_mul(10)?
            .checked_add(u64::from(byte - b'0'))?;
        length += 1;
    }
    // No digit, or a leading zero before others (neither is JSON), or a float.
    if length == 0
        || (digits[0] == b'0' && length > 1)
        || matches!(digits.get(length), Some(b'.' | b'e' | b'E'))
    {
        return None;
    }
    let used = length + usize::from(negative);
    if !negative {
        return Some((magnitude.into(), used));
    }
    let value = -i128::from(magnitude);
    (magnitude != 0 && value >= i128::from(i64::MIN)).then_some((value, used))
}

#[cfg(test)]
mod bench;
#[cfg(test)]
mod tests;
