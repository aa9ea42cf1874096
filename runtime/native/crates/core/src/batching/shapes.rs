//! Requests whose inputs differ in a variable axis besides the batch (a sequence length):
//! which shapes a model accepts, which batch a request may join, and what padding and
//! cutting back that takes: a port of `runtime/batching/shapes.py` and the parts of
//! `runtime/engines/dimensions.py` it uses, plus inputs with no configured range, taken at
//! any extent under EqualShapes (PadToBuckets refuses them at start).
//!
//! A request's batch shape (the item shape of each input) is what it shares a batch with.
//! Under EqualShapes it is the request's own shape. Under PadToBuckets each padded axis
//! name is rounded up to the next of `shapeBuckets` (powers of two when empty), at most the
//! largest extent the inputs allow, so requests of nearby lengths meet in one batch. A
//! name is padded when every input axis bearing it belongs to an input with a pad value,
//! and it is never a term of a sum name (a decoder's `past_sequence_length +
//! sequence_length`) except the last. Each output axis named after a padded name, or a sum
//! of names, is cut back to the request's own extent, so a client gets exactly what the
//! unpadded request would have returned.

use std::collections::{BTreeMap, BTreeSet};

use super::BatchShape;
use super::config::ShapeBatching;
use crate::error::ApiError;
use crate::tensor::{Tensor, TensorSpec};

/// What the batcher needs of one checked request of a model with variable axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestShape {
    /// The batch it joins (its own shape, or its padded one).
    pub batch_shape: BatchShape,
    /// Per output (the model's order): the request's own item extents to cut its rows of
    /// the batch's output back to, where they differ from the batch's (None: as they are).
    pub cut: Vec<Option<Vec<usize>>>,
}

/// One request, checked against the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    /// Its inputs in the model's input order.
    pub inputs: Vec<Tensor>,
    /// Its rows along the batch axis.
    pub rows: usize,
    /// For a model with variable axes, the batch it joins.
    pub shape: Option<RequestShape>,
}

/// One term of an axis name: `past + sequence + 1` is two names and a number.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Term {
    Name(String),
    Number(usize),
}

/// One variable axis of one input: its position after the batch axis, its name (an
/// unnamed one gets `input:axis`, so it follows nothing else), and its largest extent
/// (usize::MAX for an input with no configured range). Its least extent is checked by
/// `check_ranges` from the spec itself.
#[derive(Clone, Debug)]
struct AxisRange {
    input: usize,
    axis: usize,
    name: String,
    high: usize,
}

/// The shapes a model's requests may take and the batches they join. Built once at start.
pub struct ShapePlan {
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    variable: bool,
    axes: Vec<AxisRange>,
    /// The largest extent of each axis name: the smallest maximum of the axes bearing it.
    bounds: BTreeMap<String, usize>,
    /// The plain names padded (PadToBuckets), see `padded_names`.
    padded: BTreeSet<String>,
    /// Per input (the model's order), its pad value where it is padded.
    pad_values: Vec<Option<f64>>,
    buckets: Vec<usize>,
}

fn quoted(name: &str) -> String {
    format!("'{name}'")
}

/// As Python's repr of a list of str: `['a', 'b']`.
fn quoted_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<String> = names.into_iter().map(quoted).collect();
    format!("[{}]", names.join(", "))
}

/// The terms of an axis name: `a + b + 1` is (a, b, 1), a plain name is itself, and a name
/// that is not a sum of names and numbers is one opaque term.
fn sum_terms(name: &str) -> Vec<Term> {
    let parts: Vec<&str> = name.split('+').map(str::trim).collect();
    let is_term = |part: &&str| {
        let mut chars = part.chars();
        match chars.next() {
            Some(c) if c.is_ascii_digit() => part.chars().all(|c| c.is_ascii_digit()),
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':'))
            }
            _ => false,
        }
    };
    if parts.len() > 1 && parts.iter().all(is_term) {
        return parts
            .into_iter()
            .map(|part| match part.parse() {
                Ok(number) => Term::Number(number),
                Err(_) => Term::Name(part.to_string()),
            })
            .collect();
    }
    vec![Term::Name(name.to_string())]
}

/// The sum of `terms` given the extents of names; None when a name is unknown.
fn sum_of(terms: &[Term], values: &BTreeMap<String, usize>) -> Option<usize> {
    terms.iter().try_fold(0usize, |total, term| match term {
        Term::Number(number) => Some(total + number),
        Term::Name(name) => values.get(name).map(|v| total + v),
    })
}

