//! A side-by-side measure of the flat path against the strict reader, on the same inputs
//! in the same run (ignored: a figure to read, not a timed test). Run it optimised:
//!
//! ```text
//! cargo test -j 1 --release -p kubeinfer-dataplane-core --lib codec::flat::bench \
//!     -- --ignored --nocapture
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use crate::codec::data;
use crate::tensor::DataType;

/// Calls of `call` that take about 20 ms in all.
fn iterations(call: &mut impl FnMut()) -> u32 {
    let mut iterations = 1u32;
    loop {
        let start = Instant::now();
        for _ in 0..iterations {
            call();
        }
        if start.elapsed() > Duration::from_millis(20) {
            return iterations;
        }
        iterations *= 2;
    }
}

/// One round's time per call.
fn round(iterations: u32, call: &mut impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iterations {
        call();
    }
    start.elapsed() / iterations
}

/// The least time one call of each takes, their rounds interleaved (so that a busy machine
/// slows both alike).
fn side_by_side(mut slow: impl FnMut(), mut fast: impl FnMut()) -> (Duration, Duration) {
    let (slow_n, fast_n) = (iterations(&mut slow), iterations(&mut fast));
    let (mut slow_best, mut fast_best) = (Duration::MAX, Duration::MAX);
    for _ in 0..15 {
        slow_best = slow_best.min(round(slow_n, &mut slow));
        fast_best = fast_best.min(round(fast_n, &mut fast));
    }
    (slow_best, fast_best)
}

fn compare(label: &str, text: &str, datatype: DataType, shape: &[usize]) {
    let value: Box<RawValue> = serde_json::from_str(text).expect("JSON");
    let count = shape.iter().product();
    let strict = || data::read_strictly(black_box(&value), datatype, shape, count, "x");
    let read = || data::read(black_box(&value), datatype, shape, count, "x");
    assert_eq!(read(), strict());
    assert!(
        super::read(value.get(), datatype, count).is_some(),
        "{label}"
    );
    let (slow, fast) = side_by_side(
        || {
            black_box(strict().expect("read"));
        },
        || {
            black_box(read().expect("read"));
        },
    );
    println!(
        "{label:<24} {:>8} bytes  strict {:>10.2?}  flat {:>10.2?}  ratio {:>5.2}x",
        text.len(),
        slow,
        fast,
        slow.as_secs_f64() / fast.as_secs_f64()
    );
}

/// Float32 values as a Python client sends them (numpy's tolist, then json.dumps: the
/// shortest form of each value widened to f64).
fn float32_text(count: usize, seed: u64) -> String {
    let mut state = seed;
    let values: Vec<String> = (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 40) as f32 / (1u32 << 24) as f32;
            format!("{:?}", f64::from((unit - 0.5) * 4.0))
        })
        .collect();
    format!("[{}]", values.join(", "))
}

#[test]
#[ignore = "a measure to read, run optimised with --ignored --nocapture"]
fn flat_path_against_the_strict_reader() {
    compare(
        "FP32 x 512",
        &float32_text(512, 7),
        DataType::F32,
        &[1, 512],
    );
    compare(
        "FP32 x 65536",
        &float32_text(65_536, 11),
        DataType::F32,
        &[64, 1024],
    );
    let ids: Vec<String> = (0..128u64)
        .map(|i| ((i * 7919) % 50_257).to_string())
        .collect();
    let ids = format!("[{}]", ids.join(", "));
    compare("INT64 x 128 token ids", &ids, DataType::I64, &[1, 128]);
}
