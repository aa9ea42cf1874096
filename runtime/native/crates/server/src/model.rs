//! The one model served: its name, version and tensors, and the JSON documents that
//! describe it (v2 metadata, Triton's model configuration).

use serde_json::{Value, json};

use dataplane_core::codec::DecodeLimits;
use dataplane_core::codec::json::model_json_value_limit;
use dataplane_core::error::ApiError;
use dataplane_core::tensor::{DataType, TensorSpec};

use crate::engine::Engine;

/// The server's name and version in `GET /v2` and gRPC's ServerMetadata (what clients and
/// the black-box tests read).
pub const SERVER_NAME: &str = "kubeinfer";
pub const SERVER_VERSION: &str = "0.1.0";
pub const EXTENSIONS: [&str; 2] = ["binary_tensor_data", "system_shared_memory"];

/// What the handlers need of the engine, read once at start.
pub struct Model {
    pub name: String,
    pub version: String,
    pub platform: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub max_batch_size: usize,
}

impl Model {
    pub fn of(engine: &dyn Engine, max_batch_size: usize) -> Model {
        Model {
            name: engine.name().to_string(),
            version: engine.version().to_string(),
            platform: engine.platform().to_string(),
            inputs: engine.inputs().to_vec(),
            outputs: engine.outputs().to_vec(),
            max_batch_size,
        }
    }

    /// A 404 unless the path names this model (and, when it names one, this version).
    pub fn check(&self, name: &str, version: Option<&str>) -> Result<(), ApiError> {
        if name != self.name {
            return Err(ApiError::NotFound(format!(
                "model {} is not served here",
                quoted(name)
            )));
        }
        match version {
            Some(version) if version != self.version => Err(ApiError::NotFound(format!(
                "model {} has no version {} (served: {})",
                quoted(name),
                quoted(version),
                quoted(&self.version)
            ))),
            _ => Ok(()),
        }
    }

    /// The index of the output of this name.
    pub fn output_index(&self, name: &str) -> Option<usize> {
        self.outputs.iter().position(|o| o.name == name)
    }

    /// What one request may make the decoder build: its largest input at maxBatchSize rows
    /// and the JSON values all inputs can hold (unbounded where a largest shape is unknown).
    pub fn decode_limits(&self) -> DecodeLimits {
        let largest: Option<Vec<Vec<usize>>> = self
            .inputs
            .iter()
            .map(TensorSpec::largest_item_shape)
            .collect();
        let Some(items) = largest else {
            return DecodeLimits::default();
        };
        let per_item = items.iter().map(|i| i.iter().product::<usize>()).max();
        let shapes: Vec<Option<Vec<usize>>> = items.into_iter().map(Some).collect();
        DecodeLimits {
            max_elements: Some(self.max_batch_size * per_item.unwrap_or(0)),
            max_json_values: model_json_value_limit(&shapes, self.max_batch_size),
        }
    }

    /// `GET /v2/models/{name}`.
    pub fn metadata(&self) -> Value {
        json!({
            "name": self.name,
            "versions": [self.version],
            "platform": self.platform,
            "inputs": tensor_metadata(&self.inputs),
            "outputs": tensor_metadata(&self.outputs),
            "parameters": {"max_batch_size": self.max_batch_size},
        })
    }

    /// `GET /v2/models/{name}/config`: Triton's model configuration, batched (a first axis
    /// of -1 everywhere and a max batch size) or not, as `protocol.model_config` says.
    pub fn config(&self) -> Value {
        let tensors = self.inputs.iter().chain(&self.outputs);
        let batched =
            self.max_batch_size > 0 && tensors.clone().all(|t| t.shape.first() == Some(&-1));
        let entry = |spec: &TensorSpec| {
            let dims = if batched {
                &spec.shape[1..]
            } else {
                &spec.shape[..]
            };
            json!({"name": spec.name, "data_type": config_type(spec.datatype), "dims": dims})
        };
        json!({
            "name": self.name,
            "platform": self.platform,
            "max_batch_size": if batched { self.max_batch_size } else { 0 },
            "input": self.inputs.iter().map(entry).collect::<Vec<_>>(),
            "output": self.outputs.iter().map(entry).collect::<Vec<_>>(),
        })
    }
}

/// `GET /v2`.
pub fn server_metadata() -> Value {
    json!({"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS})
}

fn tensor_metadata(specs: &[TensorSpec]) -> Vec<Value> {
    specs
        .iter()
        .map(|s| json!({"name": s.name, "datatype": s.datatype.name(), "shape": s.shape}))
        .collect()
}

/// Triton's configuration name of a datatype (BYTES is TYPE_STRING).
fn config_type(datatype: DataType) -> String {
    match datatype {
        DataType::Bytes => "TYPE_STRING".to_string(),
        other => format!("TYPE_{}", other.name()),
    }
}

/// A name as Python's `repr` writes it (the messages quote names as `{name!r}` does, and
/// Python clients and tests assert on them): in single quotes, or double ones when it holds
/// a single quote and no double one.
pub fn quoted(name: &str) -> String {
    if name.contains('\'') && !name.contains('"') {
        format!("\"{name}\"")
    } else {
        format!("'{}'", name.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}
