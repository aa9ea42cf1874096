//! Triton's system shared-memory extension over gRPC: the SystemSharedMemoryStatus,
//! Register and Unregister RPCs on the one registry HTTP's routes use ([`Regions`]), and the
//! places a ModelInfer request's tensors name with their parameters
//! (`shared_memory_region`, `shared_memory_byte_size`, `shared_memory_offset`, as
//! tritonclient's `set_shared_memory` sends them: a string and int64s).
//!
//! As Triton answers: an empty name is every region (status, unregister); unregistering a
//! name that is not registered is no error; the status of one that is not is NOT_FOUND; a
//! name registered twice is ALREADY_EXISTS; an object that cannot be opened, or that does
//! not hold the range, is INVALID_ARGUMENT, and so is a request naming a region that is
//! not registered.

use dataplane_core::codec::repr;
use dataplane_core::error::ApiError;
use dataplane_core::request::{
    InputSource, SHARED_MEMORY_BYTE_SIZE_PARAMETER, SHARED_MEMORY_OFFSET_PARAMETER,
    SHARED_MEMORY_REGION_PARAMETER, SharedMemoryRef,
};
use dataplane_core::tensor::DataType;

use super::inference::infer_parameter::ParameterChoice;
use super::inference::model_infer_request::InferInputTensor;
use super::inference::system_shared_memory_status_response::RegionStatus;
use super::inference::{
    InferParameter, SystemSharedMemoryRegisterRequest, SystemSharedMemoryStatusRequest,
    SystemSharedMemoryStatusResponse, SystemSharedMemoryUnregisterRequest,
};
use crate::shm::Regions;

type Parameters = std::collections::HashMap<String, InferParameter>;

/// The regions' status: every one (an empty name) or the one named (NOT_FOUND when none).
pub fn status(
    regions: &Regions,
    request: &SystemSharedMemoryStatusRequest,
) -> Result<SystemSharedMemoryStatusResponse, ApiError> {
    let name = Some(request.name.as_str()).filter(|n| !n.is_empty());
    let regions = regions.status(name)?;
    Ok(SystemSharedMemoryStatusResponse {
        regions: regions
            .into_iter()
            .map(|r| {
                let status = RegionStatus {
                    name: r.name.clone(),
                    key: r.key,
                    offset: r.offset as u64,
                    byte_size: r.byte_size as u64,
                };
                (r.name, status)
            })
            .collect(),
    })
}

/// Registers the region (opened and mapped now).
pub fn register(
    regions: &Regions,
    request: &SystemSharedMemoryRegisterRequest,
) -> Result<(), ApiError> {
    if request.name.is_empty() {
        return Err(ApiError::invalid(
            "failed to register shared memory region: a region's name must not be empty",
        ));
    }
    let size = |value: u64, field: &str| {
        usize::try_from(value).map_err(|_| {
            ApiError::invalid(format!(
                "failed to register shared memory region '{}': {field} {value} is past this \
                 machine's address space",
                request.name
            ))
        })
    };
    let (offset, byte_size) = (
        size(request.offset, "offset")?,
        size(request.byte_size, "byte_size")?,
    );
    regions.register(&request.name, &request.key, offset, byte_size)
}

/// Unregisters the region named, or every region (an empty name).
pub fn unregister(regions: &Regions, request: &SystemSharedMemoryUnregisterRequest) {
    if request.name.is_empty() {
        regions.unregister_all();
    } else {
        regions.unregister(&request.name);
    }
}