/// The extent of an axis named `name`: known as a whole first, else its terms' sum.
fn evaluate(name: &str, values: &BTreeMap<String, usize>) -> Option<usize> {
    match values.get(name) {
        Some(&extent) => Some(extent),
        None => sum_of(&sum_terms(name), values),
    }
}

/// `values` without `name`: a sum name evaluated from its terms.
fn without(values: &BTreeMap<String, usize>, name: &str) -> BTreeMap<String, usize> {
    let mut values = values.clone();
    values.remove(name);
    values
}

/// An item shape with each variable axis sized from the extents of names; None when one
/// cannot be (its name, or a term of it, is unknown).
fn resolve_item_shape(spec: &TensorSpec, values: &BTreeMap<String, usize>) -> Option<Vec<usize>> {
    spec.item_shape()
        .iter()
        .enumerate()
        .map(|(axis, &fixed)| {
            if fixed >= 0 {
                return Some(fixed as usize);
            }
            let name = spec.axis_names.get(axis).and_then(Option::as_deref)?;
            evaluate(name, values)
        })
        .collect()
}

/// Every variable axis of the inputs with its range.
fn variable_axes(inputs: &[TensorSpec]) -> Vec<AxisRange> {
    let mut found = Vec::new();
    for (index, spec) in inputs.iter().enumerate() {
        for (axis, &fixed) in spec.item_shape().iter().enumerate() {
            if fixed >= 0 {
                continue;
            }
            let named = spec.axis_names.get(axis).and_then(Option::as_deref);
            let range = |shape: &Option<Vec<usize>>| shape.as_ref().map(|s| s[axis]);
            found.push(AxisRange {
                input: index,
                axis,
                name: named.map_or_else(|| format!("{}:{}", spec.name, axis + 1), String::from),
                high: range(&spec.max_item_shape).unwrap_or(usize::MAX),
            });
        }
    }
    found
}

/// The plain axis names that may be padded: every input bearing the name has a pad value,
/// and every sum name it is a term of ends with it, on an input with a pad value.
fn padded_names(
    axes: &[AxisRange],
    inputs: &[TensorSpec],
    given: &BTreeMap<String, f64>,
) -> BTreeSet<String> {
    let has_pad = |axis: &AxisRange| given.contains_key(&inputs[axis.input].name);
    let plain: BTreeSet<&str> = axes
        .iter()
        .filter(|a| sum_terms(&a.name).len() == 1)
        .map(|a| a.name.as_str())
        .collect();
    plain
        .into_iter()
        .filter(|&name| {
            let term = Term::Name(name.to_string());
            let bearers_pad = axes.iter().filter(|a| a.name == name).all(has_pad);
            let sums_end_with_it = axes.iter().all(|a| {
                let terms = sum_terms(&a.name);
                terms.len() == 1
                    || !terms.contains(&term)
                    || (terms.last() == Some(&term) && has_pad(a))
            });
            bearers_pad && sums_end_with_it
        })
        .map(String::from)
        .collect()
}

/// `[batch, 1..128, 4]`: an input's allowed shape, for the 400 of a request outside it.
fn range_text(spec: &TensorSpec) -> String {
    let fixed: Vec<usize> = spec
        .item_shape()
        .iter()
        .map(|&d| d.max(0) as usize)
        .collect();
    let low = spec.min_item_shape.clone().unwrap_or_else(|| fixed.clone());
    let high = spec.max_item_shape.clone().unwrap_or(fixed);
    let mut axes = vec!["batch".to_string()];
    axes.extend(low.iter().zip(&high).map(|(a, b)| {
        if a == b {
            a.to_string()
        } else {
            format!("{a}..{b}")
        }
    }));
    format!("[{}]", axes.join(", "))
}

