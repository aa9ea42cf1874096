//! A batch's requests packed into an execution slot's input buffers, and each request's
//! rows of the outputs taken back out, checked to be the batch's own.
//!
//! Batch integrity (issue 40): an engine whose outputs do not hold one row per row the
//! batch ran (a model exported without a batch axis, a reshape that folds it) would hand a
//! request another's rows, or nothing. [`check_output_rows`] checks every output before any
//! row is handed out, and [`split_outputs`] refuses to split otherwise, so such a batch
//! fails as a whole and none of its requests gets an answer from it.

use std::ops::Range;

use bytes::Bytes;

use crate::error::ApiError;
use crate::tensor::{DataType, Tensor, TensorData};

/// Lays one input of a batch's requests, one after the other along the batch axis, into
/// `dst`: the slot's buffer for that input, exactly the batch's rows at `item_shape`
/// (contiguous, little-endian). A request whose own item shape is smaller (padding) has
/// its block filled with `pad` first and is copied into the block's leading corner.
///
/// Fails (never panics) when the requests do not fit `dst`: a request of another datatype,
/// rank or a larger item, BYTES (which has no fixed-size buffer), a padded request without
/// a pad value, or rows that do not add up to `dst`'s. Those are the server's own checks
/// missed ([`super::shapes::ShapePlan::check`] admits none of them), named as the input.
pub fn pack_input(
    dst: &mut [u8],
    item_shape: &[usize],
    datatype: DataType,
    requests: &[&Tensor],
    pad: Option<f64>,
) -> Result<(), ApiError> {
    let name = requests.first().map_or("", |t| t.name.as_str());
    let Some(item_size) = datatype.item_size() else {
        return Err(pack_error(name, "is BYTES, which has no fixed-size buffer"));
    };
    let row_bytes = item_shape.iter().product::<usize>() * item_size;
    let mut start = 0;
    for tensor in requests {
        let TensorData::Raw(raw) = &tensor.data else {
            return Err(pack_error(&tensor.name, "holds BYTES elements"));
        };
        let own = tensor.shape.get(1..).unwrap_or(&[]);
        if tensor.datatype != datatype
            || own.len() != item_shape.len()
            || own.iter().zip(item_shape).any(|(a, b)| a > b)
            || raw.len() != tensor.element_count() * item_size
        {
            return Err(pack_error(&tensor.name, "does not fit the batch's buffer"));
        }
        let stop = start + tensor.rows() * row_bytes;
        let Some(block) = dst.get_mut(start..stop) else {
            return Err(pack_error(
                &tensor.name,
                "has more rows than the batch's buffer",
            ));
        };
        if own == item_shape {
            block.copy_from_slice(raw);
        } else {
            let Some(value) = pad else {
                return Err(pack_error(&tensor.name, "is padded but has no pad value"));
            };
            fill(block, &pad_bytes(datatype, value));
            for (from, to, len) in corner_runs(&tensor.shape, &row_shape(tensor.rows(), item_shape))
            {
                let (from, to, len) = (from * item_size, to * item_size, len * item_size);
                block[to..to + len].copy_from_slice(&raw[from..from + len]);
            }
        }
        start = stop;
    }
    if start != dst.len() {
        return Err(pack_error(name, "has fewer rows than the batch's buffer"));
    }
    Ok(())
}

fn pack_error(input: &str, what: &str) -> ApiError {
    ApiError::invalid(format!("input {} {what}", quoted(input)))
}

fn row_shape(rows: usize, item_shape: &[usize]) -> Vec<usize> {
    std::iter::once(rows)
        .chain(item_shape.iter().copied())
        .collect()
}

fn fill(block: &mut [u8], element: &[u8]) {
    for chunk in block.chunks_exact_mut(element.len()) {
        chunk.copy_from_slice(element);
    }
}

/// One element of `datatype` holding `value`, little-endian: numbers out of a type's range
/// saturate (Rust's `as`), as a pad value is a configured constant, not data.
pub(crate) fn pad_bytes(datatype: DataType, value: f64) -> Vec<u8> {
    match datatype {
        DataType::Bool => vec![u8::from(value != 0.0)],
        DataType::U8 => (value as u8).to_le_bytes().to_vec(),
        DataType::U16 => (value as u16).to_le_bytes().to_vec(),
        DataType::U32 => (value as u32).to_le_bytes().to_vec(),
        DataType::U64 => (value as u64).to_le_bytes().to_vec(),
        DataType::I8 => (value as i8).to_le_bytes().to_vec(),
        DataType::I16 => (value as i16).to_le_bytes().to_vec(),
        DataType::I32 => (value as i32).to_le_bytes().to_vec(),
        DataType::I64 => (value as i64).to_le_bytes().to_vec(),
        DataType::F16 => half::f16::from_f64(value).to_le_bytes().to_vec(),
        DataType::F32 => (value as f32).to_le_bytes().to_vec(),
        DataType::F64 => value.to_le_bytes().to_vec(),
        DataType::Bytes => Vec::new(),
    }
}

