//! Covers: packing requests' rows one after the other and splitting them back gives each
//! request exactly its rows; a padded request's block is filled with its pad value (in the
//! input's datatype) and cut back to its own extents; issue 40's batch integrity: an output
//! whose first axis is not the batch's rows (or, for a model that does not batch, the one
//! request's) fails the whole batch with a message naming the model, the output and both
//! counts, and no request gets an answer; engine outputs that lie about their size fail
//! rather than panic.

use super::*;

fn f32_tensor(name: &str, shape: &[usize], values: &[f32]) -> Tensor {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor {
        name: name.into(),
        datatype: DataType::F32,
        shape: shape.to_vec(),
        data: TensorData::Raw(Bytes::from(raw)),
    }
}

fn f32s(tensor: &Tensor) -> Vec<f32> {
    let TensorData::Raw(raw) = &tensor.data else {
        panic!("raw data expected")
    };
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn raw_output<'a>(name: &'a str, shape: &'a [usize], raw: &'a [u8]) -> BatchOutput<'a> {
    BatchOutput {
        name,
        datatype: DataType::F32,
        shape,
        data: OutputData::Raw(raw),
    }
}

#[test]
fn row_ranges_follow_each_other() {
    assert_eq!(row_ranges([2, 1, 3]), vec![0..2, 2..3, 3..6]);
    assert_eq!(row_ranges(Vec::<usize>::new()), Vec::<Range<usize>>::new());
}