/// The shared-memory place a tensor's parameters name (None when they name no region);
/// `what` names the tensor in the refusals (`input 'x'`, `outputs[0]`).
pub fn place(parameters: &Parameters, what: &str) -> Result<Option<SharedMemoryRef>, ApiError> {
    let Some(region) = parameters.get(SHARED_MEMORY_REGION_PARAMETER) else {
        return Ok(None);
    };
    let Some(ParameterChoice::StringParam(region)) = &region.parameter_choice else {
        return Err(wrong_kind(
            what,
            SHARED_MEMORY_REGION_PARAMETER,
            "string_param",
        ));
    };
    let byte_size = match parameters.get(SHARED_MEMORY_BYTE_SIZE_PARAMETER) {
        Some(value) => natural(value, what, SHARED_MEMORY_BYTE_SIZE_PARAMETER)?,
        None => {
            return Err(ApiError::invalid(format!(
                "{what}: parameters.{SHARED_MEMORY_REGION_PARAMETER} needs \
                 parameters.{SHARED_MEMORY_BYTE_SIZE_PARAMETER}"
            )));
        }
    };
    let offset = match parameters.get(SHARED_MEMORY_OFFSET_PARAMETER) {
        Some(value) => natural(value, what, SHARED_MEMORY_OFFSET_PARAMETER)?,
        None => 0,
    };
    Ok(Some(SharedMemoryRef {
        region: region.clone(),
        offset,
        byte_size,
    }))
}

/// A shared-memory input's source, checked as the REST codec checks one: no contents of
/// its own, and a fixed-size datatype's byte size its shape's (a BYTES input's elements are
/// counted when its region is read).
pub fn input_source(
    tensor: &InferInputTensor,
    datatype: DataType,
    shape: &[usize],
    place: SharedMemoryRef,
) -> Result<InputSource, ApiError> {
    let what = format!("input {}", repr::string(&tensor.name));
    if tensor.contents.is_some() {
        return Err(ApiError::invalid(format!(
            "{what}: {SHARED_MEMORY_REGION_PARAMETER} cannot be combined with contents"
        )));
    }
    if let Some(item_size) = datatype.item_size() {
        let bytes = (shape.iter())
            .try_fold(item_size, |n, &d| n.checked_mul(d))
            .filter(|&bytes| bytes == place.byte_size);
        if bytes.is_none() {
            return Err(ApiError::invalid(format!(
                "{what}: {SHARED_MEMORY_BYTE_SIZE_PARAMETER} {} does not match shape {} of {} \
                 ({} bytes)",
                place.byte_size,
                repr::shape(shape),
                datatype.name(),
                repr::product(shape, item_size)
            )));
        }
    }
    Ok(InputSource::SharedMemory(place))
}

/// An output's place in shared memory as its parameters in the answer (the offset only
/// when it is not 0, as the REST answer has them).
pub fn output_parameters(place: &SharedMemoryRef) -> Parameters {
    let int = |n: usize| InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(
            i64::try_from(n).unwrap_or(i64::MAX),
        )),
    };
    let mut parameters = Parameters::new();
    parameters.insert(
        SHARED_MEMORY_REGION_PARAMETER.into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::StringParam(place.region.clone())),
        },
    );
    parameters.insert(
        SHARED_MEMORY_BYTE_SIZE_PARAMETER.into(),
        int(place.byte_size),
    );
    if place.offset != 0 {
        parameters.insert(SHARED_MEMORY_OFFSET_PARAMETER.into(), int(place.offset));
    }
    parameters
}

/// An int64 (or uint64) parameter >= 0 that fits in `usize`.
fn natural(value: &InferParameter, what: &str, name: &str) -> Result<usize, ApiError> {
    let number = match value.parameter_choice {
        Some(ParameterChoice::Int64Param(n)) => u64::try_from(n).ok(),
        Some(ParameterChoice::Uint64Param(n)) => Some(n),
        _ => return Err(wrong_kind(what, name, "int64_param")),
    };
    number
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| ApiError::invalid(format!("{what}: parameters.{name} must be >= 0")))
}

fn wrong_kind(what: &str, name: &str, kind: &str) -> ApiError {
    ApiError::invalid(format!("{what}: parameters.{name} must be given as {kind}"))
}

#[cfg(test)]
mod tests;
