//! The Python tables (`tests/runtime/test_shape_batching.py`), ported: axis names and
//! sums; `check`'s 400s (unknown, missing, repeated inputs, datatype, shape, rows, a request
//! outside its range, axes of one name that disagree, a sum that does not add up); each
//! request's batch shape under EqualShapes (its own) and PadToBuckets (rounded up to the
//! next bucket, powers of two by default, never past the axis' maximum, a sum's last term
//! lowered to fit its axis) and the cut back; padding refused where it would be unsafe.

use bytes::Bytes;

use super::*;
use crate::tensor::{DataType, TensorData};

const SEQ: &str = "sequence_length";
const PAST: &str = "past_sequence_length";
const TOTAL: &str = "past_sequence_length + sequence_length";
const TEXT: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];

fn spec(name: &str, datatype: DataType, shape: &[i64], names: &[Option<&str>]) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        datatype,
        shape: shape.to_vec(),
        axis_names: names.iter().map(|n| n.map(String::from)).collect(),
        min_item_shape: None,
        max_item_shape: None,
    }
}

fn ranged(spec: TensorSpec, low: &[usize], high: &[usize]) -> TensorSpec {
    TensorSpec {
        min_item_shape: Some(low.to_vec()),
        max_item_shape: Some(high.to_vec()),
        ..spec
    }
}

fn encoder_specs(high: usize) -> (Vec<TensorSpec>, Vec<TensorSpec>) {
    let inputs = TEXT
        .iter()
        .map(|n| {
            ranged(
                spec(n, DataType::I64, &[-1, -1], &[Some(SEQ)]),
                &[1],
                &[high],
            )
        })
        .collect();
    let hidden = spec(
        "last_hidden_state",
        DataType::F32,
        &[-1, -1, 8],
        &[Some(SEQ), None],
    );
    let outputs = vec![spec("logits", DataType::F32, &[-1, 3], &[]), hidden];
    (inputs, outputs)
}

fn decoder_specs() -> (Vec<TensorSpec>, Vec<TensorSpec>) {
    let past = spec(
        "past_0_key",
        DataType::F32,
        &[-1, 2, -1, 4],
        &[None, Some(PAST), None],
    );
    let inputs = vec![
        ranged(
            spec("input_ids", DataType::I64, &[-1, -1], &[Some(SEQ)]),
            &[1],
            &[64],
        ),
        ranged(
            spec("attention_mask", DataType::I64, &[-1, -1], &[Some(TOTAL)]),
            &[1],
            &[80],
        ),
        ranged(past, &[2, 0, 4], &[2, 64, 4]),
    ];
    let outputs = vec![
        spec("logits", DataType::F32, &[-1, -1, 10], &[Some(SEQ), None]),
        spec(
            "present_0_key",
            DataType::F32,
            &[-1, 2, -1, 4],
            &[None, Some(TOTAL), None],
        ),
    ];
    (inputs, outputs)
}

fn plan(
    specs: &(Vec<TensorSpec>, Vec<TensorSpec>),
    strategy: ShapeBatching,
    padded: &[&str],
    buckets: &[usize],
) -> Result<ShapePlan, String> {
    let pads = padded.iter().map(|n| (n.to_string(), 0.0)).collect();
    ShapePlan::new(&specs.0, &specs.1, strategy, buckets, &pads)
}

fn equal(specs: &(Vec<TensorSpec>, Vec<TensorSpec>)) -> ShapePlan {
    plan(specs, ShapeBatching::EqualShapes, &[], &[]).unwrap()
}

fn tensor(name: &str, datatype: DataType, shape: &[usize]) -> Tensor {
    let count: usize = shape.iter().product();
    let size = datatype.item_size().unwrap();
    Tensor {
        name: name.into(),
        datatype,
        shape: shape.to_vec(),
        data: TensorData::Raw(Bytes::from(vec![0u8; count * size])),
    }
}

fn text_request(rows: usize, length: usize) -> Vec<Tensor> {
    TEXT.iter()
        .map(|n| tensor(n, DataType::I64, &[rows, length]))
        .collect()
}

