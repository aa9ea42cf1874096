//! Triton's system shared-memory extension: regions a client registers by name (a POSIX
//! shared-memory object's key, an offset into it and a byte size), each mapped once at
//! registration; inputs are read from a region and outputs written into one.
//!
//! The object is opened with `shm_open` (libc: the system's own name rules, the same call
//! Triton and tritonclient make) and mapped with memmap2's `MmapRaw` (a mapping that hands
//! out no references, for memory another process writes, and that unmaps itself on drop,
//! with any offset, not only page-aligned ones). The object's descriptor is kept so that
//! every use first checks the object still holds the mapped range: one a client shrank
//! would fault on access (SIGBUS), so it is refused instead. Only a client shrinking it
//! between that check and the copy can still fault, as in Triton.
//!
//! A region is held by an `Arc`: an input read from it is a view that keeps it mapped, and
//! an output's place holds it until written, so unregistering a region in use takes it out
//! of the registry at once and unmaps it when its last request is done.
//!
//! The registry is the transports' one: HTTP's routes (`http::shm`) and gRPC's
//! SystemSharedMemoryStatus/Register/Unregister RPCs (`grpc::shm`) call the same
//! [`Regions`] methods. Infer requests of both meet it in `http::infer` (inputs' views,
//! outputs' places), the path gRPC's decoded requests share.
//!
//! The client owns the memory's contents: it must not change an input, nor read an output,
//! while its request is in flight (the extension's contract).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};
use serde::Serialize;

use dataplane_core::codec::binary;
use dataplane_core::error::ApiError;
use dataplane_core::request::SharedMemoryRef;
use dataplane_core::tensor::{DataType, Tensor, TensorData};

use crate::model::quoted;
use crate::state::lock;

/// One registered region: `byte_size` bytes of the object `key` from `offset`, mapped.
pub struct Region {
    name: String,
    key: String,
    offset: usize,
    byte_size: usize,
    /// The object, to check its size before each use.
    object: File,
    map: MmapRaw,
}

/// A region as the status answers list it (Triton's fields).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RegionStatus {
    /// The name it was registered by.
    pub name: String,
    /// The shared-memory object's key (`/input` is `/dev/shm/input`).
    pub key: String,
    /// Where in the object the region starts, in bytes.
    pub offset: usize,
    /// The region's size in bytes.
    pub byte_size: usize,
}

impl Region {
    /// Opens the object `key` and maps `byte_size` bytes of it from `offset`.
    pub fn open(
        name: &str,
        key: &str,
        offset: usize,
        byte_size: usize,
    ) -> Result<Region, ApiError> {
        let object = open_object(key)?;
        let size = object_size(&object, key)?;
        check_registration(name, key, size, offset, byte_size)?;
        let map = MmapOptions::new()
            .offset(offset as u64)
            .len(byte_size)
            .map_raw(&object)
            .map_err(|e| {
                ApiError::invalid(format!(
                    "failed to register shared memory region {}: {e}",
                    quoted(name)
                ))
            })?;
        Ok(Region {
            name: name.to_string(),
            key: key.to_string(),
            offset,
            byte_size,
            object,
            map,
        })
    }

    /// The region's name, key, offset and size.
    pub fn status(&self) -> RegionStatus {
        RegionStatus {
            name: self.name.clone(),
            key: self.key.clone(),
            offset: self.offset,
            byte_size: self.byte_size,
        }
    }

    /// `byte_size` bytes from `offset` (within the region) as a view that keeps the region
    /// mapped while it lives: no copy (the next one is into the batch's buffers).
    pub fn view(self: &Arc<Self>, offset: usize, byte_size: usize) -> Result<Bytes, ApiError> {
        check_bounds(&self.name, self.byte_size, offset, byte_size)?;
        self.check_backed()?;
        Ok(Bytes::from_owner(View {
            region: self.clone(),
            start: offset,
            len: byte_size,
        }))
    }

