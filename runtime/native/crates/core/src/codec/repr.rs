//! Values as the error messages show them (Python's `repr`): clients and the Python tests
//! read `input 'x'`, `holds a string ('1.5')`, `holds a boolean (True)`, so the messages
//! keep those words.

use serde_json::Value;

/// The most characters of a value a message shows (then `...`).
const SHOWN_CHARS: usize = 40;

/// A string as Python's `repr` writes it: single quotes unless it holds one and no double
/// quote, backslash escapes for the quote, backslash and control characters.
pub fn string(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !printable(c) => out.push_str(&escaped(c)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Whether Python's `str.isprintable` holds for `c`: not a control, format, separator
/// (but the space), private-use or noncharacter code point. Unassigned code points, which
/// Python escapes too, are not known here (no Unicode tables) and are written as they are.
fn printable(c: char) -> bool {
    !matches!(c as u32,
        0..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2 | 0x1680 | 0x180e
        | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x206f | 0x3000
        | 0xd800..=0xf8ff | 0xfdd0..=0xfdef | 0xfeff | 0xfff9..=0xfffb
        | 0x110bd | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a
        | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..=0x10ffff)
        && (c as u32) & 0xfffe != 0xfffe
}

/// `c` as Python's `repr` escapes a character it does not print.
fn escaped(c: char) -> String {
    match c as u32 {
        code @ 0..=0xff => format!("\\x{code:02x}"),
        code @ 0x100..=0xffff => format!("\\u{code:04x}"),
        code => format!("\\U{code:08x}"),
    }
}

/// A float as Python's `repr` writes it: the shortest digits that read back, fixed from
/// 1e-4 up to 1e16, else in exponent form (`1e+39`, `2.5e-07`).
pub fn float(value: f64) -> String {
    if !value.is_finite() {
        return if value.is_nan() {
            "nan".into()
        } else if value > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    // `{:e}` gives the shortest round-trip digits: `-1.25e-7`.
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e}'s exponent is an integer");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        return format!("{sign}{}", fixed(&digits, exponent));
    }
    let (first, rest) = digits.split_at(1);
    let fraction = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    let exp_sign = if exponent < 0 { '-' } else { '+' };
    format!("{sign}{first}{fraction}e{exp_sign}{:02}", exponent.abs())
}

/// `digits` (d.ddd) times 10^exponent in fixed notation, with `.0` for a whole number.
fn fixed(digits: &str, exponent: i32) -> String {
    if exponent < 0 {
        let zeros = "0".repeat((-exponent - 1) as usize);
        return format!("0.{zeros}{digits}");
    }
    let point = exponent as usize + 1;
    if digits.len() <= point {
        return format!("{digits}{}.0", "0".repeat(point - digits.len()));
    }
    format!("{}.{}", &digits[..point], &digits[point..])
}

/// A JSON value as Python's `repr` of its parsed form writes it.
pub fn value(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => float(f),
            _ => n.to_string(),
        },
        Value::String(s) => string(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(self::value).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", string(k), self::value(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

/// [`value`], cut to 40 characters and `...` when longer.
pub fn shown(value: &Value) -> String {
    let text = self::value(value);
    if text.chars().count() <= SHOWN_CHARS {
        return text;
    }
    let cut: String = text.chars().take(SHOWN_CHARS).collect();
    format!("{cut}...")
}

/// What a value is, in the messages' words (`a boolean`, `a string`).
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::String(_) => "a string",
        Value::Number(n) if n.is_f64() => "a number with a fraction or an exponent",
        Value::Number(_) => "an integer",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A shape as Python writes a list of integers: `[1, 4]`.
pub fn shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// The product of `shape`'s dimensions and `factor`, exactly, in decimal: the element (or
/// byte) count a shape declares, as Python's unbounded integers print it, even past
/// `usize` (a hostile shape's count is still named right).
pub fn product(shape: &[usize], factor: usize) -> String {
    const BASE: u128 = 1_000_000_000;
    // Little-endian limbs of nine decimal digits each.
    let mut limbs: Vec<u128> = vec![1];
    for &dim in std::iter::once(&factor).chain(shape) {
        let mut carry = 0u128;
        for limb in limbs.iter_mut() {
            let value = *limb * dim as u128 + carry;
            *limb = value % BASE;
            carry = value / BASE;
        }
        while carry > 0 {
            limbs.push(carry % BASE);
            carry /= BASE;
        }
    }
    while limbs.len() > 1 && limbs.last() == Some(&0) {
        limbs.pop();
    }
    let mut text = limbs.last().expect("one limb at least").to_string();
    for limb in limbs.iter().rev().skip(1) {
        text.push_str(&format!("{limb:09}"));
    }
    text
}

#[cfg(test)]
mod tests;
