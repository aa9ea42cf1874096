//! Triton's binary tensor data extension: a body's JSON header and binary part, and raw
//! tensors read from and written to it.
//!
//! A binary tensor is a slice of the body (no copy: the next copy of its bytes is into the
//! batch); its declared `binary_data_size` is checked against what is left of the body and
//! against its shape before anything else is done with it.

use bytes::Bytes;

use crate::codec::{bytes as strings, repr};
use crate::error::ApiError;
use crate::tensor::{DataType, Tensor, TensorData};

/// The JSON header and the binary part after it (views of the body); `header_length` is
/// the Inference-Header-Content-Length header's value (None: the body is all JSON).
pub fn split_body(body: &Bytes, header_length: Option<usize>) -> Result<(Bytes, Bytes), ApiError> {
    let Some(length) = header_length else {
        return Ok((body.clone(), Bytes::new()));
    };
    if length > body.len() {
        return Err(ApiError::invalid(format!(
            "Inference-Header-Content-Length {length} is outside the body of {} bytes",
            body.len()
        )));
    }
    Ok((body.slice(..length), body.slice(length..)))
}

/// The binary part, handed out tensor by tensor in input order.
pub struct BinaryPart {
    binary: Bytes,
    offset: usize,
}

impl BinaryPart {
    /// The binary part, none of it taken yet.
    pub fn new(binary: Bytes) -> Self {
        BinaryPart { binary, offset: 0 }
    }

    /// The next `size` bytes, for the tensor `what`.
    pub fn take(&mut self, size: usize, what: &str) -> Result<Bytes, ApiError> {
        let left = self.binary.len() - self.offset;
        if size > left {
            return Err(ApiError::invalid(format!(
                "{what}: binary_data_size {size} runs past the end of the body ({left} binary \
                 bytes left)"
            )));
        }
        let chunk = self.binary.slice(self.offset..self.offset + size);
        self.offset += size;
        Ok(chunk)
    }

    /// A 400 when bytes are left that no tensor claims (`kind`: input or output).
    pub fn finish(self, kind: &str) -> Result<(), ApiError> {
        let left = self.binary.len() - self.offset;
        if left != 0 {
            return Err(ApiError::invalid(format!(
                "{left} bytes of binary data follow the header that no {kind} claims"
            )));
        }
        Ok(())
    }
}

/// A tensor's binary data (`chunk`, of its declared `binary_data_size`) checked against its
/// shape's `count` elements; `text`: BYTES elements must be UTF-8 (inputs).
pub fn tensor_data(
    chunk: Bytes,
    datatype: DataType,
    shape: &[usize],
    count: usize,
    what: &str,
    text: bool,
) -> Result<TensorData, ApiError> {
    let Some(item_size) = datatype.item_size() else {
        let elements = strings::deserialize(&chunk, count, what)?;
        if text {
            strings::check_text(&elements, what)?;
        }
        return Ok(TensorData::Strings(elements));
    };
    // The shape was checked to fit in memory's addresses, item size included.
    let expected = count * item_size;
    if chunk.len() != expected {
        return Err(ApiError::invalid(format!(
            "{what}: binary_data_size {} does not match shape {} of {} ({expected} bytes)",
            chunk.len(),
            repr::shape(shape),
            datatype.name()
        )));
    }
    Ok(TensorData::Raw(chunk))
}

/// A tensor's binary form: its raw bytes as they are (no copy), or a BYTES tensor's
/// length-prefixed elements.
pub fn tensor_part(tensor: &Tensor) -> Bytes {
    match &tensor.data {
        TensorData::Raw(raw) => raw.clone(),
        TensorData::Strings(elements) => Bytes::from(strings::serialize(elements)),
    }
}