impl ShapePlan {
    /// Raises (the message: a start-up error naming what to change) when padding is asked
    /// for and cannot be done safely (nothing padded, an input given a pad value whose axis
    /// another input does not pad, an output axis named after no input axis), or asked for
    /// inputs that have no range.
    pub fn new(
        inputs: &[TensorSpec],
        outputs: &[TensorSpec],
        shape_batching: ShapeBatching,
        buckets: &[usize],
        pad_values: &BTreeMap<String, f64>,
    ) -> Result<ShapePlan, String> {
        let variable = inputs.iter().any(TensorSpec::variable);
        let axes = if variable {
            variable_axes(inputs)
        } else {
            Vec::new()
        };
        let mut bounds = BTreeMap::new();
        for axis in &axes {
            let bound = bounds.entry(axis.name.clone()).or_insert(axis.high);
            *bound = (*bound).min(axis.high);
        }
        let padding = variable && shape_batching == ShapeBatching::PadToBuckets;
        let padded = if padding {
            padded_names(&axes, inputs, pad_values)
        } else {
            BTreeSet::new()
        };
        let mut plan = ShapePlan {
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            variable,
            axes,
            bounds,
            padded,
            pad_values: Vec::new(),
            buckets: buckets.to_vec(),
        };
        plan.pad_values = (0..inputs.len())
            .map(|i| {
                pad_values
                    .get(&inputs[i].name)
                    .copied()
                    .filter(|_| plan.pads(i))
            })
            .collect();
        if padding {
            plan.check_padding(pad_values)?;
        }
        Ok(plan)
    }

    /// Input `index` has a variable axis of a padded name, or a sum with one.
    fn pads(&self, index: usize) -> bool {
        self.axes.iter().any(|axis| {
            axis.input == index
                && sum_terms(&axis.name)
                    .iter()
                    .any(|t| matches!(t, Term::Name(n) if self.padded.contains(n)))
        })
    }

    fn check_padding(&self, given: &BTreeMap<String, f64>) -> Result<(), String> {
        if let Some(spec) = self
            .inputs
            .iter()
            .find(|s| s.variable() && (s.min_item_shape.is_none() || s.max_item_shape.is_none()))
        {
            return Err(format!(
                "shapeBatching PadToBuckets needs the range of every variable axis, and input \
                 {} has none: state it in inputShapes (minShape, optShape and maxShape), or \
                 serve this model with shapeBatching EqualShapes",
                quoted(&spec.name)
            ));
        }
        let padded_inputs: BTreeSet<&str> = (0..self.inputs.len())
            .filter(|&i| self.pad_values[i].is_some())
            .map(|i| self.inputs[i].name.as_str())
            .collect();
        if let Some(unpadded) = given.keys().find(|n| !padded_inputs.contains(n.as_str())) {
            return Err(format!(
                "input {} has a padValue, but none of its variable axes can be padded: an axis \
                 is padded only when every input bearing its name has a padValue, and only as \
                 the last term of a sum such as a decoder's \
                 'past_sequence_length + sequence_length'",
                quoted(unpadded)
            ));
        }
        if self.padded.is_empty() {
            return Err(
                "shapeBatching PadToBuckets pads nothing: give a padValue (in \
                        inputShapes) to every input of each variable axis to pad, e.g. token \
                        ids, attention mask and token types"
                    .into(),
            );
        }
        self.check_outputs_cut_back()
    }

    /// Every variable output axis is named after input axes, so padded requests can be
    /// cut back from it.
    fn check_outputs_cut_back(&self) -> Result<(), String> {
        let known: BTreeSet<&str> = self.axes.iter().map(|a| a.name.as_str()).collect();
        for spec in &self.outputs {
            for (axis, &fixed) in spec.item_shape().iter().enumerate() {
                let name = spec.axis_names.get(axis).and_then(Option::as_deref);
                if name.is_none() && fixed >= 0 {
                    continue;
                }
                let follows = name.is_some_and(|name| {
                    known.contains(name)
                        || sum_terms(name).iter().all(|term| match term {
                            Term::Number(_) => true,
                            Term::Name(n) => known.contains(n.as_str()),
                        })
                });
                if !follows {
                    return Err(format!(
                        "output {} axis {} ({}) is named after no input axis, so padded \
                         requests could not be cut back from it; serve this model with \
                         shapeBatching EqualShapes",
                        quoted(&spec.name),
                        axis + 1,
                        name.unwrap_or("unnamed")
                    ));
                }
            }
        }
        Ok(())
    }

    /// An input has a variable axis besides the batch.
    pub fn variable(&self) -> bool {
        self.variable
    }

    /// The value the padded positions of input `index` (the model's order) are filled with.
    pub fn pad_value(&self, index: usize) -> Option<f64> {
        self.pad_values.get(index).copied().flatten()
    }

