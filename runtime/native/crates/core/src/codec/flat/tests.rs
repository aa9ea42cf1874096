//! The flat path against the strict reader (called directly): bit for bit where it reads
//! the data, and the strict reader's own answer, value or error, wherever it does not.

use serde_json::value::RawValue;

use super::*;
use crate::codec::data;
use crate::error::ApiError;
use crate::tensor::TensorData;

const FLOATS: [DataType; 3] = [DataType::F16, DataType::F32, DataType::F64];
const INTEGERS: [DataType; 8] = [
    DataType::U8,
    DataType::U16,
    DataType::U32,
    DataType::U64,
    DataType::I8,
    DataType::I16,
    DataType::I32,
    DataType::I64,
];

fn value(text: &str) -> Box<RawValue> {
    serde_json::from_str(text).unwrap_or_else(|error| panic!("{text}: {error}"))
}

fn strict(text: &str, datatype: DataType, shape: &[usize]) -> Result<TensorData, ApiError> {
    let count = shape.iter().product();
    data::read_strictly(&value(text), datatype, shape, count, "input 'x'")
}

/// What the flat path reads (None: it leaves the data to the strict reader), checked: what
/// it reads is the strict reader's value bit for bit, and `data::read` answers as the
/// strict reader does, value or error, either way.
fn flat(text: &str, datatype: DataType, shape: &[usize]) -> Option<Vec<u8>> {
    let count = shape.iter().product();
    let expected = strict(text, datatype, shape);
    let fast = read(value(text).get(), datatype, count);
    if let Some(raw) = &fast {
        match &expected {
            Ok(TensorData::Raw(bytes)) => assert_eq!(
                raw.as_slice(),
                &bytes[..],
                "{} {text}: the flat path's bytes differ",
                datatype.name()
            ),
            other => panic!(
                "{} {text}: the flat path read what the strict reader answers {other:?}",
                datatype.name()
            ),
        }
    }
    let answered = data::read(&value(text), datatype, shape, count, "input 'x'");
    assert_eq!(answered, expected, "{} {text}", datatype.name());
    fast
}

fn list(tokens: &[String]) -> String {
    format!("[{}]", tokens.join(","))
}

/// Reads each token alone, then all that the flat path read in one list.
fn each_and_all(datatype: DataType, tokens: &[String]) -> usize {
    let mut read_flat = Vec::new();
    for token in tokens {
        if flat(&format!("[{token}]"), datatype, &[1]).is_some() {
            read_flat.push(token.clone());
        }
    }
    let text = list(&read_flat);
    assert!(
        flat(&text, datatype, &[read_flat.len()]).is_some(),
        "{text}"
    );
    read_flat.len()
}

/// A small deterministic generator (splitmix64): a failing case replays exactly.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn strings(tokens: &[&str]) -> Vec<String> {
    tokens.iter().map(|t| t.to_string()).collect()
}

const FLOAT_EDGES: &[&str] = &[
    "0",
    "-0",
    "0.0",
    "-0.0",
    "-0e+0000",
    "1",
    "-1",
    "0.1",
    "0.30000001192092896",
    "1.0000000596046448",
    "1.000000059604644775390625",
    "1.0000000596046447753906250000000001",
    "1e38",
    "-1e38",
    "3.4028235e38",
    "-3.4028235e38",
    "3.4028234663852886e38",
    "3.4028235677973362e38",
    "3.4028235677973366e38",
    "3.4028236e38",
    "1e39",
    "65504",
    "65519.99",
    "65520",
    "-65520",
    "6.103515625e-05",
    "5.960464477539063e-08",
    "2.9802322387695312e-08",
    "2.98023223876953125e-08",
    "1e-45",
    "1.401298464324817e-45",
    "7.006492321624086e-46",
    "7e-46",
    "1.1754943508222875e-38",
    "1.1754942e-38",
    "5e-324",
    "4.9406564584124654e-324",
    "2.4703282292062327e-324",
    "2.4703282292062328e-324",
    "2.2250738585072011e-308",
    "2.2250738585072012e-308",
    "2.2250738585072014e-308",
    "1e308",
    "1.7976931348623157e308",
    "1.7976931348623158e308",
    "1.7976931348623159e308",
    "1e309",
    "-1e309",
    "1e-400",
    "-1e-400",
    "1E5",
    "1e+5",
    "1e-5",
    "1.5E-7",
    "123456789012345678901234567890",
    "9007199254740993",
    "9007199254740993.0000000000000000000000000000001",
    "9007199254740992.9999999999999999999999999999999",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "0.1000000000000000055511151231257827021181583404541015625",
    "3.14159265358979323846264338327950288419716939937510582097494459",
    "0e99999999999999999999",
    "-0e99999999999999999999",
    "1e-99999999999999999999",
    "1e99999999999999999999",
    "1e2147483647",
    "1e-2147483648",
    "0.000000000000000000000000000000000000000000000000001e50",
];