fn decoder_request(length: usize, past: usize, total: Option<usize>) -> Vec<Tensor> {
    vec![
        tensor("input_ids", DataType::I64, &[1, length]),
        tensor(
            "attention_mask",
            DataType::I64,
            &[1, total.unwrap_or(past + length)],
        ),
        tensor("past_0_key", DataType::F32, &[1, 2, past, 4]),
    ]
}

fn refusal(result: Result<Checked, ApiError>) -> String {
    match result {
        Err(ApiError::InvalidRequest(message)) => message,
        other => panic!("expected a 400, got {other:?}"),
    }
}

#[test]
fn an_axis_name_is_a_sum_of_names_and_numbers_or_itself() {
    let name = |n: &str| Term::Name(n.into());
    assert_eq!(sum_terms(SEQ), vec![name(SEQ)]);
    assert_eq!(sum_terms(TOTAL), vec![name(PAST), name(SEQ)]);
    assert_eq!(
        sum_terms("a + 1 + b"),
        vec![name("a"), Term::Number(1), name("b")]
    );
    assert_eq!(sum_terms("2*n"), vec![name("2*n")]);
    assert_eq!(sum_terms("unk__3"), vec![name("unk__3")]);
}

#[test]
fn a_sum_is_read_whole_first_then_added_up() {
    let values = |pairs: &[(&str, usize)]| -> BTreeMap<String, usize> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    assert_eq!(
        evaluate(TOTAL, &values(&[(TOTAL, 9), (PAST, 1), (SEQ, 1)])),
        Some(9)
    );
    assert_eq!(evaluate(TOTAL, &values(&[(PAST, 5), (SEQ, 3)])), Some(8));
    assert_eq!(evaluate("a + 1", &values(&[("a", 2)])), Some(3));
    assert_eq!(evaluate(TOTAL, &values(&[(SEQ, 3)])), None);
}

#[test]
fn a_request_outside_its_range_is_a_400_naming_the_range() {
    let message = refusal(equal(&encoder_specs(128)).check(text_request(2, 129), 8));
    assert!(
        message.contains("'input_ids' has shape [2, 129]; this model accepts [batch, 1..128]"),
        "{message}"
    );
    let empty = refusal(equal(&encoder_specs(128)).check(text_request(1, 0), 8));
    assert!(
        empty.contains("has shape [1, 0]; this model accepts [batch, 1..128]"),
        "{empty}"
    );
    let past = refusal(equal(&decoder_specs()).check(decoder_request(1, 65, None), 8));
    assert!(past.contains("accepts [batch, 2, 0..64, 4]"), "{past}");
}

#[test]
fn axes_of_one_name_must_agree_and_a_sum_must_add_up() {
    let mut request = text_request(1, 9);
    request[2] = tensor("token_type_ids", DataType::I64, &[1, 8]);
    let message = refusal(equal(&encoder_specs(128)).check(request, 8));
    assert!(
        message.contains(
            "'token_type_ids' has 8 along its axis 1 (sequence_length), input 'attention_mask' 9"
        ),
        "{message}"
    );
    let decoder = equal(&decoder_specs());
    let sum = refusal(decoder.check(decoder_request(3, 5, Some(9)), 8));
    assert!(sum.starts_with("input 'attention_mask' has 9"), "{sum}");
    assert!(sum.ends_with("the other inputs make that 8"), "{sum}");
}