    /// Validates one request's inputs (in any order) against the model: each known,
    /// present once, of its datatype and rank, fixed axes as the model fixes them, rows
    /// alike across inputs and within 1..=max_rows, each variable axis within its range and
    /// the axes of one name agreeing; a 400 naming the problem otherwise.
    pub fn check(&self, inputs: Vec<Tensor>, max_rows: usize) -> Result<Checked, ApiError> {
        let inputs = self.in_model_order(inputs)?;
        let rows = self.check_tensors(&inputs, max_rows)?;
        if !self.variable {
            return Ok(Checked {
                inputs,
                rows,
                shape: None,
            });
        }
        let own: BatchShape = inputs.iter().map(|t| t.shape[1..].to_vec()).collect();
        self.check_ranges(&own, rows)?;
        let values = self.extents(&own)?;
        let shape = if self.padded.is_empty() {
            RequestShape {
                batch_shape: own,
                cut: vec![None; self.outputs.len()],
            }
        } else {
            self.padded_shape(own, &values)
        };
        Ok(Checked {
            inputs,
            rows,
            shape: Some(shape),
        })
    }

    /// The request's inputs in the model's order: each known and present once.
    fn in_model_order(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, ApiError> {
        let mut placed: Vec<Option<Tensor>> = vec![None; self.inputs.len()];
        for tensor in inputs {
            let Some(at) = self.inputs.iter().position(|s| s.name == tensor.name) else {
                let mut known: Vec<&str> = self.inputs.iter().map(|s| s.name.as_str()).collect();
                known.sort_unstable();
                return Err(ApiError::invalid(format!(
                    "unknown input {}; the model's inputs are {}",
                    quoted(&tensor.name),
                    quoted_list(known)
                )));
            };
            if placed[at].is_some() {
                let name = quoted(&tensor.name);
                return Err(ApiError::invalid(format!(
                    "input {name} is given more than once"
                )));
            }
            placed[at] = Some(tensor);
        }
        placed
            .into_iter()
            .zip(&self.inputs)
            .map(|(tensor, spec)| {
                tensor.ok_or_else(|| {
                    ApiError::invalid(format!("missing input {}", quoted(&spec.name)))
                })
            })
            .collect()
    }

    /// Datatypes, ranks, fixed axes and rows (`assembler.check_inputs`); the rows.
    fn check_tensors(&self, inputs: &[Tensor], max_rows: usize) -> Result<usize, ApiError> {
        let mut rows = None;
        for (spec, tensor) in self.inputs.iter().zip(inputs) {
            if tensor.datatype != spec.datatype {
                return Err(ApiError::invalid(format!(
                    "input {} has datatype {}, the model expects {}",
                    quoted(&spec.name),
                    tensor.datatype.name(),
                    spec.datatype.name()
                )));
            }
            let fits = tensor.shape.len() == spec.shape.len()
                && tensor.shape[1..]
                    .iter()
                    .zip(spec.item_shape())
                    .all(|(&got, &want)| want < 0 || got as i64 == want);
            if !fits {
                let mut expected = vec!["'batch'".to_string()];
                expected.extend(spec.item_shape().iter().map(|&d| {
                    if d >= 0 {
                        d.to_string()
                    } else {
                        "'any'".into()
                    }
                }));
                return Err(ApiError::invalid(format!(
                    "input {} has shape {:?}, the model expects [{}]",
                    quoted(&spec.name),
                    tensor.shape,
                    expected.join(", ")
                )));
            }
            match rows {
                None => rows = Some(tensor.rows()),
                Some(rows) if rows != tensor.rows() => {
                    return Err(ApiError::invalid(format!(
                        "input {} has {} rows, other inputs have {rows}",
                        quoted(&spec.name),
                        tensor.rows()
                    )));
                }
                Some(_) => {}
            }
        }
        let rows = rows.unwrap_or(0);
        if !(1..=max_rows).contains(&rows) {
            return Err(ApiError::invalid(format!(
                "a request carries {rows} rows along the batch dimension; this model accepts 1 \
                 to {max_rows}"
            )));
        }
        Ok(rows)
    }

    /// Each ranged input's item within its minShape..maxShape.
    fn check_ranges(&self, own: &BatchShape, rows: usize) -> Result<(), ApiError> {
        for (spec, item) in self.inputs.iter().zip(own) {
            let (Some(low), Some(high)) = (&spec.min_item_shape, &spec.max_item_shape) else {
                continue;
            };
            let outside = item
                .iter()
                .zip(low.iter().zip(high))
                .any(|(d, (a, b))| d < a || d > b);
            if outside {
                let mut shape = vec![rows];
                shape.extend(item);
                return Err(ApiError::invalid(format!(
                    "input {} has shape {shape:?}; this model accepts {} (its inputShapes' \
                     minShape..maxShape)",
                    quoted(&spec.name),
                    range_text(spec)
                )));
            }
        }
        Ok(())
    }

    /// The extent of each axis name in a request, checked for agreement.
    fn extents(&self, own: &BatchShape) -> Result<BTreeMap<String, usize>, ApiError> {
        let mut values: BTreeMap<String, usize> = BTreeMap::new();
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for axis in &self.axes {
            let extent = own[axis.input][axis.axis];
            if let Some(&before) = values.get(&axis.name) {
                if before != extent {
                    return Err(ApiError::invalid(format!(
                        "input {} has {extent} along its axis {} ({}), input {} {before}; the \
                         axes of one name must agree",
                        quoted(&self.inputs[axis.input].name),
                        axis.axis + 1,
                        axis.name,
                        quoted(&self.inputs[seen[axis.name.as_str()]].name),
                    )));
                }
            }
            values.insert(axis.name.clone(), extent);
            seen.insert(&axis.name, axis.input);
        }
        for axis in &self.axes {
            let terms = sum_terms(&axis.name);
            if terms.len() < 2 {
                continue;
            }
            let total = sum_of(&terms, &without(&values, &axis.name));
            if let Some(total) = total.filter(|&t| t != values[&axis.name]) {
                return Err(ApiError::invalid(format!(
                    "input {} has {} along its axis {} ({}), but the other inputs make that \
                     {total}",
                    quoted(&self.inputs[axis.input].name),
                    values[&axis.name],
                    axis.axis + 1,
                    axis.name
                )));
            }
        }
        Ok(values)
    }

    /// The extent a padded axis of `extent` is rounded up to: the next bucket (powers of
    /// two without any), never past `bound`.
    pub fn bucket(&self, extent: usize, bound: usize) -> usize {
        if let Some(&size) = self.buckets.iter().find(|&&size| size >= extent) {
            return size.min(bound);
        }
        if !self.buckets.is_empty() {
            return bound;
        }
        extent.max(1).next_power_of_two().min(bound)
    }

    /// The batch a padded request joins, and how its outputs are cut back.
    fn padded_shape(&self, own: BatchShape, values: &BTreeMap<String, usize>) -> RequestShape {
        let padded = self.padded_extents(values);
        let batch_shape = self
            .inputs
            .iter()
            .zip(own)
            .map(|(spec, item)| resolve_item_shape(spec, &padded).unwrap_or(item))
            .collect();
        let cut = self
            .outputs
            .iter()
            .map(|spec| {
                if !spec.variable() {
                    return None;
                }
                let mine = resolve_item_shape(spec, values)?;
                (Some(&mine) != resolve_item_shape(spec, &padded).as_ref()).then_some(mine)
            })
            .collect();
        RequestShape { batch_shape, cut }
    }

    /// The extents of a request's batch: padded names rounded up, then each sum name
    /// re-added, its last term lowered where the sum would pass its axis' maximum.
    fn padded_extents(&self, values: &BTreeMap<String, usize>) -> BTreeMap<String, usize> {
        let mut padded = values.clone();
        for name in &self.padded {
            if let Some(&extent) = values.get(name) {
                padded.insert(
                    name.clone(),
                    extent.max(self.bucket(extent, self.bounds[name])),
                );
            }
        }
        for axis in &self.axes {
            let terms = sum_terms(&axis.name);
            let Some(Term::Name(last)) = terms.last().filter(|_| terms.len() > 1) else {
                continue;
            };
            if !self.padded.contains(last) {
                continue;
            }
            let total = sum_of(&terms, &without(&padded, &axis.name));
            if let Some(over) = total.and_then(|t| t.checked_sub(axis.high)) {
                if let Some(extent) = padded.get_mut(last) {
                    *extent = extent.saturating_sub(over);
                }
            }
        }
        for axis in &self.axes {
            let terms = sum_terms(&axis.name);
            if terms.len() > 1 {
                let total = sum_of(&terms, &without(&padded, &axis.name));
                padded.insert(axis.name.clone(), total.unwrap_or(values[&axis.name]));
            }
        }
        padded
    }
}

#[cfg(test)]
mod tests;
