//! numpy arrays as the data plane's buffers and tensors: an input view's memory lent to
//! `fill` under a write borrow (rust-numpy's borrow flags, so no other extension writes it
//! meanwhile), and an output array copied into a [`Tensor`] the server owns.

use bytes::Bytes;
use dataplane_server::dataplane_core::tensor::{DataType, Tensor, TensorData};
use numpy::{
    Element, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadwriteArray, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// Runs `$body` with `$T` the Rust element type of a fixed-size `$datatype`.
macro_rules! with_element_type {
    ($datatype:expr, $T:ident => $body:expr, bytes => $bytes:expr) => {
        match $datatype {
            DataType::Bool => {
                type $T = bool;
                $body
            }
            DataType::U8 => {
                type $T = u8;
                $body
            }
            DataType::U16 => {
                type $T = u16;
                $body
            }
            DataType::U32 => {
                type $T = u32;
                $body
            }
            DataType::U64 => {
                type $T = u64;
                $body
            }
            DataType::I8 => {
                type $T = i8;
                $body
            }
            DataType::I16 => {
                type $T = i16;
                $body
            }
            DataType::I32 => {
                type $T = i32;
                $body
            }
            DataType::I64 => {
                type $T = i64;
                $body
            }
            DataType::F16 => {
                type $T = half::f16;
                $body
            }
            DataType::F32 => {
                type $T = f32;
                $body
            }
            DataType::F64 => {
                type $T = f64;
                $body
            }
            DataType::Bytes => $bytes,
        }
    };
}

/// A write borrow of an input view, held while `fill` writes through its memory.
pub(crate) trait HeldBorrow {}

impl<T: Element, D: numpy::ndarray::Dimension> HeldBorrow for PyReadwriteArray<'_, T, D> {}

/// An input view's memory, lent for one batch: `bytes` stays valid while `_borrow` lives.
pub(crate) struct LentView<'py> {
    _borrow: Box<dyn HeldBorrow + 'py>,
    pub(crate) data: *mut u8,
    pub(crate) len: usize,
}

/// The memory of the slot's view of input `name`, which must be a C-contiguous array of
/// `datatype` shaped exactly `expected` (rows first): anything else is the slot's bug, and
/// writing rows into it would lay them out wrong.
pub(crate) fn lend_view<'py>(
    view: &Bound<'py, PyAny>,
    name: &str,
    datatype: DataType,
    expected: &[usize],
) -> Result<LentView<'py>, String> {
    let array = view
        .cast::<PyUntypedArray>()
        .map_err(|_| format!("the slot's view of input {name:?} is not a numpy array"))?;
    if array.shape() != expected {
        return Err(format!(
            "the slot's view of input {name:?} has shape {:?}, not the batch's {expected:?}",
            array.shape()
        ));
    }
    if !array.is_c_contiguous() {
        return Err(format!(
            "the slot's view of input {name:?} is not C-contiguous"
        ));
    }
    with_element_type!(datatype, T => lend_typed::<T>(view, name),
        bytes => Err(format!("input {name:?} is BYTES: it has no fixed-size buffer")))
}

fn lend_typed<'py, T: Element + 'py>(
    view: &Bound<'py, PyAny>,
    name: &str,
) -> Result<LentView<'py>, String> {
    let array = view.cast::<PyArrayDyn<T>>().map_err(|_| {
        format!(
            "the slot's view of input {name:?} is not of the input's datatype (native byte order)"
        )
    })?;
    let mut borrow = array
        .try_readwrite()
        .map_err(|e| format!("the slot's view of input {name:?} cannot be written: {e}"))?;
    let slice = borrow
        .as_slice_mut()
        .map_err(|e| format!("the slot's view of input {name:?}: {e}"))?;
    let (data, len) = (
        slice.as_mut_ptr().cast::<u8>(),
        std::mem::size_of_val(slice),
    );
    Ok(LentView {
        _borrow: Box::new(borrow),
        data,
        len,
    })
}

/// Writes BYTES elements into an object array view (row-major, the view's size of them).
pub(crate) fn store_elements(
    view: &Bound<'_, PyAny>,
    name: &str,
    elements: &[Bytes],
) -> Result<(), String> {
    let py = view.py();
    let array = view
        .cast::<PyUntypedArray>()
        .map_err(|_| format!("the slot's view of input {name:?} is not a numpy array"))?;
    if array.dtype().kind() != b'O' {
        return Err(format!(
            "the slot's view of BYTES input {name:?} is not an object array"
        ));
    }
    if array.len() != elements.len() {
        return Err(format!(
            "BYTES input {name:?}: {} elements packed for a view of {}",
            elements.len(),
            array.len()
        ));
    }
    let objects: Vec<Bound<'_, PyBytes>> = elements.iter().map(|e| PyBytes::new(py, e)).collect();
    // Assigned through a flat view: an object array takes each bytes object as it is.
    view.call_method1("reshape", (-1,))
        .and_then(|flat| flat.set_item(pyo3::types::PySlice::full(py), objects))
        .map_err(|e| format!("cannot store BYTES input {name:?}: {e}"))
}