#[test]
fn packing_then_splitting_gives_each_request_its_rows() {
    let a = f32_tensor("x", &[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = f32_tensor("x", &[1, 3], &[7., 8., 9.]);
    let mut buffer = vec![0u8; 3 * 3 * 4];
    pack_input(&mut buffer, &[3], DataType::F32, &[&a, &b], None).unwrap();
    // The engine answers its input as its output: the split must give back each request.
    let output = raw_output("y", &[3, 3], &buffer);
    let ranges = row_ranges([2, 1]);
    let parts = split_output("m", &output, 3, &ranges, &[]).unwrap();
    assert_eq!(parts[0].shape, vec![2, 3]);
    assert_eq!(f32s(&parts[0]), vec![1., 2., 3., 4., 5., 6.]);
    assert_eq!(parts[1].shape, vec![1, 3]);
    assert_eq!(f32s(&parts[1]), vec![7., 8., 9.]);
    assert_eq!(parts[1].name, "y");
}

#[test]
fn a_padded_request_is_filled_with_its_pad_value_and_cut_back() {
    // Two requests of lengths 2 and 4, in a batch padded to length 4 with -1.
    let short = f32_tensor("ids", &[1, 2], &[1., 2.]);
    let long = f32_tensor("ids", &[1, 4], &[3., 4., 5., 6.]);
    let mut buffer = vec![0xAAu8; 2 * 4 * 4];
    pack_input(
        &mut buffer,
        &[4],
        DataType::F32,
        &[&short, &long],
        Some(-1.0),
    )
    .unwrap();
    let packed = f32_tensor("ids", &[2, 4], &[]);
    let packed = Tensor {
        data: TensorData::Raw(Bytes::from(buffer.clone())),
        ..packed
    };
    assert_eq!(f32s(&packed), vec![1., 2., -1., -1., 3., 4., 5., 6.]);
    let output = raw_output("logits", &[2, 4], &buffer);
    let parts = split_output("m", &output, 2, &row_ranges([1, 1]), &[Some(&[2]), None]).unwrap();
    assert_eq!(
        (parts[0].shape.clone(), f32s(&parts[0])),
        (vec![1, 2], vec![1., 2.])
    );
    assert_eq!(f32s(&parts[1]), vec![3., 4., 5., 6.]);
}

#[test]
fn padding_in_two_axes_copies_the_leading_corner() {
    let small = f32_tensor("x", &[1, 2, 2], &[1., 2., 3., 4.]);
    let mut buffer = vec![0u8; 3 * 3 * 4];
    pack_input(&mut buffer, &[3, 3], DataType::F32, &[&small], Some(0.0)).unwrap();
    let output = raw_output("x", &[1, 3, 3], &buffer);
    let whole = split_output("m", &output, 1, &row_ranges([1]), &[]).unwrap();
    assert_eq!(f32s(&whole[0]), vec![1., 2., 0., 3., 4., 0., 0., 0., 0.]);
    let cut = split_output("m", &output, 1, &row_ranges([1]), &[Some(&[2, 2])]).unwrap();
    assert_eq!(
        (cut[0].shape.clone(), f32s(&cut[0])),
        (vec![1, 2, 2], vec![1., 2., 3., 4.])
    );
}

#[test]
fn pad_values_are_written_in_the_inputs_datatype() {
    assert_eq!(pad_bytes(DataType::I64, 1.0), 1i64.to_le_bytes().to_vec());
    assert_eq!(pad_bytes(DataType::Bool, 1.0), vec![1]);
    assert_eq!(pad_bytes(DataType::F16, 1.0), vec![0x00, 0x3C]);
    assert_eq!(pad_bytes(DataType::U8, -5.0), vec![0]); // saturates, never wraps
    let ids = Tensor {
        name: "ids".into(),
        datatype: DataType::I64,
        shape: vec![1, 1],
        data: TensorData::Raw(Bytes::from(7i64.to_le_bytes().to_vec())),
    };
    let mut buffer = vec![0u8; 3 * 8];
    pack_input(&mut buffer, &[3], DataType::I64, &[&ids], Some(2.0)).unwrap();
    let values: Vec<i64> = buffer
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(values, vec![7, 2, 2]);
}

#[test]
fn requests_that_do_not_fit_the_buffer_are_errors_not_panics() {
    let two = f32_tensor("x", &[2, 3], &[0.; 6]);
    let mut small = vec![0u8; 3 * 4];
    let error = pack_input(&mut small, &[3], DataType::F32, &[&two], None).unwrap_err();
    assert_eq!(
        error.message(),
        "input 'x' has more rows than the batch's buffer"
    );
    let mut large = vec![0u8; 3 * 3 * 4];
    let error = pack_input(&mut large, &[3], DataType::F32, &[&two], None).unwrap_err();
    assert_eq!(
        error.message(),
        "input 'x' has fewer rows than the batch's buffer"
    );
    let error = pack_input(&mut large, &[3], DataType::I32, &[&two], None).unwrap_err();
    assert!(error.message().contains("does not fit"), "{error}");
    let wide = f32_tensor("x", &[1, 4], &[0.; 4]);
    assert!(pack_input(&mut small, &[3], DataType::F32, &[&wide], Some(0.0)).is_err());
    let short = f32_tensor("x", &[1, 2], &[0.; 2]);
    let error = pack_input(&mut small, &[3], DataType::F32, &[&short], None).unwrap_err();
    assert!(error.message().contains("no pad value"), "{error}");
    let mut any = vec![0u8; 4];
    assert!(pack_input(&mut any, &[1], DataType::Bytes, &[&short], None).is_err());
}

#[test]
fn an_output_of_other_rows_fails_the_whole_batch_naming_model_output_and_counts() {
    // Three requests of one row each; "scores" holds them, "pooled" folded the batch axis.
    let scores = vec![0u8; 3 * 2 * 4];
    let pooled = vec![0u8; 2 * 4];
    let outputs = [
        raw_output("scores", &[3, 2], &scores),
        raw_output("pooled", &[1, 2], &pooled),
    ];
    let result = split_outputs("bert", &outputs, 3, &row_ranges([1, 1, 1]), &[]);
    let error = result.unwrap_err();
    assert_eq!(error.status(), 500);
    assert_eq!(
        error,
        ApiError::EngineFailed(
            "model 'bert' gave output 'pooled' 1 rows for a batch of 3 rows: its outputs do not line up \
             with the requests' rows, so none is answered from them"
                .into()
        )
    );
    // The output that did hold its rows is not split either: the check comes first.
    let reversed = [
        raw_output("pooled", &[1, 2], &pooled),
        raw_output("scores", &[3, 2], &scores),
    ];
    assert!(split_outputs("bert", &reversed, 3, &row_ranges([1, 1, 1]), &[]).is_err());
}

#[test]
fn a_model_that_does_not_batch_must_answer_the_rows_its_one_request_sent() {
    // Served one request per run: the request sent 3 rows, the model answered 1.
    let data = vec![0u8; 4];
    let output = raw_output("y", &[1], &data);
    let error = split_output("single", &output, 3, &row_ranges([3]), &[]).unwrap_err();
    assert!(
        error
            .message()
            .starts_with("model 'single' gave output 'y' 1 rows for a batch of 3 rows"),
        "{error}"
    );
    // A scalar output has no batch axis at all: 0 rows.
    let error = check_output_rows("single", &[raw_output("s", &[], &data)], 1).unwrap_err();
    assert!(
        error
            .message()
            .contains("output 's' 0 rows for a batch of 1 rows"),
        "{error}"
    );
}

#[test]
fn all_outputs_split_per_request_in_the_outputs_order() {
    let a: Vec<u8> = [1f32, 2., 3.]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let b: Vec<u8> = [4f32, 5., 6., 7., 8., 9.]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let outputs = [raw_output("a", &[3], &a), raw_output("b", &[3, 2], &b)];
    let answers = split_outputs("m", &outputs, 3, &row_ranges([2, 1]), &[]).unwrap();
    assert_eq!(answers.len(), 2);
    assert_eq!(
        answers[0]
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(f32s(&answers[0][0]), vec![1., 2.]);
    assert_eq!(f32s(&answers[1][1]), vec![8., 9.]);
    let cuts = vec![vec![None, Some(vec![1])], vec![None, None]];
    let answers = split_outputs("m", &outputs, 3, &row_ranges([2, 1]), &cuts).unwrap();
    assert_eq!(f32s(&answers[0][1]), vec![4., 6.]);
}

#[test]
fn an_output_whose_data_is_not_its_shape_fails_without_a_panic() {
    let short = vec![0u8; 5];
    let error = split_output(
        "m",
        &raw_output("y", &[2, 1], &short),
        2,
        &row_ranges([1, 1]),
        &[],
    )
    .unwrap_err();
    assert_eq!(
        error.message(),
        "model 'm' output 'y' does not hold the elements its shape says"
    );
    let huge = [2, usize::MAX, 4];
    assert!(
        split_output(
            "m",
            &raw_output("y", &huge, &short),
            2,
            &row_ranges([2]),
            &[]
        )
        .is_err()
    );
    let fine = vec![0u8; 8];
    let output = raw_output("y", &[2, 1], &fine);
    assert!(split_output("m", &output, 2, &[0..1, 1..3], &[]).is_err());
    assert!(split_output("m", &output, 2, &row_ranges([2]), &[Some(&[2])]).is_err());
}

#[test]
fn bytes_outputs_split_and_cut_by_element() {
    let strings: Vec<Bytes> = ["a", "b", "c", "d"]
        .iter()
        .map(|s| Bytes::from(*s))
        .collect();
    let output = BatchOutput {
        name: "text",
        datatype: DataType::Bytes,
        shape: &[2, 2],
        data: OutputData::Strings(strings),
    };
    let parts = split_output("m", &output, 2, &row_ranges([1, 1]), &[None, Some(&[1])]).unwrap();
    assert_eq!(
        parts[0].data,
        TensorData::Strings(vec![Bytes::from("a"), Bytes::from("b")])
    );
    assert_eq!(parts[1].shape, vec![1, 1]);
    assert_eq!(parts[1].data, TensorData::Strings(vec![Bytes::from("c")]));
}

#[test]
fn names_are_quoted_as_python_writes_them() {
    assert_eq!(quoted("x"), "'x'");
    assert_eq!(quoted("it's"), "\"it's\"");
}
