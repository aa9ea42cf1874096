//! Regions over real POSIX shared-memory objects (made here with `shm_open`, removed with
//! `shm_unlink` when a test ends).

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;

use super::*;

/// A shared-memory object of its own name, unlinked on drop.
pub struct ShmObject {
    pub key: String,
    file: File,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl ShmObject {
    /// A new object holding `contents`.
    pub fn with(contents: &[u8]) -> ShmObject {
        let key = format!(
            "/kubeinfer-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let c_key = CString::new(key.clone()).unwrap();
        let fd = unsafe {
            libc::shm_open(
                c_key.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        assert!(fd >= 0, "shm_open: {}", std::io::Error::last_os_error());
        let mut file = unsafe { File::from_raw_fd(fd) };
        file.write_all(contents).unwrap();
        ShmObject { key, file }
    }

    /// The object's bytes now.
    pub fn contents(&self) -> Vec<u8> {
        std::fs::read(format!("/dev/shm{}", self.key)).unwrap()
    }

    /// Cuts the object to `len` bytes (as a careless client might).
    pub fn truncate(&self, len: u64) {
        self.file.set_len(len).unwrap();
    }
}

impl Drop for ShmObject {
    fn drop(&mut self) {
        let c_key = CString::new(self.key.clone()).unwrap();
        unsafe { libc::shm_unlink(c_key.as_ptr()) };
    }
}

fn counting(len: usize) -> Vec<u8> {
    (0..len).map(|i| i as u8).collect()
}

fn message(result: Result<impl std::fmt::Debug, ApiError>) -> (u16, String) {
    let error = result.expect_err("refused");
    (error.status(), error.message().to_string())
}

#[test]
fn a_registered_region_reads_and_writes_its_object_from_its_offset() {
    let object = ShmObject::with(&counting(64));
    let regions = Regions::default();
    regions.register("r", &object.key, 16, 32).unwrap();
    let region = regions.get("r").unwrap();
    assert_eq!(
        region.view(4, 8).unwrap(),
        Bytes::from(counting(64)[20..28].to_vec())
    );
    region.write(0, &[0xAA; 4]).unwrap();
    let contents = object.contents();
    assert_eq!(&contents[16..20], &[0xAA; 4]);
    assert_eq!(&contents[20..24], &[20, 21, 22, 23]);
    assert_eq!(
        regions.status(None).unwrap(),
        vec![RegionStatus {
            name: "r".into(),
            key: object.key.clone(),
            offset: 16,
            byte_size: 32
        }]
    );
}

#[test]
fn a_view_keeps_its_region_mapped_after_it_is_unregistered() {
    let object = ShmObject::with(&counting(16));
    let regions = Regions::default();
    regions.register("r", &object.key, 0, 16).unwrap();
    let view = regions.get("r").unwrap().view(8, 8).unwrap();
    regions.unregister("r");
    assert_eq!(
        message(regions.get("r")),
        (400, "Unable to find shared memory region: 'r'".into())
    );
    assert_eq!(view, Bytes::from(counting(16)[8..16].to_vec()));
    assert!(regions.status(None).unwrap().is_empty());
}

#[test]
fn a_region_past_the_end_of_its_object_or_of_no_bytes_is_not_registered() {
    let object = ShmObject::with(&counting(64));
    let regions = Regions::default();
    let (status, text) = message(regions.register("r", &object.key, 60, 8));
    assert_eq!(status, 400);
    assert_eq!(
        text,
        format!(
            "failed to register shared memory region 'r': invalid args (offset 60 + byte_size \
             8 is past the end of '{}', 64 bytes)",
            object.key
        )
    );
    let (_, text) = message(regions.register("r", &object.key, 0, 0));
    assert!(text.ends_with("(byte_size must be more than 0)"), "{text}");
    let (_, text) = message(regions.register("r", &object.key, usize::MAX, 2));
    assert!(text.contains("invalid args"), "{text}");
    assert!(regions.status(None).unwrap().is_empty());
}

#[test]
fn a_taken_name_is_refused_and_the_first_registration_stays() {
    let (first, second) = (ShmObject::with(&[1; 8]), ShmObject::with(&[2; 8]));
    let regions = Regions::default();
    regions.register("r", &first.key, 0, 8).unwrap();
    assert_eq!(
        message(regions.register("r", &second.key, 0, 8)),
        (400, "shared memory region 'r' already in manager".into())
    );
    assert_eq!(regions.status(Some("r")).unwrap()[0].key, first.key);
}

#[test]
fn an_object_that_does_not_exist_is_refused_naming_its_key() {
    let regions = Regions::default();
    let (status, text) = message(regions.register("r", "/kubeinfer-test-none", 0, 8));
    assert_eq!(status, 400);
    assert!(
        text.starts_with(
            "Unable to open shared memory region: '/kubeinfer-test-none' (No such file"
        ),
        "{text}"
    );
}

#[test]
fn a_key_that_is_a_path_is_refused_before_anything_is_opened() {
    for key in [
        "",
        "/",
        "..",
        "/..",
        "/dev/shm/x",
        "../etc/passwd",
        "a/b",
        "a\0b",
    ] {
        let (status, text) = message(check_key(key));
        assert_eq!(status, 400, "{key:?}");
        assert!(
            text.starts_with("Unable to open shared memory region"),
            "{text}"
        );
    }
    for key in ["/input", "input", "/kubeinfer.in-1"] {
        assert!(check_key(key).is_ok(), "{key}");
    }
}

#[test]
fn a_place_past_the_region_or_overflowing_is_refused_with_tritons_words() {
    assert!(check_bounds("r", 32, 24, 8).is_ok());
    assert!(check_bounds("r", 32, 32, 0).is_ok());
    assert_eq!(
        message(check_bounds("r", 32, 28, 8)),
        (
            400,
            "Invalid offset + byte size for shared memory region: 'r' (offset 28 + byte size 8 \
             is past its 32 bytes)"
                .into()
        )
    );
    assert!(check_bounds("r", 32, usize::MAX, 2).is_err());
}

#[test]
fn an_object_shrunk_after_registration_is_refused_rather_than_read() {
    let object = ShmObject::with(&counting(64));
    let regions = Regions::default();
    regions.register("r", &object.key, 32, 32).unwrap();
    object.truncate(40);
    let region = regions.get("r").unwrap();
    let (status, text) = message(region.view(0, 8));
    assert_eq!(status, 400);
    assert!(text.contains("is now 40 bytes"), "{text}");
    assert!(region.write(0, &[0; 8]).is_err());
}

#[test]
fn the_status_of_an_unknown_region_is_a_404_and_all_are_listed_by_name() {
    let object = ShmObject::with(&counting(8));
    let regions = Regions::default();
    regions.register("b", &object.key, 0, 8).unwrap();
    regions.register("a", &object.key, 4, 4).unwrap();
    let names: Vec<String> = regions
        .status(None)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(
        message(regions.status(Some("c"))),
        (
            404,
            "Unable to find system shared memory region: 'c'".into()
        )
    );
    regions.unregister_all();
    assert!(regions.status(None).unwrap().is_empty());
}

#[test]
fn an_output_is_written_at_its_place_or_refused_when_it_does_not_fit() {
    let object = ShmObject::with(&[0; 32]);
    let regions = Regions::default();
    regions.register("out", &object.key, 0, 32).unwrap();
    let place = |offset, byte_size| SharedMemoryRef {
        region: "out".into(),
        offset,
        byte_size,
    };
    let strings = Tensor {
        name: "s".into(),
        datatype: DataType::Bytes,
        shape: vec![2],
        data: TensorData::Strings(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"c")]),
    };
    let written = regions
        .output_place(place(4, 16))
        .unwrap()
        .write(&strings)
        .unwrap();
    assert_eq!(written, place(4, 11));
    assert_eq!(&object.contents()[4..15], b"\x02\0\0\0ab\x01\0\0\0c");
    assert_eq!(
        message(regions.output_place(place(4, 8)).unwrap().write(&strings)),
        (
            400,
            "shared memory size specified with the request for output 's' (8 bytes) should be \
             at least 11 bytes to hold the results"
                .into()
        )
    );
    assert!(regions.output_place(place(30, 4)).is_err());
    assert!(
        regions
            .output_place(SharedMemoryRef {
                region: "none".into(),
                ..place(0, 4)
            })
            .is_err()
    );
}

#[test]
fn a_bytes_input_is_read_as_length_prefixed_elements() {
    let object = ShmObject::with(b"\x02\0\0\0ab\x01\0\0\0c");
    let regions = Regions::default();
    regions.register("in", &object.key, 0, 11).unwrap();
    let place = SharedMemoryRef {
        region: "in".into(),
        offset: 0,
        byte_size: 11,
    };
    let data = regions
        .input_data("input 's'", DataType::Bytes, &[2], &place)
        .unwrap();
    assert_eq!(
        data,
        TensorData::Strings(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"c")])
    );
    let (status, _) = message(regions.input_data("input 's'", DataType::Bytes, &[3], &place));
    assert_eq!(status, 400);
}