#[test]
fn inputs_are_checked_as_assembler_check_inputs_does() {
    let shapes = equal(&encoder_specs(128));
    let mut unknown = text_request(1, 4);
    unknown.push(tensor("extra", DataType::I64, &[1, 4]));
    assert_eq!(
        refusal(shapes.check(unknown, 8)),
        "unknown input 'extra'; the model's inputs are ['attention_mask', 'input_ids', \
         'token_type_ids']"
    );
    let mut missing = text_request(1, 4);
    missing.remove(1);
    assert_eq!(
        refusal(shapes.check(missing, 8)),
        "missing input 'attention_mask'"
    );
    let mut twice = text_request(1, 4);
    twice.push(tensor("input_ids", DataType::I64, &[1, 4]));
    assert_eq!(
        refusal(shapes.check(twice, 8)),
        "input 'input_ids' is given more than once"
    );
    let mut typed = text_request(1, 4);
    typed[0] = tensor("input_ids", DataType::I32, &[1, 4]);
    assert_eq!(
        refusal(shapes.check(typed, 8)),
        "input 'input_ids' has datatype INT32, the model expects INT64"
    );
    let mut rank = text_request(1, 4);
    rank[0] = tensor("input_ids", DataType::I64, &[1, 4, 1]);
    assert_eq!(
        refusal(shapes.check(rank, 8)),
        "input 'input_ids' has shape [1, 4, 1], the model expects ['batch', 'any']"
    );
    let mut rows = text_request(2, 4);
    rows[1] = tensor("attention_mask", DataType::I64, &[3, 4]);
    assert_eq!(
        refusal(shapes.check(rows, 8)),
        "input 'attention_mask' has 3 rows, other inputs have 2"
    );
    assert_eq!(
        refusal(shapes.check(text_request(9, 4), 8)),
        "a request carries 9 rows along the batch dimension; this model accepts 1 to 8"
    );
}

#[test]
fn equal_shapes_batch_a_request_at_its_own_shape_in_the_models_input_order() {
    let shapes = equal(&encoder_specs(128));
    let mut request = text_request(2, 9);
    request.reverse();
    let checked = shapes.check(request, 8).unwrap();
    assert_eq!(checked.rows, 2);
    let names: Vec<&str> = checked.inputs.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, TEXT.to_vec());
    let shape = checked.shape.unwrap();
    assert_eq!(shape.batch_shape, vec![vec![9], vec![9], vec![9]]);
    assert_eq!(shape.cut, vec![None, None]);
    let other = shapes.check(text_request(1, 10), 8).unwrap().shape.unwrap();
    assert_ne!(other.batch_shape, shape.batch_shape, "never the same batch");
}

#[test]
fn padding_rounds_up_to_the_next_bucket_never_past_the_maximum() {
    let table: [(usize, &[usize], usize); 11] = [
        (1, &[], 1),
        (3, &[], 4),
        (9, &[], 16),
        (16, &[], 16),
        (100, &[], 128),
        (128, &[], 128),
        (9, &[16, 64], 16),
        (17, &[16, 64], 64),
        (65, &[16, 64], 128),
        (100, &[16, 64, 512], 128),
        (33, &[16, 32], 128),
    ];
    for (length, buckets, padded_to) in table {
        let shapes = plan(
            &encoder_specs(128),
            ShapeBatching::PadToBuckets,
            &TEXT,
            buckets,
        );
        let shape = shapes
            .unwrap()
            .check(text_request(1, length), 8)
            .unwrap()
            .shape;
        let shape = shape.unwrap();
        assert_eq!(
            shape.batch_shape,
            vec![vec![padded_to]; 3],
            "{length} {buckets:?}"
        );
        // Only the output named after the padded axis is cut, to the request's length.
        let cut = (padded_to != length).then(|| vec![length, 8]);
        assert_eq!(shape.cut, vec![None, cut], "{length} {buckets:?}");
    }
}

#[test]
fn powers_of_two_stop_at_the_axis_maximum() {
    let shapes = plan(&encoder_specs(100), ShapeBatching::PadToBuckets, &TEXT, &[]).unwrap();
    let shape = shapes.check(text_request(1, 70), 8).unwrap().shape.unwrap();
    assert_eq!(shape.batch_shape, vec![vec![100]; 3]);
    assert_eq!(shape.cut, vec![None, Some(vec![70, 8])]);
}

