//! Tensors as the data plane holds them: the Open Inference Protocol's datatypes, a
//! model's tensor specs (from the Python engine, at start), and decoded tensors.
//!
//! A fixed-size tensor's data is its elements in row-major order as little-endian bytes,
//! the form of the binary tensor extension, gRPC's raw contents and the engines' buffers
//! alike (x86_64 and aarch64 are little-endian), so a binary request's tensor is a slice of
//! its body and is copied once, into the batch. A BYTES tensor is its elements, each any
//! bytes (never assumed UTF-8 except where a check says so).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// An Open Inference Protocol v2 datatype (the ones a served model can have).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DataType {
    #[serde(rename = "BOOL")]
    Bool,
    #[serde(rename = "UINT8")]
    U8,
    #[serde(rename = "UINT16")]
    U16,
    #[serde(rename = "UINT32")]
    U32,
    #[serde(rename = "UINT64")]
    U64,
    #[serde(rename = "INT8")]
    I8,
    #[serde(rename = "INT16")]
    I16,
    #[serde(rename = "INT32")]
    I32,
    #[serde(rename = "INT64")]
    I64,
    #[serde(rename = "FP16")]
    F16,
    #[serde(rename = "FP32")]
    F32,
    #[serde(rename = "FP64")]
    F64,
    #[serde(rename = "BYTES")]
    Bytes,
}

impl DataType {
    pub const ALL: [DataType; 13] = [
        DataType::Bool,
        DataType::U8,
        DataType::U16,
        DataType::U32,
        DataType::U64,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bytes,
    ];

    /// The protocol's name (`FP32`).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::U8 => "UINT8",
            DataType::U16 => "UINT16",
            DataType::U32 => "UINT32",
            DataType::U64 => "UINT64",
            DataType::I8 => "INT8",
            DataType::I16 => "INT16",
            DataType::I32 => "INT32",
            DataType::I64 => "INT64",
            DataType::F16 => "FP16",
            DataType::F32 => "FP32",
            DataType::F64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    pub fn from_name(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element; None for BYTES (elements of any length).
    pub fn item_size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::U8 | DataType::I8 => Some(1),
            DataType::U16 | DataType::I16 | DataType::F16 => Some(2),
            DataType::U32 | DataType::I32 | DataType::F32 => Some(4),
            DataType::U64 | DataType::I64 | DataType::F64 => Some(8),
            DataType::Bytes => None,
        }
    }
}

/// One input or output of the served model. `shape` has the batch axis first, as -1, and
/// -1 for every other variable axis; `axis_names` (one per axis after the batch one) holds
/// the model's name for each variable axis (None where fixed or unnamed); an input's
/// allowed extents are `min_item_shape..=max_item_shape` where a range is configured (None:
/// no range, any extent within the request limit, as exported), an output's largest where
/// the inputs tell it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    #[serde(default)]
    pub axis_names: Vec<Option<String>>,
    #[serde(default)]
    pub min_item_shape: Option<Vec<usize>>,
    #[serde(default)]
    pub max_item_shape: Option<Vec<usize>>,
}

impl TensorSpec {
    /// The shape of one batch item (the batch axis left out); -1 where variable.
    pub fn item_shape(&self) -> &[i64] {
        &self.shape[1..]
    }

    /// An axis besides the batch one is variable.
    pub fn variable(&self) -> bool {
        self.item_shape().iter().any(|&d| d < 0)
    }

    /// The largest item this tensor holds: its fixed item shape, or its range's maximum;
    /// None when unknown.
    pub fn largest_item_shape(&self) -> Option<Vec<usize>> {
        if !self.variable() {
            return Some(self.item_shape().iter().map(|&d| d as usize).collect());
        }
        self.max_item_shape.clone()
    }
}

/// A tensor's elements.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// Fixed-size elements, little-endian, row-major: `len() == count * item_size`.
    Raw(Bytes),
    /// BYTES elements, row-major.
    Strings(Vec<Bytes>),
}

impl TensorData {
    /// Bytes of tensor data held (a BYTES tensor's element bytes, without lengths).
    pub fn nbytes(&self) -> usize {
        match self {
            TensorData::Raw(raw) => raw.len(),
            TensorData::Strings(elements) => elements.iter().map(Bytes::len).sum(),
        }
    }
}

/// One decoded tensor: `data` holds exactly `shape`'s elements of `datatype`.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl Tensor {
    /// Rows along the batch (first) axis.
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }

    pub fn element_count(&self) -> usize {
        self.shape.iter().product()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_datatype_reads_back_by_its_name() {
        for datatype in DataType::ALL {
            assert_eq!(DataType::from_name(datatype.name()), Some(datatype));
            let json = serde_json::to_string(&datatype).unwrap();
            assert_eq!(json, format!("\"{}\"", datatype.name()));
        }
        assert_eq!(DataType::from_name("BF16"), None);
        assert_eq!(DataType::F16.item_size(), Some(2));
        assert_eq!(DataType::Bytes.item_size(), None);
    }

    #[test]
    fn a_spec_knows_its_largest_item() {
        let fixed = TensorSpec {
            name: "x".into(),
            datatype: DataType::F32,
            shape: vec![-1, 3, 4],
            axis_names: vec![],
            min_item_shape: None,
            max_item_shape: None,
        };
        assert_eq!(fixed.largest_item_shape(), Some(vec![3, 4]));
        let ranged = TensorSpec {
            shape: vec![-1, -1],
            axis_names: vec![Some("sequence".into())],
            min_item_shape: Some(vec![1]),
            max_item_shape: Some(vec![128]),
            ..fixed.clone()
        };
        assert!(ranged.variable());
        assert_eq!(ranged.largest_item_shape(), Some(vec![128]));
        let unranged = TensorSpec {
            max_item_shape: None,
            ..ranged
        };
        assert_eq!(unranged.largest_item_shape(), None);
    }
}