/// The contiguous runs (offset in `a`, offset in `b`, length, all in elements) that copy
/// the leading corner two row-major shapes of one rank have in common: a request into its
/// padded block, or a request's own extents out of the batch's output.
fn corner_runs(a: &[usize], b: &[usize]) -> Vec<(usize, usize, usize)> {
    let common: Vec<usize> = a.iter().zip(b).map(|(x, y)| *x.min(y)).collect();
    if common.contains(&0) {
        return Vec::new();
    }
    let Some((&run, outer)) = common.split_last() else {
        return vec![(0, 0, 1)]; // rank 0: one element
    };
    let strides = |shape: &[usize]| -> Vec<usize> {
        let mut strides = vec![1; shape.len()];
        for axis in (0..shape.len().saturating_sub(1)).rev() {
            strides[axis] = strides[axis + 1] * shape[axis + 1];
        }
        strides
    };
    let (stride_a, stride_b) = (strides(a), strides(b));
    let mut index = vec![0; outer.len()];
    let mut runs = Vec::with_capacity(outer.iter().product());
    loop {
        let offset = |strides: &[usize]| index.iter().zip(strides).map(|(i, s)| i * s).sum();
        runs.push((offset(&stride_a), offset(&stride_b), run));
        // The next index of the outer axes, last one fastest.
        let mut axis = outer.len();
        loop {
            if axis == 0 {
                return runs;
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < outer[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

/// Each request's row range in the batch, in order.
pub fn row_ranges(rows: impl IntoIterator<Item = usize>) -> Vec<Range<usize>> {
    let mut start = 0;
    rows.into_iter()
        .map(|n| {
            let range = start..start + n;
            start += n;
            range
        })
        .collect()
}

/// An output of a batch as the engine answered it.
pub enum OutputData<'a> {
    Raw(&'a [u8]),
    Strings(Vec<Bytes>),
}

pub struct BatchOutput<'a> {
    pub name: &'a str,
    pub datatype: DataType,
    pub shape: &'a [usize],
    pub data: OutputData<'a>,
}

/// The one error of a batch whose output does not hold the batch's rows (Python's
/// `OutputRowsMismatch`, word for word).
pub fn output_rows_mismatch(
    model: &str,
    output: &str,
    rows: usize,
    output_rows: usize,
) -> ApiError {
    ApiError::EngineFailed(format!(
        "model {} gave output {} {output_rows} rows for a batch of {rows} rows: its outputs do \
         not line up with the requests' rows, so none is answered from them",
        quoted(model),
        quoted(output)
    ))
}

/// Fails unless every output's first axis holds `rows` rows: the rows the batch ran, or,
/// for a model served one request per run (it does not batch), the rows that one request
/// sent. A scalar output has no rows. Checked before any row is handed out.
pub fn check_output_rows(
    model: &str,
    outputs: &[BatchOutput<'_>],
    rows: usize,
) -> Result<(), ApiError> {
    for output in outputs {
        let output_rows = output.shape.first().copied().unwrap_or(0);
        if output_rows != rows {
            return Err(output_rows_mismatch(model, output.name, rows, output_rows));
        }
    }
    Ok(())
}

/// Each request's rows of every output (in `outputs`' order), after [`check_output_rows`]
/// passed for all of them: one mismatched output fails the whole batch, so no request gets
/// an answer. `cuts[r][o]`: request `r`'s own item extents for output `o` (None: as is);
/// empty `cuts` cuts nothing.
pub fn split_outputs(
    model: &str,
    outputs: &[BatchOutput<'_>],
    rows: usize,
    ranges: &[Range<usize>],
    cuts: &[Vec<Option<Vec<usize>>>],
) -> Result<Vec<Vec<Tensor>>, ApiError> {
    check_output_rows(model, outputs, rows)?;
    if !cuts.is_empty() && cuts.len() != ranges.len() {
        return Err(split_error(
            model,
            "",
            "has cuts for another number of requests",
        ));
    }
    let mut answers: Vec<Vec<Tensor>> = ranges
        .iter()
        .map(|_| Vec::with_capacity(outputs.len()))
        .collect();
    for (index, output) in outputs.iter().enumerate() {
        let own: Vec<Option<&[usize]>> = cuts
            .iter()
            .map(|per_output| per_output.get(index).and_then(|c| c.as_deref()))
            .collect();
        for (answer, tensor) in answers
            .iter_mut()
            .zip(split_output(model, output, rows, ranges, &own)?)
        {
            answer.push(tensor);
        }
    }
    Ok(answers)
}

/// Each request's rows of `output` (copied out: the slot reuses its buffers), each cut back
/// to its own extents where `cuts` says (empty: none); an output whose first axis is not
/// the batch's `rows` fails the whole batch with an EngineFailed naming the model, the
/// output and both counts (never another request's rows, never a short answer).
pub fn split_output(
    model: &str,
    output: &BatchOutput<'_>,
    rows: usize,
    ranges: &[Range<usize>],
    cuts: &[Option<&[usize]>],
) -> Result<Vec<Tensor>, ApiError> {
    check_output_rows(model, std::slice::from_ref(output), rows)?;
    let item_shape = &output.shape[1..];
    // Checked arithmetic: the shape is the engine's word, and a wrong one must fail here.
    let expected = item_shape.iter().try_fold(rows, |n, &d| n.checked_mul(d));
    let held_ok = match (&output.data, output.datatype.item_size()) {
        (OutputData::Raw(raw), Some(size)) => {
            expected.and_then(|n| n.checked_mul(size)) == Some(raw.len())
        }
        (OutputData::Strings(strings), None) => expected == Some(strings.len()),
        _ => false,
    };
    if !held_ok {
        return Err(split_error(
            model,
            output.name,
            "does not hold the elements its shape says",
        ));
    }
    if ranges.last().is_some_and(|r| r.end > rows)
        || (!cuts.is_empty() && cuts.len() != ranges.len())
    {
        return Err(split_error(
            model,
            output.name,
            "was split into rows the batch does not have",
        ));
    }
    ranges
        .iter()
        .enumerate()
        .map(|(request, range)| {
            let cut = cuts.get(request).copied().flatten();
            split_one(model, output, range, item_shape, cut)
        })
        .collect()
}

fn split_one(
    model: &str,
    output: &BatchOutput<'_>,
    range: &Range<usize>,
    item_shape: &[usize],
    cut: Option<&[usize]>,
) -> Result<Tensor, ApiError> {
    let row_elements: usize = item_shape.iter().product();
    let full = row_shape(range.len(), item_shape);
    let shape = match cut {
        Some(own) if own != item_shape => {
            if own.len() != item_shape.len() || own.iter().zip(item_shape).any(|(a, b)| a > b) {
                return Err(split_error(
                    model,
                    output.name,
                    "cannot be cut back to the request's own extents",
                ));
            }
            row_shape(range.len(), own)
        }
        _ => full.clone(),
    };
    let (first, last) = (range.start * row_elements, range.end * row_elements);
    let data = match &output.data {
        OutputData::Raw(raw) => {
            let size = output.datatype.item_size().unwrap_or(1);
            let rows = &raw[first * size..last * size];
            if shape == full {
                TensorData::Raw(Bytes::copy_from_slice(rows))
            } else {
                let mut cut = Vec::with_capacity(shape.iter().product::<usize>() * size);
                for (from, _, len) in corner_runs(&full, &shape) {
                    cut.extend_from_slice(&rows[from * size..(from + len) * size]);
                }
                TensorData::Raw(Bytes::from(cut))
            }
        }
        OutputData::Strings(strings) => {
            let rows = &strings[first..last];
            if shape == full {
                TensorData::Strings(rows.to_vec())
            } else {
                let runs = corner_runs(&full, &shape);
                TensorData::Strings(
                    runs.iter()
                        .flat_map(|&(from, _, len)| rows[from..from + len].iter().cloned())
                        .collect(),
                )
            }
        }
    };
    Ok(Tensor {
        name: output.name.to_string(),
        datatype: output.datatype,
        shape,
        data,
    })
}

fn split_error(model: &str, output: &str, what: &str) -> ApiError {
    ApiError::EngineFailed(format!(
        "model {} output {} {what}",
        quoted(model),
        quoted(output)
    ))
}

/// A name as Python's `repr` writes it (the messages quote names as `{name!r}` does, and
/// Python clients and tests assert on them): in single quotes, or double ones when it holds
/// a single quote and no double one.
pub(crate) fn quoted(name: &str) -> String {
    if name.contains('\'') && !name.contains('"') {
        format!("\"{name}\"")
    } else {
        format!("'{}'", name.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

#[cfg(test)]
mod tests;