#[test]
fn float_edges_read_as_the_strict_reader_reads_them() {
    for datatype in FLOATS {
        each_and_all(datatype, &strings(FLOAT_EDGES));
    }
    // Which of them the flat path reads, and which it leaves (out of range).
    for (token, datatype, read_flat) in [
        ("3.4028235e38", DataType::F32, true),
        ("3.4028236e38", DataType::F32, false),
        ("3.4028236e38", DataType::F64, true),
        ("-1e39", DataType::F32, false),
        ("65519.99", DataType::F16, true),
        ("65520", DataType::F16, false),
        ("1e-400", DataType::F64, true),
        ("1.7976931348623158e308", DataType::F64, true),
        ("1.7976931348623159e308", DataType::F64, false),
        ("1e99999999999999999999", DataType::F64, false),
        ("0e99999999999999999999", DataType::F64, true),
    ] {
        let text = format!("[{token}]");
        assert_eq!(
            flat(&text, datatype, &[1]).is_some(),
            read_flat,
            "{} {text}",
            datatype.name()
        );
    }
}

#[test]
fn a_negative_zero_keeps_its_sign_in_every_float_tensor() {
    assert_eq!(
        flat("[-0]", DataType::F64, &[1]),
        Some((-0f64).to_le_bytes().to_vec())
    );
    assert_eq!(
        flat("[-0.0]", DataType::F32, &[1]),
        Some((-0f32).to_le_bytes().to_vec())
    );
    let f16 = half::f16::from_f64(-0.0).to_le_bytes().to_vec();
    assert_eq!(flat("[-0e5]", DataType::F16, &[1]), Some(f16));
}