/// The numpy dtype's datatype (`NUMPY_TO_V2`: object and fixed-width bytes are BYTES).
pub(crate) fn datatype_of(array: &Bound<'_, PyUntypedArray>) -> Option<DataType> {
    let dtype = array.dtype();
    let size = dtype.itemsize();
    Some(match (dtype.kind(), size) {
        (b'b', 1) => DataType::Bool,
        (b'u', 1) => DataType::U8,
        (b'u', 2) => DataType::U16,
        (b'u', 4) => DataType::U32,
        (b'u', 8) => DataType::U64,
        (b'i', 1) => DataType::I8,
        (b'i', 2) => DataType::I16,
        (b'i', 4) => DataType::I32,
        (b'i', 8) => DataType::I64,
        (b'f', 2) => DataType::F16,
        (b'f', 4) => DataType::F32,
        (b'f', 8) => DataType::F64,
        (b'O', _) | (b'S', _) => DataType::Bytes,
        _ => return None,
    })
}

/// A copy of the engine's output `name` (a numpy array) as a tensor the server owns.
pub(crate) fn copy_output(name: &str, value: &Bound<'_, PyAny>) -> Result<Tensor, String> {
    let array = value
        .cast::<PyUntypedArray>()
        .map_err(|_| format!("the engine's output {name:?} is not a numpy array"))?;
    let datatype = datatype_of(array).ok_or_else(|| {
        format!(
            "the engine's output {name:?} has dtype {}, which has no v2 datatype",
            array.dtype()
        )
    })?;
    let shape = array.shape().to_vec();
    let data = with_element_type!(datatype, T => TensorData::Raw(copy_raw::<T>(value, name)?),
        bytes => TensorData::Strings(copy_elements(value, name)?));
    Ok(Tensor {
        name: name.to_owned(),
        datatype,
        shape,
        data,
    })
}

fn copy_raw<T: Element>(value: &Bound<'_, PyAny>, name: &str) -> Result<Bytes, String> {
    let py = value.py();
    let mut array = value
        .cast::<PyArrayDyn<T>>()
        .map_err(|_| format!("the engine's output {name:?} is not in native byte order"))?
        .clone();
    if !array.is_c_contiguous() {
        array = numpy_call(py, "ascontiguousarray", value)
            .and_then(|c| Ok(c.cast_into::<PyArrayDyn<T>>()?))
            .map_err(|e| format!("cannot copy the engine's output {name:?}: {e}"))?;
    }
    let read = array
        .try_readonly()
        .map_err(|e| format!("the engine's output {name:?} cannot be read: {e}"))?;
    let slice = read
        .as_slice()
        .map_err(|e| format!("the engine's output {name:?}: {e}"))?;
    // SAFETY: a slice of plain numeric elements seen as its bytes (little-endian hosts).
    let raw = unsafe {
        std::slice::from_raw_parts(slice.as_ptr().cast::<u8>(), std::mem::size_of_val(slice))
    };
    Ok(Bytes::copy_from_slice(raw))
}

fn copy_elements(value: &Bound<'_, PyAny>, name: &str) -> Result<Vec<Bytes>, String> {
    let items = value
        .call_method0("ravel")
        .and_then(|flat| flat.call_method0("tolist"))
        .map_err(|e| format!("cannot read the engine's BYTES output {name:?}: {e}"))?;
    let mut elements = Vec::new();
    for item in items
        .try_iter()
        .map_err(|e| format!("cannot read the engine's BYTES output {name:?}: {e}"))?
    {
        let item = item.map_err(|e| format!("the engine's BYTES output {name:?}: {e}"))?;
        elements.push(element_bytes(&item).ok_or_else(|| {
            format!("the engine's BYTES output {name:?} holds an element that is not bytes or str")
        })?);
    }
    Ok(elements)
}

fn element_bytes(item: &Bound<'_, PyAny>) -> Option<Bytes> {
    if let Ok(bytes) = item.cast::<PyBytes>() {
        return Some(Bytes::copy_from_slice(bytes.as_bytes()));
    }
    let text = item.cast::<PyString>().ok()?.to_str().ok()?;
    Some(Bytes::copy_from_slice(text.as_bytes()))
}

fn numpy_call<'py>(
    py: Python<'py>,
    function: &str,
    argument: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    py.import("numpy")?.call_method1(function, (argument,))
}
