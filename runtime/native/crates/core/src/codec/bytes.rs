//! BYTES tensors on the wire: Triton's binary form (each element a 4-byte little-endian
//! length and that many bytes) and the UTF-8 check of string inputs.
//!
//! A reader takes exactly the declared element count and refuses a length that runs past
//! its buffer or bytes left over, naming the tensor: a 400, never a short or padded tensor.
//! String inputs must be UTF-8 text (the models served hold strings as ONNX
//! `tensor(string)`, read as Python `str`): bytes that are not could only fail the whole
//! batch later. Answers need not be.

use bytes::Bytes;

use crate::error::ApiError;

const LENGTH: usize = 4;

/// The binary form of `elements`.
pub fn serialize(elements: &[Bytes]) -> Vec<u8> {
    let size = elements.iter().map(|e| LENGTH + e.len()).sum();
    let mut out = Vec::with_capacity(size);
    for element in elements {
        // An element is a slice of a body or an engine's answer: never 4 GiB.
        let length = u32::try_from(element.len()).expect("a BYTES element under 4 GiB");
        out.extend_from_slice(&length.to_le_bytes());
        out.extend_from_slice(element);
    }
    out
}

/// Exactly `count` elements read from the whole of `buffer` (views of it); `what` names the
/// tensor in the error.
pub fn deserialize(buffer: &Bytes, count: usize, what: &str) -> Result<Vec<Bytes>, ApiError> {
    let size = buffer.len();
    // Each element takes at least its length: a huge declared count meets a short buffer
    // before anything is allocated for it.
    let mut elements = Vec::with_capacity(count.min(size / LENGTH));
    let mut offset = 0;
    for index in 0..count {
        if size - offset < LENGTH {
            return Err(ApiError::invalid(format!(
                "{what}: BYTES data ends after {index} of {count} elements (each element is a \
                 4-byte little-endian length and that many bytes)"
            )));
        }
        let prefix: [u8; LENGTH] = buffer[offset..offset + LENGTH].try_into().expect("4 bytes");
        let length = u32::from_le_bytes(prefix) as usize;
        offset += LENGTH;
        if size - offset < length {
            return Err(ApiError::invalid(format!(
                "{what}: BYTES element {index} declares {length} bytes; only {} are left",
                size - offset
            )));
        }
        elements.push(buffer.slice(offset..offset + length));
        offset += length;
    }
    if offset != size {
        return Err(ApiError::invalid(format!(
            "{what}: {} bytes follow the {count} BYTES elements the shape declares",
            size - offset
        )));
    }
    Ok(elements)
}

/// Every element UTF-8 text, or a 400 naming the first that is not.
pub fn check_text(elements: &[Bytes], what: &str) -> Result<(), ApiError> {
    for (index, element) in elements.iter().enumerate() {
        if let Err(error) = std::str::from_utf8(element) {
            let at = error.valid_up_to();
            return Err(ApiError::invalid(format!(
                "{what}: BYTES element {index} is not UTF-8 text ({} at byte {at}); string \
                 inputs are UTF-8",
                utf8_reason(element, &error)
            )));
        }
    }
    Ok(())
}

/// Python's reason for the same error (`bytes.decode`'s words, which Python clients know).
fn utf8_reason(element: &[u8], error: &std::str::Utf8Error) -> &'static str {
    match error.error_len() {
        None => "unexpected end of data",
        Some(_) => match element[error.valid_up_to()] {
            0x80..=0xBF | 0xC0 | 0xC1 | 0xF5..=0xFF => "invalid start byte",
            _ => "invalid continuation byte",
        },
    }
}

#[cfg(test)]
mod tests;