/// Random floats written as clients write them (shortest forms of f64 and f32 values,
/// fixed digits, long digit strings with random exponents): the flat path reads every one
/// the strict reader takes, bit for bit.
#[test]
fn random_floats_read_bit_for_bit() {
    let mut seeded = Seeded(0x5eed);
    let mut tokens = Vec::new();
    for _ in 0..400 {
        let bits = f64::from_bits(seeded.next());
        if bits.is_finite() {
            tokens.push(format!("{bits:?}"));
            tokens.push(format!("{bits:e}"));
            tokens.push(format!("{bits:.25e}"));
        }
        let single = f32::from_bits(seeded.next() as u32);
        if single.is_finite() {
            tokens.push(format!("{:?}", f64::from(single)));
            tokens.push(format!("{single:e}"));
        }
        let unit = (seeded.next() >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
        tokens.push(format!("{unit:?}"));
        tokens.push(format!("{:?}", unit as f32));
        let digits: String = (0..1 + seeded.below(60))
            .map(|_| char::from(b'0' + seeded.below(10) as u8))
            .collect();
        let digits = digits.trim_start_matches('0');
        let digits = if digits.is_empty() { "7" } else { digits };
        let exponent = seeded.below(700) as i64 - 350;
        tokens.push(format!("{digits}e{exponent}"));
        tokens.push(format!("-0.{digits}E{exponent:+}"));
        tokens.push(format!("{}", seeded.next()));
        tokens.push(format!("-{}", seeded.next() >> seeded.below(64)));
    }
    for datatype in FLOATS {
        let read_flat = each_and_all(datatype, &tokens);
        // F64 leaves only the out-of-range exponents; the narrower types more.
        assert!(
            read_flat > tokens.len() / 2,
            "{}: {read_flat}",
            datatype.name()
        );
    }
}

/// Numbers far longer than any float holds, a hair either side of halfway between two
/// floats: read correctly rounded, as the strict reader reads them.
#[test]
fn many_digits_round_as_the_strict_reader_rounds() {
    let mut tokens = Vec::new();
    for halfway in [
        "9007199254740993",
        "1.000000059604644775390625",
        "2.4703282292062327e-324",
        "6.103515625e-05",
        "1.00048828125",
    ] {
        let (mantissa, exponent) = halfway.split_once('e').unwrap_or((halfway, "0"));
        let dot = if mantissa.contains('.') { "" } else { "." };
        for tail in ["", "0000000000000000000001", "9999999999999999999999"] {
            let zeros = "0".repeat(800);
            tokens.push(format!("{mantissa}{dot}{zeros}{tail}e{exponent}"));
        }
    }
    tokens.push(format!("1{}", "0".repeat(308)));
    tokens.push(format!("1{}", "0".repeat(309)));
    tokens.push(format!("0.{}1", "0".repeat(330)));
    for datatype in FLOATS {
        each_and_all(datatype, &tokens);
    }
}

/// Halfway between neighbouring FP16 and FP32 values, and a hair either side (which an f64
/// holds but an f32 does not): narrowed from the f64 as the strict reader narrows it.
#[test]
fn values_near_halfway_narrow_from_the_f64_as_the_strict_reader_narrows_them() {
    let mut tokens = vec!["1.000488282181322574615478515625".to_string()];
    let mut seeded = Seeded(0x4a1f);
    for _ in 0..300 {
        let low = half::f16::from_bits(seeded.below(0x7bff) as u16);
        let high = half::f16::from_bits(low.to_bits() + 1);
        let single = f32::from_bits(seeded.below(0x7f7f_ffff) as u32);
        let next = f32::from_bits(single.to_bits() + 1);
        for middle in [
            (low.to_f64() + high.to_f64()) / 2.0,
            (f64::from(single) + f64::from(next)) / 2.0,
        ] {
            for nudge in [1.0, 1.0 + 2f64.powi(-40), 1.0 - 2f64.powi(-40)] {
                tokens.push(format!("{:?}", middle * nudge));
                tokens.push(format!("{:?}", -middle * nudge));
            }
        }
    }
    for datatype in FLOATS {
        each_and_all(datatype, &tokens);
    }
}

#[test]
fn integers_at_and_past_their_bounds_read_as_the_strict_reader_reads_them() {
    let (i64_min, u64_max) = (i128::from(i64::MIN), i128::from(u64::MAX));
    for datatype in INTEGERS {
        let (low, high, _) = data::integer_range(datatype);
        for value in [low, high, low + 1, high - 1, 0, 1, -1, 42] {
            let text = format!("[{value}]");
            let in_range = (low..=high).contains(&value);
            assert_eq!(flat(&text, datatype, &[1]).is_some(), in_range, "{text}");
        }
        for value in [
            low - 1,
            high + 1,
            i64_min,
            i64_min - 1,
            u64_max,
            u64_max + 1,
        ] {
            let text = format!("[{value}]");
            let in_range = (low..=high).contains(&value);
            assert_eq!(flat(&text, datatype, &[1]).is_some(), in_range, "{text}");
        }
        let limits = [low.to_string(), high.to_string(), "0".into(), "7".into()];
        assert!(flat(&list(&limits), datatype, &[4]).is_some());
    }
}

#[test]
fn random_integers_read_bit_for_bit() {
    let mut seeded = Seeded(0x1d5);
    for datatype in INTEGERS {
        let (low, high, _) = data::integer_range(datatype);
        let span = (high - low) as u128;
        let tokens: Vec<String> = (0..512)
            .map(|_| {
                let wide = (u128::from(seeded.next()) << 64) | u128::from(seeded.next());
                // Values of every width: a random number of the span's bits.
                let bits = seeded.below(128) as u32;
                let offset = (wide >> bits) % (span + 1);
                (low + offset as i128).to_string()
            })
            .collect();
        assert!(flat(&list(&tokens), datatype, &[2, 256]).is_some());
    }
}

#[test]
fn integer_tensors_leave_float_tokens_and_negative_zero_to_the_strict_reader() {
    for datatype in INTEGERS {
        for token in ["-0", "1.0", "0.0", "1e2", "1E2", "1.5", "-0.0", "2e0"] {
            let text = format!("[3, {token}]");
            assert_eq!(flat(&text, datatype, &[2]), None, "{text}");
            assert!(strict(&text, datatype, &[2]).is_err(), "{text}");
        }
    }
}

#[test]
fn whitespace_and_empty_lists_read_flat() {
    let spaced = "[ 1 ,\n2\t,\r\n3 ]";
    for datatype in FLOATS.into_iter().chain(INTEGERS) {
        assert!(flat(spaced, datatype, &[3]).is_some());
        assert!(flat(spaced, datatype, &[1, 3]).is_some());
        assert_eq!(flat("[]", datatype, &[0]), Some(Vec::new()));
        assert_eq!(flat("[ \n ]", datatype, &[2, 0]), Some(Vec::new()));
    }
}

/// Everything that is not a flat list of plain numbers that fit: the flat path leaves it,
/// and the answer is the strict reader's, errors in their order.
#[test]
fn everything_else_is_the_strict_readers_answer() {
    let cases: &[(&str, &[usize])] = &[
        ("[[1,2],[3,4]]", &[2, 2]),
        ("[[1,2],[3,4]]", &[4]),
        ("[[1,2],[3]]", &[2, 2]),
        ("[1,[2]]", &[2]),
        ("[1,[2]]", &[1, 2]),
        ("[null]", &[1]),
        ("[1, null, 2]", &[3]),
        ("[true]", &[1]),
        ("[\"1\"]", &[1]),
        ("[{}]", &[1]),
        ("[1, {\"a\": 1}]", &[2]),
        ("[1,2]", &[3]),
        ("[1,2,3]", &[2]),
        ("[1,2,3]", &[2, 2]),
        ("[]", &[1]),
        ("[1]", &[0]),
        ("[1e39, null]", &[2]),
        ("[1e39, 1, 2]", &[2]),
        ("[256, 1.5]", &[2]),
        ("[256, null]", &[2]),
        ("[1e999]", &[1]),
        ("[70000, 1e39, -1]", &[3]),
        ("[1, 2, \"x\", 4.5, 1e400]", &[5]),
    ];
    for &(text, shape) in cases {
        for datatype in FLOATS.into_iter().chain(INTEGERS) {
            if let Some(raw) = flat(text, datatype, shape) {
                // Only these are all plain numbers that fit, in the strict reader's eyes too.
                assert!(
                    matches!(text, "[256, 1.5]" | "[70000, 1e39, -1]"),
                    "{} {text}: {raw:?}",
                    datatype.name()
                );
            }
        }
    }
    // BOOL and BYTES data are always the strict reader's.
    assert_eq!(flat("[true, false]", DataType::Bool, &[2]), None);
    assert_eq!(flat("[\"a\"]", DataType::Bytes, &[1]), None);
    assert_eq!(flat("[1]", DataType::Bool, &[1]), None);
}

#[test]
fn a_count_past_usize_is_never_matched() {
    let data = value("[1, 2, 3]");
    let shape = [usize::MAX, 2];
    for datatype in FLOATS.into_iter().chain(INTEGERS) {
        assert_eq!(read(data.get(), datatype, usize::MAX), None);
        assert_eq!(
            data::read(&data, datatype, &shape, usize::MAX, "input 'x'"),
            data::read_strictly(&data, datatype, &shape, usize::MAX, "input 'x'")
        );
    }
}
