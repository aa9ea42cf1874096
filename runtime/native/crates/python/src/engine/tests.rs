//! The Python engine's slots run through the server's `Slot` contract, on engines written
//! in Python for the tests (`fake_engine.py`). The embedded interpreter needs numpy: run
//! with `PYTHONPATH` naming the venv's site-packages (`make native-test` does).

use std::ffi::CString;
use std::sync::Mutex;

use bytes::Bytes;
use dataplane_server::dataplane_core::error::ApiError;
use dataplane_server::dataplane_core::tensor::{DataType, TensorData};
use dataplane_server::engine::{Engine, InputBuffer, RunError};
use pyo3::prelude::*;
use pyo3::types::PyModule;

use super::{PyEngine, gil_crossings};

/// The tests count GIL crossings on one global counter: one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn fake_engines(py: Python<'_>) -> Bound<'_, PyModule> {
    let code = CString::new(include_str!("fake_engine.py")).unwrap();
    PyModule::from_code(py, &code, c"fake_engine.py", c"fake_engine")
        .unwrap_or_else(|e| panic!("cannot load fake_engine.py ({e}): is numpy on PYTHONPATH?"))
}

/// A `PyEngine` over `fake_engine.<class_name>(**kwargs)`, and the Python engine itself.
fn engine(class_name: &str, kwargs: &str) -> (PyEngine, Py<PyAny>) {
    Python::initialize();
    Python::attach(|py| {
        let module = fake_engines(py);
        let make = CString::new(format!("{class_name}({kwargs})")).unwrap();
        let python_engine = py
            .eval(&make, Some(&module.dict()), None)
            .expect("the fake engine is made");
        let engine = PyEngine::new(&python_engine, "m".into(), "1".into()).unwrap();
        (engine, python_engine.unbind())
    })
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Writes x's rows and pushes s's elements, as the server's assembly would.
fn fill_two_rows(buffers: &mut [InputBuffer<'_>]) -> Result<(), ApiError> {
    match buffers {
        [InputBuffer::Fixed(x), InputBuffer::Elements(s)] => {
            x.copy_from_slice(&f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
            s.extend([Bytes::from_static(b"ab"), Bytes::from_static(b"c\0d")]);
            Ok(())
        }
        _ => panic!("the buffers are x (fixed) then s (elements)"),
    }
}

fn python_eval<T: for<'py> pyo3::conversion::FromPyObjectOwned<'py>>(
    engine: &Py<PyAny>,
    expression: &str,
) -> T {
    Python::attach(|py| {
        let locals = pyo3::types::PyDict::new(py);
        locals.set_item("engine", engine.bind(py)).unwrap();
        let expression = CString::new(expression).unwrap();
        py.eval(&expression, None, Some(&locals))
            .unwrap()
            .extract::<T>()
            .map_err(|e| Into::<PyErr>::into(e).to_string())
            .unwrap()
    })
}

#[test]
fn the_engine_is_described_by_its_python_specs() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let (engine, _) = engine("ShapedEngine", "");
    assert_eq!(engine.max_batch_size(), 4);
    let ids = &engine.inputs()[0];
    assert_eq!((ids.name.as_str(), ids.datatype), ("ids", DataType::I64));
    assert_eq!(ids.shape, vec![-1, -1]);
    assert_eq!(ids.axis_names, vec![Some("sequence".to_string())]);
    assert_eq!(ids.min_item_shape, Some(vec![1]));
    assert_eq!(engine.outputs()[0].max_item_shape, Some(vec![8]));
    assert_eq!(engine.outputs()[0].min_item_shape, None);
}

#[test]
fn the_platform_is_the_engines_own_or_its_class_name() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let (named, _) = engine("Engine", "platform='onnxruntime_onnx'");
    assert_eq!(named.platform(), "onnxruntime_onnx");
    let (unnamed, _) = engine("ShapedEngine", "");
    assert_eq!(unnamed.platform(), "ShapedEngine");
}

#[test]
fn a_batch_is_written_into_the_slots_buffers_and_its_outputs_copied_out_in_one_crossing() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let (engine, python_engine) = engine("Engine", "");
    let mut slot = engine.create_slot().unwrap();
    let before = gil_crossings();
    let outputs = slot.run(2, None, &mut fill_two_rows).unwrap();
    assert_eq!(
        gil_crossings() - before,
        1,
        "one GIL crossing for the batch"
    );

    let written: Vec<f32> = python_eval(&python_engine, "engine.slots[0].x[:2].ravel().tolist()");
    assert_eq!(
        written,
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        "rows went into the slot's buffer"
    );
    let stored: Vec<Vec<u8>> = python_eval(&python_engine, "list(engine.slots[0].s[:2])");
    assert_eq!(stored, vec![b"ab".to_vec(), b"c\0d".to_vec()]);

    let (y, t) = (&outputs[0], &outputs[1]);
    assert_eq!(
        (y.name.as_str(), y.datatype, y.shape.clone()),
        ("y", DataType::F32, vec![2, 3])
    );
    let doubled = f32_bytes(&[2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
    assert_eq!(y.data, TensorData::Raw(Bytes::from(doubled)));
    assert_eq!((t.datatype, t.shape.clone()), (DataType::Bytes, vec![2]));
    let upper = vec![Bytes::from_static(b"AB"), Bytes::from_static(b"C\0D")];
    assert_eq!(t.data, TensorData::Strings(upper));
}

#[test]
fn a_model_with_variable_axes_is_told_the_batchs_shape() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let (engine, python_engine) = engine("ShapedEngine", "");
    let mut slot = engine.create_slot().unwrap();
    let shape = vec![vec![3]];
    let outputs = slot
        .run(2, Some(&shape), &mut |buffers| {
            let [InputBuffer::Fixed(ids)] = buffers else {
                panic!("one fixed input")
            };
            assert_eq!(ids.len(), 2 * 3 * 8, "two rows of three INT64s");
            let values: Vec<u8> = (1..=6i64).flat_map(|v| v.to_le_bytes()).collect();
            ids.copy_from_slice(&values);
            Ok(())
        })
        .unwrap();
    let runs: Vec<(usize, Vec<Vec<usize>>)> = python_eval(&python_engine, "engine.slots[0].runs");
    assert_eq!(runs, vec![(2, vec![vec![3]])]);
    assert_eq!(outputs[0].shape, vec![2, 3]);
    let plus_one: Vec<u8> = (2..=7i64).flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(outputs[0].data, TensorData::Raw(Bytes::from(plus_one)));
}

#[test]
fn views_that_rows_cannot_be_written_into_as_they_are_laid_out_are_refused() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    for (layout, problem) in [
        ("strided", "is not C-contiguous"),
        ("fortran", "is not C-contiguous"),
        ("float64", "is not of the input's datatype"),
    ] {
        let (engine, python_engine) = engine("Engine", &format!("layout={layout:?}"));
        let mut slot = engine.create_slot().unwrap();
        let mut filled = false;
        let result = slot.run(2, None, &mut |_| {
            filled = true;
            Ok(())
        });
        let Err(RunError::Engine(message)) = result else {
            panic!("{layout}: refused as the engine's failure")
        };
        assert!(
            message.contains("input \"x\"") && message.contains(problem),
            "{message}"
        );
        assert!(!filled, "{layout}: nothing is written");
        let runs: usize = python_eval(&python_engine, "len(engine.slots[0].runs)");
        assert_eq!(runs, 0, "{layout}: the engine does not run");
    }
}