    /// Writes `data` at `offset` (within the region).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), ApiError> {
        check_bounds(&self.name, self.byte_size, offset, data.len())?;
        self.check_backed()?;
        // SAFETY: offset + data.len() is within the mapping (checked above), which lives as
        // long as `self`; `data` is the server's own memory, never the mapping itself.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.map.as_mut_ptr().add(offset),
                data.len(),
            );
        }
        Ok(())
    }

    /// A 400 when the object no longer holds the mapped range (a client shrank it):
    /// touching the missing pages would fault.
    fn check_backed(&self) -> Result<(), ApiError> {
        let size = object_size(&self.object, &self.key)?;
        if size < (self.offset as u64).saturating_add(self.byte_size as u64) {
            return Err(ApiError::invalid(format!(
                "shared memory region {}: its object {} is now {size} bytes, short of the \
                 registered offset {} + byte size {}",
                quoted(&self.name),
                quoted(&self.key),
                self.offset,
                self.byte_size
            )));
        }
        Ok(())
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.status().fmt(f)
    }
}

/// Bytes of a region, keeping it mapped.
struct View {
    region: Arc<Region>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: start + len is within the mapping (checked when the view was made),
        // which lives as long as `region`. The bytes may be changed by the client, which
        // the extension's contract forbids while the request is in flight.
        unsafe { std::slice::from_raw_parts(self.region.map.as_ptr().add(self.start), self.len) }
    }
}

/// The registered regions by name.
#[derive(Default)]
pub struct Regions(Mutex<BTreeMap<String, Arc<Region>>>);

impl Regions {
    /// Registers `name`: opens and maps its object (AlreadyExists when the name is taken,
    /// a 400 when the object cannot be opened or is too small); logged.
    pub fn register(
        &self,
        name: &str,
        key: &str,
        offset: usize,
        byte_size: usize,
    ) -> Result<(), ApiError> {
        let mut regions = lock(&self.0);
        if regions.contains_key(name) {
            return Err(ApiError::AlreadyExists(format!(
                "shared memory region {} already in manager",
                quoted(name)
            )));
        }
        let region = Region::open(name, key, offset, byte_size)?;
        regions.insert(name.to_string(), Arc::new(region));
        // The log takes the GIL (pyo3-log): never with a lock held that a thread holding
        // the GIL may wait for.
        drop(regions);
        log::info!(
            "Registered system shared memory region name={name} key={key} offset={offset} byte_size={byte_size}"
        );
        Ok(())
    }

    /// Unregisters `name` (none of that name is no error, as in Triton); requests using it
    /// keep it mapped until they are done.
    pub fn unregister(&self, name: &str) {
        lock(&self.0).remove(name);
    }

    /// Unregisters every region.
    pub fn unregister_all(&self) {
        lock(&self.0).clear();
    }

    /// The region `name`, for a request to use (a 400 when none is registered).
    pub fn get(&self, name: &str) -> Result<Arc<Region>, ApiError> {
        lock(&self.0).get(name).cloned().ok_or_else(|| {
            ApiError::invalid(format!(
                "Unable to find shared memory region: {}",
                quoted(name)
            ))
        })
    }

    /// Every region's status (by name), or the one of `name` (a 404 when none is).
    pub fn status(&self, name: Option<&str>) -> Result<Vec<RegionStatus>, ApiError> {
        let regions = lock(&self.0);
        match name {
            None => Ok(regions.values().map(|r| r.status()).collect()),
            Some(name) => regions.get(name).map(|r| vec![r.status()]).ok_or_else(|| {
                ApiError::NotFound(format!(
                    "Unable to find system shared memory region: {}",
                    quoted(name)
                ))
            }),
        }
    }
}

impl Regions {
    /// An input's data from its place in a region, checked against its declared datatype
    /// and shape as a binary input's is (BYTES: length-prefixed elements); `what` names it.
    pub fn input_data(
        &self,
        what: &str,
        datatype: DataType,
        shape: &[usize],
        place: &SharedMemoryRef,
    ) -> Result<TensorData, ApiError> {
        let region = self.get(&place.region)?;
        let chunk = region.view(place.offset, place.byte_size)?;
        let count = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .unwrap_or(usize::MAX);
        binary::tensor_data(chunk, datatype, shape, count, what, true)
    }

