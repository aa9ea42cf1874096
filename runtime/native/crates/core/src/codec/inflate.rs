//! Compressed request bodies (gzip, deflate), inflated with a bound.
//!
//! Inflation goes in parts of [`PART_BYTES`] and stops as soon as the inflated size passes
//! the limit (a gzip bomb costs the limit, not its inflated size), or as soon as the JSON
//! inflated so far holds more values than the model can take (a small body of millions of
//! empty lists stops after its first part, whatever the byte limit).

use std::io::Read;

use flate2::bufread::GzDecoder;
use flate2::{Decompress, FlushDecompress, Status};

use crate::codec::json::json_value_count;
use crate::error::ApiError;

/// Bytes inflated at a time, between the checks of the bounds.
pub const PART_BYTES: usize = 256 * 1024;

/// A body's Content-Encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentEncoding {
    /// `gzip` (or `x-gzip`).
    Gzip,
    /// `deflate`: a zlib stream, as HTTP defines it.
    Deflate,
}

impl ContentEncoding {
    /// From the header's value: None for identity; a 400 for one not supported.
    pub fn from_header(value: &str) -> Result<Option<ContentEncoding>, ApiError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "identity" => Ok(None),
            "gzip" | "x-gzip" => Ok(Some(ContentEncoding::Gzip)),
            "deflate" => Ok(Some(ContentEncoding::Deflate)),
            other => Err(ApiError::invalid(format!(
                "Content-Encoding {} is not supported (gzip, deflate or identity)",
                crate::codec::repr::string(other)
            ))),
        }
    }

    /// The header's name for it.
    pub fn name(self) -> &'static str {
        match self {
            ContentEncoding::Gzip => "gzip",
            ContentEncoding::Deflate => "deflate",
        }
    }
}

/// `body` inflated, never past `limit` bytes (413 as soon as it would be) nor past
/// `max_json_values` values in its JSON (its first `json_bytes` bytes, or all of it).
pub fn inflate(
    body: &[u8],
    encoding: ContentEncoding,
    limit: usize,
    max_json_values: Option<usize>,
    json_bytes: Option<usize>,
) -> Result<Vec<u8>, ApiError> {
    let mut input = body;
    let mut bound = Bound {
        limit,
        max_json_values,
        json_bytes,
        size: 0,
        values: 0,
    };
    let mut out = Vec::new();
    match encoding {
        ContentEncoding::Gzip => {
            let mut decoder = GzDecoder::new(&mut input);
            read_parts(&mut decoder, &mut out, &mut bound, encoding)?;
        }
        ContentEncoding::Deflate => {
            let consumed = inflate_zlib(body, &mut out, &mut bound)?;
            input = &body[consumed..];
        }
    }
    if !input.is_empty() {
        return Err(truncated(encoding));
    }
    Ok(out)
}

/// What has been inflated so far, against the bounds.
struct Bound {
    limit: usize,
    max_json_values: Option<usize>,
    json_bytes: Option<usize>,
    size: usize,
    values: usize,
}

impl Bound {
    fn admit(&mut self, part: &[u8]) -> Result<(), ApiError> {
        if part.len() > self.limit - self.size {
            return Err(ApiError::over_request_limit(format!(
                "the request body inflates past the limit of {} bytes",
                self.limit
            )));
        }
        if let Some(max) = self.max_json_values {
            let json = match self.json_bytes {
                Some(bytes) => &part[..bytes.saturating_sub(self.size).min(part.len())],
                None => part,
            };
            self.values += json_value_count(json) - 1;
            if self.values > max {
                return Err(ApiError::TooLarge(format!(
                    "the request body inflates to more JSON values than this model's inputs \
                     can take ({max}); it was not parsed"
                )));
            }
        }
        self.size += part.len();
        Ok(())
    }
}

fn read_parts(
    decoder: &mut impl Read,
    out: &mut Vec<u8>,
    bound: &mut Bound,
    encoding: ContentEncoding,
) -> Result<(), ApiError> {
    let mut part = vec![0; PART_BYTES];
    loop {
        let filled = fill(decoder, &mut part).map_err(|error| corrupt(encoding, &error))?;
        if filled == 0 {
            return Ok(());
        }
        bound.admit(&part[..filled])?;
        out.extend_from_slice(&part[..filled]);
    }
}

/// Reads until `part` is full or the stream ends.
fn fill(decoder: &mut impl Read, part: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < part.len() {
        match decoder.read(&mut part[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// A zlib stream inflated by hand: flate2's reader takes a stream cut short for a clean
/// end, the decompressor itself says whether it reached the stream's end. Returns the
/// bytes of `body` the stream took.
fn inflate_zlib(body: &[u8], out: &mut Vec<u8>, bound: &mut Bound) -> Result<usize, ApiError> {
    let mut inflater = Decompress::new(true);
    let mut part = Vec::with_capacity(PART_BYTES);
    loop {
        part.clear();
        let taken = inflater.total_in() as usize;
        let status = inflater
            .decompress_vec(&body[taken..], &mut part, FlushDecompress::None)
            .map_err(|error| {
                ApiError::invalid(format!("the deflate request body is corrupt: {error}"))
            })?;
        bound.admit(&part)?;
        out.extend_from_slice(&part);
        match status {
            Status::StreamEnd => return Ok(inflater.total_in() as usize),
            // No progress with all the input given: the stream stops before its end.
            _ if part.is_empty() && inflater.total_in() as usize == taken => {
                return Err(truncated(ContentEncoding::Deflate));
            }
            _ => {}
        }
    }
}

fn corrupt(encoding: ContentEncoding, error: &std::io::Error) -> ApiError {
    if error.kind() == std::io::ErrorKind::UnexpectedEof {
        return truncated(encoding);
    }
    ApiError::invalid(format!(
        "the {} request body is corrupt: {error}",
        encoding.name()
    ))
}

fn truncated(encoding: ContentEncoding) -> ApiError {
    ApiError::invalid(format!(
        "the {} request body is truncated or has trailing data",
        encoding.name()
    ))
}

#[cfg(test)]
mod tests;