#[test]
fn the_engines_exception_is_the_batchs_failure_in_its_own_words() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let (engine, _) = engine("Engine", "fail=True");
    let mut slot = engine.create_slot().unwrap();
    match slot.run(2, None, &mut fill_two_rows) {
        Err(RunError::Engine(message)) => assert_eq!(message, "the model broke on purpose"),
        other => panic!("expected the engine's failure, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_refused_packing_is_answered_as_it_says_and_the_engine_does_not_run() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let (engine, python_engine) = engine("Engine", "");
    let mut slot = engine.create_slot().unwrap();
    let refused = ApiError::invalid("input \"x\" does not fit");
    let result = slot.run(2, None, &mut |_| Err(refused.clone()));
    match result {
        Err(RunError::Fill(error)) => assert_eq!(error, refused),
        other => panic!(
            "expected the packing's refusal, got {:?}",
            other.map(|_| ())
        ),
    }
    let runs: usize = python_eval(&python_engine, "len(engine.slots[0].runs)");
    assert_eq!(runs, 0);
}

#[test]
fn a_batchs_mirrored_requests_are_handed_to_python_in_the_batchs_one_crossing() {
    use dataplane_server::mirror::{Mirror, MirroredBatch, MirroredRequest};

    let _one = ONE_AT_A_TIME.lock().unwrap();
    let (engine, _) = engine("Engine", "");
    let mut slot = engine.create_slot().unwrap();
    let handed: Py<PyAny> = Python::attach(|py| py.eval(c"[]", None, None).unwrap().unbind());
    let hand_over = Python::attach(|py| {
        // As globals: a lambda's body looks its names up there, not in eval's locals.
        let globals = pyo3::types::PyDict::new(py);
        globals.set_item("handed", handed.bind(py)).unwrap();
        py.eval(c"lambda *batch: handed.append(batch)", Some(&globals), None)
            .unwrap()
            .unbind()
    });
    let mirror = crate::mirror::PyMirror::new(hand_over);
    let before = gil_crossings();
    slot.run_then(2, None, &mut fill_two_rows, &mut |outputs| {
        let outputs = outputs.unwrap();
        mirror.hand_over(MirroredBatch {
            roles: vec!["shadow".into()],
            answered: 2,
            requests: vec![MirroredRequest {
                inputs: vec![],
                outputs,
                server_seconds: 0.5,
                slice_value: Some("night".into()),
                roles: vec![0],
            }],
        });
    });
    assert_eq!(
        gil_crossings() - before,
        1,
        "the hand-over is in the batch's crossing"
    );
    let (answered, roles, y_shape, t, slice): (
        usize,
        Vec<String>,
        Vec<usize>,
        Vec<Vec<u8>>,
        String,
    ) = Python::attach(|py| {
        let locals = pyo3::types::PyDict::new(py);
        locals.set_item("handed", handed.bind(py)).unwrap();
        py.eval(
                c"(lambda b: (b[0], list(b[1]), list(b[2][0][1][0][2]), b[2][0][1][1][3], b[2][0][3]))(handed[0])",
                None,
                Some(&locals),
            )
            .unwrap()
            .extract()
            .unwrap()
    });
    assert_eq!((answered, roles), (2, vec!["shadow".to_string()]));
    assert_eq!(y_shape, vec![2, 3]);
    assert_eq!(t, vec![b"AB".to_vec(), b"C\0D".to_vec()]);
    assert_eq!(slice, "night");
}