    /// Where an output asked for in shared memory goes: its region, held (mapped) until
    /// the output is written, and its place checked to lie within it.
    pub fn output_place(&self, place: SharedMemoryRef) -> Result<OutputPlace, ApiError> {
        let region = self.get(&place.region)?;
        check_bounds(
            &region.name,
            region.byte_size,
            place.offset,
            place.byte_size,
        )?;
        Ok(OutputPlace { region, place })
    }
}

/// An output's place in a region, resolved when its request came.
pub struct OutputPlace {
    region: Arc<Region>,
    place: SharedMemoryRef,
}

impl OutputPlace {
    /// Writes `tensor` there (BYTES: length-prefixed elements); the answer's parameters
    /// name the region, the offset and the bytes written. A 400 when it does not fit.
    pub fn write(&self, tensor: &Tensor) -> Result<SharedMemoryRef, ApiError> {
        let data = binary::tensor_part(tensor);
        if data.len() > self.place.byte_size {
            return Err(ApiError::invalid(format!(
                "shared memory size specified with the request for output {} ({} bytes) \
                 should be at least {} bytes to hold the results",
                quoted(&tensor.name),
                self.place.byte_size,
                data.len()
            )));
        }
        self.region.write(self.place.offset, &data)?;
        Ok(SharedMemoryRef {
            byte_size: data.len(),
            ..self.place.clone()
        })
    }
}

/// A 400 unless the object's `size` bytes hold `byte_size` (> 0) bytes from `offset`.
pub fn check_registration(
    name: &str,
    key: &str,
    size: u64,
    offset: usize,
    byte_size: usize,
) -> Result<(), ApiError> {
    let refusal = |why: String| {
        ApiError::invalid(format!(
            "failed to register shared memory region {}: invalid args ({why})",
            quoted(name)
        ))
    };
    if byte_size == 0 {
        return Err(refusal("byte_size must be more than 0".into()));
    }
    let end = (offset as u64).checked_add(byte_size as u64);
    if end.is_none_or(|end| end > size) {
        return Err(refusal(format!(
            "offset {offset} + byte_size {byte_size} is past the end of {}, {size} bytes",
            quoted(key)
        )));
    }
    Ok(())
}

/// A 400 unless `byte_size` bytes from `offset` lie within a region of `region_size`
/// bytes (Triton's words, and the numbers).
pub fn check_bounds(
    name: &str,
    region_size: usize,
    offset: usize,
    byte_size: usize,
) -> Result<(), ApiError> {
    if offset
        .checked_add(byte_size)
        .is_none_or(|end| end > region_size)
    {
        return Err(ApiError::invalid(format!(
            "Invalid offset + byte size for shared memory region: {} (offset {offset} + byte \
             size {byte_size} is past its {region_size} bytes)",
            quoted(name)
        )));
    }
    Ok(())
}

/// A 400 unless `key` names a shared-memory object and no path: one name after an
/// optional leading slash, as POSIX's portable form is.
pub fn check_key(key: &str) -> Result<(), ApiError> {
    let bare = key.strip_prefix('/').unwrap_or(key);
    if bare.is_empty() || bare.contains(['/', '\0']) || bare == "." || bare == ".." {
        return Err(ApiError::invalid(format!(
            "Unable to open shared memory region: {} (a key is one name, optionally after a \
             leading '/')",
            quoted(key)
        )));
    }
    Ok(())
}

fn open_object(key: &str) -> Result<File, ApiError> {
    check_key(key)?;
    let c_key = CString::new(key).map_err(|_| ApiError::Internal)?;
    // SAFETY: a valid C string; the descriptor returned is ours alone.
    let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_RDWR, 0) };
    if fd < 0 {
        return Err(ApiError::invalid(format!(
            "Unable to open shared memory region: {} ({})",
            quoted(key),
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `fd` is open and owned by nothing else; the File closes it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn object_size(object: &File, key: &str) -> Result<u64, ApiError> {
    object.metadata().map(|m| m.len()).map_err(|e| {
        ApiError::invalid(format!(
            "Invalid shared memory region: {} ({e})",
            quoted(key)
        ))
    })
}

#[cfg(test)]
pub(crate) mod tests;