#[test]
fn a_decoder_pads_its_new_tokens_only_and_its_sums_last_term() {
    let padded = ["input_ids", "attention_mask"];
    let shapes = plan(&decoder_specs(), ShapeBatching::PadToBuckets, &padded, &[]).unwrap();
    assert_eq!(shapes.padded, BTreeSet::from([SEQ.to_string()]));
    assert_eq!(
        (shapes.pad_value(0), shapes.pad_value(2)),
        (Some(0.0), None)
    );
    let shape = shapes
        .check(decoder_request(3, 5, None), 8)
        .unwrap()
        .shape
        .unwrap();
    assert_eq!(shape.batch_shape, vec![vec![4], vec![9], vec![2, 5, 4]]);
    assert_eq!(shape.cut, vec![Some(vec![3, 10]), Some(vec![2, 8, 4])]);
    // The mask's axis allows 80: 60 past tokens and 18 new ones go to 80, not 60 + 32.
    let near_the_end = shapes.check(decoder_request(18, 60, None), 8).unwrap();
    let batch_shape = near_the_end.shape.unwrap().batch_shape;
    assert_eq!(batch_shape[..2], [vec![20], vec![80]]);
}

#[test]
fn unsafe_padding_is_refused_at_start() {
    fn refused(specs: &(Vec<TensorSpec>, Vec<TensorSpec>), padded: &[&str]) -> String {
        let pad = ShapeBatching::PadToBuckets;
        plan(specs, pad, padded, &[]).err().unwrap()
    }
    let nothing = refused(&encoder_specs(128), &[]);
    assert!(nothing.contains("PadToBuckets pads nothing"), "{nothing}");
    let partial = refused(&encoder_specs(128), &["input_ids", "attention_mask"]);
    assert!(
        partial.starts_with("input 'attention_mask' has a padValue, but none"),
        "{partial}"
    );
    let past = refused(
        &decoder_specs(),
        &["input_ids", "attention_mask", "past_0_key"],
    );
    assert!(
        past.starts_with("input 'past_0_key' has a padValue"),
        "{past}"
    );
    // A sum whose padded term is not its last: padding it would pad the sum's middle.
    let (mut inputs, outputs) = decoder_specs();
    inputs[1].axis_names = vec![Some(format!("{SEQ} + {PAST}"))];
    let middle = refused(&(inputs, outputs), &["input_ids", "attention_mask"]);
    assert!(
        middle.starts_with("input 'attention_mask' has a padValue"),
        "{middle}"
    );
    let tokens = spec("tokens", DataType::F32, &[-1, -1], &[Some("unk__1")]);
    let unnamed = refused(&(encoder_specs(128).0, vec![tokens]), &TEXT);
    assert!(
        unnamed.contains("output 'tokens' axis 1 (unk__1) is named after no input axis"),
        "{unnamed}"
    );
    let (mut inputs, outputs) = encoder_specs(128);
    inputs[0].max_item_shape = None;
    let unranged = refused(&(inputs, outputs), &TEXT);
    assert!(
        unranged.contains("input 'input_ids' has none"),
        "{unranged}"
    );
}

#[test]
fn an_input_without_a_range_takes_any_extent_under_equal_shapes() {
    let (mut inputs, outputs) = encoder_specs(128);
    for input in &mut inputs {
        input.min_item_shape = None;
        input.max_item_shape = None;
    }
    let shapes = equal(&(inputs, outputs));
    let shape = shapes
        .check(text_request(1, 5000), 8)
        .unwrap()
        .shape
        .unwrap();
    assert_eq!(shape.batch_shape, vec![vec![5000]; 3]);
}

#[test]
fn a_model_without_variable_axes_has_no_shapes() {
    let specs = (
        vec![spec("x", DataType::F32, &[-1, 4], &[])],
        vec![spec("y", DataType::F32, &[-1, 2], &[])],
    );
    let shapes = plan(&specs, ShapeBatching::PadToBuckets, &[], &[]).unwrap();
    assert!(!shapes.variable());
    let checked = shapes
        .check(vec![tensor("x", DataType::F32, &[3, 4])], 8)
        .unwrap();
    assert_eq!((checked.rows, checked.shape), (3, None));
    let fixed = refusal(shapes.check(vec![tensor("x", DataType::F32, &[3, 5])], 8));
    assert_eq!(
        fixed,
        "input 'x' has shape [3, 5], the model expects ['batch', 4]"
    );
}
