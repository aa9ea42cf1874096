//! The metrics: the contract's listing against `runtime/exported_series.py`'s tables and the
//! contract, the exposition's format, the API the Python side pushes through, and the
//! counts a real server exports over HTTP on 127.0.0.1 (a Rust engine that doubles FP32).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use dataplane_core::batching::BatchShape;
use dataplane_core::batching::adaptive::BatchSetting;
use dataplane_core::batching::assembly::output_rows_mismatch;
use dataplane_core::batching::config::BatchingConfig;
use dataplane_core::error::ApiError;
use dataplane_core::tensor::{DataType, Tensor, TensorData, TensorSpec};

use super::contract::{self, Kind, names};
use super::*;
use crate::engine::{Engine, InputBuffer, RunError, Slot};
use crate::{Server, ServerOptions};

// ---- the exposition, parsed ---------------------------------------------------------------

/// Samples by name and labels (sorted), as a scraper keys them.
type Samples = BTreeMap<(String, Vec<(String, String)>), f64>;

fn parse_exposition(text: &str) -> Samples {
    let mut samples = Samples::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
            None => (series, Vec::new()),
        };
        let value = if value == "+Inf" {
            f64::INFINITY
        } else {
            value.parse().unwrap()
        };
        samples.insert((name.to_string(), labels), value);
    }
    samples
}

fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = text
        .split("\",")
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once("=\"").expect("a label pair");
            (key.to_string(), value.trim_end_matches('"').to_string())
        })
        .collect();
    labels.sort();
    labels
}

/// The value of `name` with the model's labels and `extra` ones (None: no such series).
fn sample(samples: &Samples, name: &str, extra: &[(&str, &str)]) -> Option<f64> {
    let mut labels: Vec<(String, String)> = [("model", "double"), ("version", "1")]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    samples.get(&(name.to_string(), labels)).copied()
}

fn batching(policy: &str) -> BatchingConfig {
    serde_json::from_value(json!({
        "policy": policy,
        "maxBatchSize": 8,
        "maxQueueDelayMicroseconds": 20000,
        "preferredBatchSizes": [],
        "executionSlots": 2,
        "maxQueueSize": 64,
        "defaultTimeoutMilliseconds": 5000,
        "shapeBatching": "EqualShapes",
        "shapeBuckets": [],
        "sloMarginPercent": 10,
        "sloP99LatencyMilliseconds": 50.0,
        "priorityLevels": 1,
        "defaultPriorityLevel": 1
    }))
    .expect("the batching config parses")
}

fn rendered(metrics: &Metrics) -> Samples {
    parse_exposition(&metrics.render(&Snapshot::default()))
}

// ---- the contract -------------------------------------------------------------------------

/// The repository's file at `path` (from its root).
fn repository_file(path: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The rows of the markdown tables in `kubeinfer/runtime/exported_series.py`'s docstring: name,
/// type (its first word) and the third column.
fn python_table_rows() -> Vec<(String, String, String)> {
    repository_file("runtime/exported_series.py")
        .lines()
        .filter(|line| line.starts_with("| kubeinfer_"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let kind = cells[1].split_whitespace().next().unwrap_or("").to_string();
            (cells[0].to_string(), kind, cells[2].to_string())
        })
        .collect()
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
        Kind::Histogram => "histogram",
    }
}

#[test]
fn the_listing_holds_every_series_of_the_python_runtimes_tables_with_its_type_and_labels() {
    let listing = contract::series();
    let rows = python_table_rows();
    assert_eq!(
        rows.len(),
        37,
        "the two tables of runtime/exported_series.py"
    );
    assert_eq!(listing.len(), rows.len(), "one listed series per table row");
    for (name, kind, third) in rows {
        let family = name.trim_end_matches("_total");
        let spec = listing
            .iter()
            .find(|s| s.name == family)
            .unwrap_or_else(|| panic!("{name} is not listed"));
        assert_eq!(kind_name(spec.kind), kind, "{name}");
        assert_eq!(
            name.ends_with("_total"),
            spec.kind == Kind::Counter,
            "{name}"
        );
        if family.starts_with("kubeinfer_shadow_") {
            assert_eq!(spec.labels[..5], contract_shadow_labels(), "{name}");
        } else {
            let labels: Vec<&str> = third.split(',').map(str::trim).collect();
            assert_eq!(spec.labels, labels, "{name}");
        }
    }
}

fn contract_shadow_labels() -> [&'static str; 5] {
    [
        "model",
        "serving_version",
        "candidate_version",
        "candidate_digest",
        "role",
    ]
}

#[test]
fn the_checked_in_listing_is_what_the_python_contract_generates() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/metrics/contract_tsv.py");
    let output = std::process::Command::new("python3")
        .arg(&script)
        .output()
        .expect("python3 runs the contract's generator");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let generated = String::from_utf8(output.stdout).unwrap();
    let checked_in = repository_file("runtime/native/crates/server/src/metrics/contract.tsv");
    assert_eq!(
        generated.trim_end(),
        checked_in.trim_end(),
        "contract.tsv is stale: regenerate it with contract_tsv.py"
    );
}

#[test]
fn every_name_the_server_uses_is_a_contract_series_of_the_kind_it_is_used_as() {
    let listing = contract::series();
    let kind_of = |name: &str| listing.iter().find(|s| s.name == name).map(|s| s.kind);
    let gauges = [
        names::QUEUE_DEPTH,
        names::INFLIGHT_BATCHES,
        names::INFLIGHT_REQUESTS,
        names::REQUESTS_IN_PROGRESS,
        names::ENGINE_STUCK_BATCHES,
        names::SLO_P99_LATENCY,
        names::BATCHING_QUEUE_DELAY,
        names::BATCHING_PREFERRED_BATCH_SIZE,
        names::BATCHING_CONCURRENT_BATCHES,
        names::ENGINE_BUFFER_BYTES,
    ];
    let histograms = [
        names::REQUEST_DURATION,
        names::QUEUE_DURATION,
        names::COMPUTE_DURATION,
        names::BATCH_SIZE,
    ];
    let counters = [
        names::REQUESTS,
        names::REQUESTS_CANCELLED,
        names::BATCH_OUTPUT_ROW_MISMATCHES,
    ];
    for (names, kind) in [
        (&gauges[..], Kind::Gauge),
        (&histograms[..], Kind::Histogram),
        (&counters[..], Kind::Counter),
    ] {
        for name in names {
            assert_eq!(kind_of(name), Some(kind), "{name}");
        }
    }
}

/// The series a server makes (at 0) as it starts, without an SLO: a scrape before any
/// request shows them.
const MADE_AT_START: [&str; 11] = [
    "kubeinfer_queue_depth",
    "kubeinfer_inflight_batches",
    "kubeinfer_inflight_requests",
    "kubeinfer_requests_in_progress",
    "kubeinfer_request_duration_seconds",
    "kubeinfer_queue_duration_seconds",
    "kubeinfer_compute_duration_seconds",
    "kubeinfer_batch_size",
    "kubeinfer_engine_stuck_batches",
    "kubeinfer_batch_output_row_mismatches",
    "kubeinfer_engine_buffer_bytes",
];

#[test]
fn the_series_python_makes_at_start_are_exported_with_their_help_and_type() {
    let mut config = batching("Static");
    config.slo_p99_latency_milliseconds = None;
    let metrics = Metrics::new("double", "1", &config);
    let text = metrics.render(&Snapshot::default());
    // A family without a series prints nothing (prometheus_client prints its HELP alone).
    let exported: Vec<SeriesSpec> = contract::series()
        .into_iter()
        .filter(|spec| text.contains(&format!("# TYPE {} ", spec.name)))
        .collect();
    let names: Vec<&str> = exported.iter().map(|spec| spec.name).collect();
    assert_eq!(names, MADE_AT_START);
    for spec in exported {
        let help = format!("# HELP {} {}\n", spec.name, spec.help);
        let kind = format!("# TYPE {} {}\n", spec.name, kind_name(spec.kind));
        assert!(text.contains(&help), "{help}");
        assert!(text.contains(&kind), "{kind}");
    }
    let samples = parse_exposition(&text);
    let mismatches = "kubeinfer_batch_output_row_mismatches_total";
    assert_eq!(sample(&samples, mismatches, &[]), Some(0.0));
    assert!(text.ends_with("# EOF\n"));
}

/// Python's `repr` of a float, as its exposition writes a bucket's `le` in the serving
/// histograms' range (no exponent there).
fn python_repr(bound: f64) -> String {
    let text = format!("{bound}");
    if text.contains('.') {
        text
    } else {
        format!("{text}.0")
    }
}

#[test]
fn the_serving_histograms_buckets_print_their_le_as_python_does() {
    let metrics = Metrics::new("double", "1", &batching("Static"));
    let samples = rendered(&metrics);
    for spec in contract::series() {
        if spec.kind != Kind::Histogram || spec.name.starts_with("kubeinfer_shadow_") {
            continue;
        }
        let bucket = format!("{}_bucket", spec.name);
        for bound in spec.buckets.iter().map(|&b| python_repr(b)) {
            let found = sample(&samples, &bucket, &[("le", &bound)]);
            assert_eq!(found, Some(0.0), "{bucket} le={bound}");
        }
        assert_eq!(sample(&samples, &bucket, &[("le", "+Inf")]), Some(0.0));
    }
    let batch_size = &contract::series()[7];
    assert_eq!(batch_size.name, "kubeinfer_batch_size");
    assert_eq!(batch_size.buckets[..3], [1.0, 2.0, 4.0]);
}

#[test]
fn a_histogram_pushed_from_python_counts_into_its_contract_buckets() {
    let metrics = Metrics::new("double", "1", &batching("Static"));
    let labels = [
        ("serving_version", "1"),
        ("candidate_version", "2"),
        ("candidate_digest", "sha256:ab"),
        ("role", "shadow"),
    ];
    metrics
        .observe("kubeinfer_shadow_abs_difference", &labels, 3e-6)
        .unwrap();
    let text = metrics.render(&Snapshot::default());
    let line = text
        .lines()
        .find(|l| l.starts_with("kubeinfer_shadow_abs_difference_bucket") && l.ends_with(" 1"))
        .expect("a bucket holds it");
    let le: f64 = line
        .split("le=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(le, 5e-6, "the first bound at or above 3e-6");
}

// ---- the API for values pushed from outside ------------------------------------------------

#[test]
fn known_answer_series_set_from_outside_take_the_served_models_labels() {
    let metrics = Metrics::new("double", "1", &batching("Static"));
    metrics
        .add_counter(
            "kubeinfer_known_answer_checks",
            &[("result", "passed")],
            1.0,
        )
        .unwrap();
    metrics
        .set_gauge("kubeinfer_known_answers_failing", &[], 0.0)
        .unwrap();
    metrics
        .set_gauge(
            "kubeinfer_known_answer_error_ratio",
            &[("output", "y")],
            0.25,
        )
        .unwrap();
    let samples = rendered(&metrics);
    let checks = "kubeinfer_known_answer_checks_total";
    assert_eq!(sample(&samples, checks, &[("result", "passed")]), Some(1.0));
    assert_eq!(
        sample(&samples, "kubeinfer_known_answers_failing", &[]),
        Some(0.0)
    );
    let ratio = "kubeinfer_known_answer_error_ratio";
    assert_eq!(sample(&samples, ratio, &[("output", "y")]), Some(0.25));
}

#[test]
fn values_pushed_for_unknown_series_labels_or_kinds_are_refused() {
    let metrics = Metrics::new("double", "1", &batching("Static"));
    let unknown = metrics.set_gauge("kubeinfer_no_such", &[], 1.0);
    assert!(unknown.unwrap_err().contains("no series"));
    let label = metrics.set_gauge("kubeinfer_known_answers_failing", &[("x", "1")], 1.0);
    assert!(label.unwrap_err().contains("has no label \"x\""));
    let missing = metrics.add_counter("kubeinfer_known_answer_checks", &[], 1.0);
    assert!(missing.unwrap_err().contains("needs label \"result\""));
    let kind = metrics.set_gauge("kubeinfer_requests", &[("code", "200")], 1.0);
    assert!(kind.unwrap_err().contains("is a counter, not a gauge"));
    let negative = metrics.add_counter("kubeinfer_known_answer_seconds", &[], -1.0);
    assert!(negative.is_err());
    assert!(
        !rendered(&metrics)
            .keys()
            .any(|(n, _)| n.contains("known_answer"))
    );
}

#[test]
fn a_mirror_series_removed_or_cleared_is_no_longer_exported() {
    let metrics = Metrics::new("double", "1", &batching("Static"));
    let target = |digest| {
        [
            ("serving_version", "1"),
            ("candidate_version", "2"),
            ("candidate_digest", digest),
            ("role", "shadow"),
        ]
    };
    let name = "kubeinfer_shadow_max_abs_difference";
    metrics.set_gauge(name, &target("a"), 0.5).unwrap();
    metrics.set_gauge(name, &target("b"), 0.7).unwrap();
    assert!(metrics.remove(name, &target("a")).unwrap());
    let count = |m: &Metrics| rendered(m).keys().filter(|(n, _)| n == name).count();
    assert_eq!(count(&metrics), 1);
    metrics.clear(name).unwrap();
    assert_eq!(count(&metrics), 0);
}

// ---- the hooks, without a server ----------------------------------------------------------

#[test]
fn only_a_batch_whose_outputs_missed_its_rows_counts_as_a_row_mismatch() {
    let metrics = Metrics::new("double", "1", &batching("Static"));
    let mismatch = output_rows_mismatch("double", "y", 4, 3);
    let engine = ApiError::EngineFailed("the engine failed on this request's batch: boom".into());
    metrics.batch_finished(None, Some(&engine));
    metrics.batch_finished(None, Some(&mismatch));
    metrics.batch_finished(Some(Duration::from_millis(5)), None);
    assert_eq!(metrics.output_row_mismatches(), 1);
    let samples = rendered(&metrics);
    let compute = "kubeinfer_compute_duration_seconds_count";
    assert_eq!(sample(&samples, compute, &[]), Some(3.0));
    let sum = sample(&samples, "kubeinfer_compute_duration_seconds_sum", &[]).unwrap();
    assert!(
        (sum - 0.005).abs() < 1e-9,
        "failed batches observe 0: {sum}"
    );
}

#[test]
fn adaptives_gauges_appear_once_its_setting_differs_from_the_configured_one() {
    let config = batching("Adaptive");
    let metrics = Metrics::new("double", "1", &config);
    let mut setting = BatchSetting::of_config(&config);
    let mut now = Snapshot {
        setting: Some(setting.clone()),
        ..Snapshot::default()
    };
    let delay = "kubeinfer_batching_queue_delay_seconds";
    assert_eq!(
        sample(&parse_exposition(&metrics.render(&now)), delay, &[]),
        None
    );
    setting.queue_delay_microseconds = 1500;
    setting.preferred_batch_size = 4;
    now.setting = Some(setting);
    let samples = parse_exposition(&metrics.render(&now));
    assert_eq!(sample(&samples, delay, &[]), Some(0.0015));
    let preferred = "kubeinfer_batching_preferred_batch_size";
    assert_eq!(sample(&samples, preferred, &[]), Some(4.0));
    let concurrent = "kubeinfer_batching_concurrent_batches";
    assert_eq!(sample(&samples, concurrent, &[]), Some(2.0), "every slot");
    assert_eq!(
        sample(&samples, "kubeinfer_slo_p99_latency_seconds", &[]),
        Some(0.05)
    );
}

#[test]
fn a_static_policy_without_an_slo_exports_neither_the_slo_nor_adaptives_gauges() {
    let mut config = batching("Static");
    config.slo_p99_latency_milliseconds = None;
    let metrics = Metrics::new("double", "1", &config);
    let now = Snapshot {
        setting: Some(BatchSetting::of_config(&config)),
        queued: 3,
        ..Snapshot::default()
    };
    let samples = parse_exposition(&metrics.render(&now));
    assert_eq!(
        sample(&samples, "kubeinfer_slo_p99_latency_seconds", &[]),
        None
    );
    let delay = "kubeinfer_batching_queue_delay_seconds";
    assert_eq!(sample(&samples, delay, &[]), None);
    assert_eq!(sample(&samples, "kubeinfer_queue_depth", &[]), Some(3.0));
    assert_eq!(
        sample(&samples, "kubeinfer_engine_buffer_bytes", &[]),
        Some(0.0)
    );
}

// ---- a real server over HTTP --------------------------------------------------------------

/// Doubles `x` (FP32, [-1, 2]) into `y` after `delay`; `short_rows` makes its output that
/// many rows short of the batch (issue 40); counts its runs.
struct Doubler {
    specs: [Vec<TensorSpec>; 2],
    runs: Arc<AtomicUsize>,
    short_rows: usize,
    delay: Duration,
}

struct DoublerSlot {
    runs: Arc<AtomicUsize>,
    short_rows: usize,
    delay: Duration,
}

fn spec(name: &str) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        datatype: DataType::F32,
        shape: vec![-1, 2],
        axis_names: vec![],
        min_item_shape: None,
        max_item_shape: None,
    }
}

impl Engine for Doubler {
    fn name(&self) -> &str {
        "double"
    }
    fn version(&self) -> &str {
        "1"
    }
    fn inputs(&self) -> &[TensorSpec] {
        &self.specs[0]
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.specs[1]
    }
    fn max_batch_size(&self) -> usize {
        8
    }
    fn create_slot(&self) -> Result<Box<dyn Slot>, String> {
        Ok(Box::new(DoublerSlot {
            runs: self.runs.clone(),
            short_rows: self.short_rows,
            delay: self.delay,
        }))
    }
}

impl Slot for DoublerSlot {
    fn run(
        &mut self,
        rows: usize,
        _shape: Option<&BatchShape>,
        fill: &mut dyn FnMut(&mut [InputBuffer<'_>]) -> Result<(), ApiError>,
    ) -> Result<Vec<Tensor>, RunError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let mut buffer = vec![0u8; rows * 8];
        fill(&mut [InputBuffer::Fixed(&mut buffer)]).map_err(RunError::Fill)?;
        std::thread::sleep(self.delay);
        let out_rows = rows - self.short_rows;
        let doubled: Vec<u8> = buffer[..out_rows * 8]
            .chunks_exact(4)
            .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * 2.0).to_le_bytes())
            .collect();
        Ok(vec![Tensor {
            name: "y".into(),
            datatype: DataType::F32,
            shape: vec![out_rows, 2],
            data: TensorData::Raw(Bytes::from(doubled)),
        }])
    }
}

fn options(extra: Value) -> ServerOptions {
    let mut options = json!({
        "host": "127.0.0.1",
        "httpPort": 0,
        "grpcPort": null,
        "batching": batching_json(),
        "maxRequestBytes": 4096,
        "headerReadTimeoutSeconds": 5.0,
        "bodyReadTimeoutSeconds": 1.0,
        "engineStuckLivenessSeconds": 30.0,
        "drainGracePeriodSeconds": 2.0
    });
    if let (Value::Object(options), Value::Object(extra)) = (&mut options, extra) {
        options.extend(extra);
    }
    serde_json::from_value(options).expect("the options parse")
}

fn batching_json() -> Value {
    json!({
        "policy": "Static",
        "maxBatchSize": 8,
        "maxQueueDelayMicroseconds": 2000,
        "preferredBatchSizes": [],
        "executionSlots": 1,
        "maxQueueSize": 64,
        "defaultTimeoutMilliseconds": 5000,
        "shapeBatching": "EqualShapes",
        "shapeBuckets": [],
        "sloMarginPercent": 10,
        "sloP99LatencyMilliseconds": null,
        "priorityLevels": 1,
        "defaultPriorityLevel": 1
    })
}

fn serve(short_rows: usize, delay: Duration, extra: Value) -> (Server, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = Doubler {
        specs: [vec![spec("x")], vec![spec("y")]],
        runs: runs.clone(),
        short_rows,
        delay,
    };
    let server = Server::start(options(extra), Arc::new(engine)).expect("the server starts");
    (server, runs)
}

fn client() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// What came back: status, headers (lowercase names), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Writes a request (`Connection: close`) and reads the whole answer.
async fn call(port: u16, method: &str, path: &str, body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .expect("answered in time")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.lines();
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

fn infer_body(rows: &[[f32; 2]]) -> Vec<u8> {
    let data: Vec<f32> = rows.iter().flatten().copied().collect();
    serde_json::to_vec(&json!({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [rows.len(), 2], "data": data}]
    }))
    .unwrap()
}

async fn infer(port: u16, rows: Vec<[f32; 2]>) -> Answer {
    call(port, "POST", "/v2/models/double/infer", &infer_body(&rows)).await
}

async fn scrape(port: u16) -> Samples {
    let answer = call(port, "GET", "/metrics", b"").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-type"), Some(CONTENT_TYPE));
    parse_exposition(&answer.body)
}

#[test]
fn requests_are_counted_by_code_and_batches_by_size_over_http() {
    let (server, runs) = serve(0, Duration::ZERO, json!({}));
    let port = server.http_port();
    let samples = client().block_on(async {
        for rows in [vec![[1.0, 2.0]], vec![[1.0, 2.0]; 2], vec![[3.0, 4.0]; 3]] {
            assert_eq!(infer(port, rows).await.status, 200);
        }
        let bad = call(port, "POST", "/v2/models/double/infer", b"{not json").await;
        assert_eq!(bad.status, 400);
        let one = infer_body(&[[1.0, 1.0]]);
        let other = call(port, "POST", "/v2/models/other/infer", &one).await;
        assert_eq!(other.status, 404);
        scrape(port).await
    });
    let requests = "kubeinfer_requests_total";
    assert_eq!(sample(&samples, requests, &[("code", "200")]), Some(3.0));
    assert_eq!(sample(&samples, requests, &[("code", "400")]), Some(1.0));
    assert_eq!(sample(&samples, requests, &[("code", "404")]), Some(1.0));
    let durations = "kubeinfer_request_duration_seconds_count";
    assert_eq!(sample(&samples, durations, &[]), Some(5.0));
    let batches = runs.load(Ordering::SeqCst) as f64;
    assert_eq!(
        sample(&samples, "kubeinfer_batch_size_count", &[]),
        Some(batches)
    );
    assert_eq!(sample(&samples, "kubeinfer_batch_size_sum", &[]), Some(6.0));
    let compute = "kubeinfer_compute_duration_seconds_count";
    assert_eq!(sample(&samples, compute, &[]), Some(batches));
    let queued = "kubeinfer_queue_duration_seconds_count";
    assert_eq!(
        sample(&samples, queued, &[]),
        Some(3.0),
        "one per request run"
    );
    let in_progress = "kubeinfer_requests_in_progress";
    assert_eq!(sample(&samples, in_progress, &[]), Some(0.0));
    assert_eq!(sample(&samples, "kubeinfer_queue_depth", &[]), Some(0.0));
    server.shutdown();
}

/// Scrapes until `series` (the model's, no other labels) reads `value` (2 s at most:
/// a loaded machine's scheduling must not fail the test), and returns that scrape.
async fn scrape_until(port: u16, series: &str, value: f64) -> Samples {
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let samples = scrape(port).await;
        if sample(&samples, series, &[]) == Some(value) || tokio::time::Instant::now() > until {
            return samples;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn a_request_is_in_progress_and_its_batch_in_flight_until_answered() {
    let (server, _) = serve(0, Duration::from_millis(600), json!({}));
    let port = server.http_port();
    client().block_on(async {
        let running = tokio::spawn(infer(port, vec![[1.0, 1.0]; 2]));
        scrape_until(port, "kubeinfer_inflight_batches", 1.0).await;
        let queued = tokio::spawn(infer(port, vec![[2.0, 2.0]]));
        let during = scrape_until(port, "kubeinfer_queue_depth", 1.0).await;
        assert_eq!(sample(&during, "kubeinfer_queue_depth", &[]), Some(1.0));
        assert_eq!(
            sample(&during, "kubeinfer_requests_in_progress", &[]),
            Some(2.0)
        );
        assert_eq!(
            sample(&during, "kubeinfer_inflight_batches", &[]),
            Some(1.0)
        );
        assert_eq!(
            sample(&during, "kubeinfer_inflight_requests", &[]),
            Some(1.0)
        );
        assert_eq!(running.await.unwrap().status, 200);
        assert_eq!(queued.await.unwrap().status, 200);
        let after = scrape(port).await;
        assert_eq!(
            sample(&after, "kubeinfer_requests_in_progress", &[]),
            Some(0.0)
        );
        assert_eq!(sample(&after, "kubeinfer_inflight_batches", &[]), Some(0.0));
        assert_eq!(
            sample(&after, "kubeinfer_inflight_requests", &[]),
            Some(0.0)
        );
    });
    server.shutdown();
}

/// Sends an infer request, waits `before_leaving`, and closes the connection unanswered.
async fn leave_after(port: u16, before_leaving: Duration) {
    let body = infer_body(&[[2.0, 2.0]]);
    let head = format!(
        "POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body).await.unwrap();
    tokio::time::sleep(before_leaving).await;
    drop(stream);
}

#[test]
fn a_client_that_leaves_is_counted_cancelled_at_its_stage_and_never_answered() {
    let (server, _) = serve(0, Duration::from_millis(500), json!({}));
    let port = server.http_port();
    let in_progress = "kubeinfer_requests_in_progress";
    let samples = client().block_on(async {
        // Alone: it runs at once, and its client leaves while it is on the slot.
        let alone = tokio::spawn(leave_after(port, Duration::from_millis(300)));
        scrape_until(port, "kubeinfer_inflight_batches", 1.0).await;
        alone.await.unwrap();
        scrape_until(port, "kubeinfer_inflight_batches", 0.0).await;
        // Behind a running one: its client leaves while it is queued.
        let first = tokio::spawn(infer(port, vec![[1.0, 1.0]]));
        scrape_until(port, "kubeinfer_inflight_batches", 1.0).await;
        leave_after(port, Duration::from_millis(100)).await;
        assert_eq!(first.await.unwrap().status, 200);
        scrape_until(port, in_progress, 0.0).await
    });
    let cancelled = "kubeinfer_requests_cancelled_total";
    assert_eq!(
        sample(&samples, cancelled, &[("stage", "running")]),
        Some(1.0)
    );
    assert_eq!(
        sample(&samples, cancelled, &[("stage", "waiting")]),
        Some(1.0)
    );
    let requests = "kubeinfer_requests_total";
    assert_eq!(sample(&samples, requests, &[("code", "200")]), Some(1.0));
    let durations = "kubeinfer_request_duration_seconds_count";
    assert_eq!(
        sample(&samples, durations, &[]),
        Some(1.0),
        "only the answered"
    );
    assert_eq!(sample(&samples, in_progress, &[]), Some(0.0));
    server.shutdown();
}

#[test]
fn a_refused_request_is_answered_503_but_never_in_progress() {
    let (server, _) = serve(0, Duration::ZERO, json!({"startReady": false}));
    let port = server.http_port();
    let samples = client().block_on(async {
        assert_eq!(infer(port, vec![[1.0, 1.0]]).await.status, 503);
        scrape(port).await
    });
    let requests = "kubeinfer_requests_total";
    assert_eq!(sample(&samples, requests, &[("code", "503")]), Some(1.0));
    let in_progress = "kubeinfer_requests_in_progress";
    assert_eq!(sample(&samples, in_progress, &[]), Some(0.0));
    server.shutdown();
}

#[test]
fn an_infer_answers_server_timing_as_its_duration_is_observed() {
    let (server, _) = serve(0, Duration::from_millis(20), json!({}));
    let port = server.http_port();
    let (answer, samples) = client().block_on(async {
        let answer = infer(port, vec![[1.0, 1.0]]).await;
        (answer, scrape(port).await)
    });
    let timing = answer
        .header("server-timing")
        .expect("a Server-Timing header");
    let millis: f64 = timing
        .strip_prefix("infer;dur=")
        .expect("the infer metric")
        .parse()
        .unwrap();
    assert_eq!(timing.split('.').nth(1).map(str::len), Some(3), "{timing}");
    let observed = sample(&samples, "kubeinfer_request_duration_seconds_sum", &[]).unwrap();
    assert!(millis >= 20.0, "{timing}");
    assert!(
        (observed * 1000.0 - millis).abs() < 0.001,
        "{observed} s, {timing}"
    );
    server.shutdown();
}

#[test]
fn outputs_that_miss_the_batchs_rows_are_counted_in_metrics_and_v2_batching() {
    let extra = json!({
        "configuredMaxBatchSize": 16,
        "batchingProbe": {"batches": true, "reason": "rows run together matched"}
    });
    let (server, _) = serve(1, Duration::ZERO, extra);
    let port = server.http_port();
    let (samples, status) = client().block_on(async {
        assert_eq!(infer(port, vec![[1.0, 1.0]; 2]).await.status, 500);
        let status = call(port, "GET", "/v2/batching", b"").await;
        (scrape(port).await, status)
    });
    let mismatches = "kubeinfer_batch_output_row_mismatches_total";
    assert_eq!(sample(&samples, mismatches, &[]), Some(1.0));
    let requests = "kubeinfer_requests_total";
    assert_eq!(sample(&samples, requests, &[("code", "500")]), Some(1.0));
    assert_eq!(status.status, 200);
    let body: Value = serde_json::from_str(&status.body).unwrap();
    assert_eq!(body["outputRowMismatches"], json!(1));
    assert_eq!(body["configuredMaxBatchSize"], json!(16));
    assert_eq!(body["modelBatches"], json!(true));
    assert_eq!(
        body["modelBatchesReason"],
        json!("rows run together matched")
    );
    assert_eq!(body["policy"], json!("Static"));
    assert_eq!(body["maxBatchSize"], json!(8));
    server.shutdown();
}

#[test]
fn v2_batching_without_a_probe_names_the_configured_size_and_no_model_batches() {
    let (server, _) = serve(0, Duration::ZERO, json!({}));
    let port = server.http_port();
    let status = client().block_on(call(port, "GET", "/v2/batching", b""));
    let body: Value = serde_json::from_str(&status.body).unwrap();
    assert_eq!(body["configuredMaxBatchSize"], json!(8));
    assert_eq!(body["outputRowMismatches"], json!(0));
    assert!(body.get("modelBatches").is_none(), "{body}");
    server.shutdown();
}

#[test]
fn values_pushed_through_the_server_are_scraped_over_http() {
    let (server, _) = serve(0, Duration::ZERO, json!({}));
    let port = server.http_port();
    server
        .metrics()
        .set_gauge("kubeinfer_engine_buffer_bytes", &[], 4096.0)
        .unwrap();
    let samples = client().block_on(scrape(port));
    let buffers = "kubeinfer_engine_buffer_bytes";
    assert_eq!(sample(&samples, buffers, &[]), Some(4096.0));
    server.shutdown();
}

#[test]
fn an_abandoned_upload_is_counted_cancelled_while_reading_and_never_answered() {
    let (server, runs) = serve(0, Duration::ZERO, json!({}));
    let port = server.http_port();
    let samples = client().block_on(async {
        let head =
            "POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n";
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(b"{\"inputs\": [").await.unwrap();
        scrape_until(port, "kubeinfer_requests_in_progress", 1.0).await;
        drop(stream);
        scrape_until(port, "kubeinfer_requests_in_progress", 0.0).await
    });
    let cancelled = "kubeinfer_requests_cancelled_total";
    assert_eq!(
        sample(&samples, cancelled, &[("stage", "reading")]),
        Some(1.0)
    );
    let durations = "kubeinfer_request_duration_seconds_count";
    assert_eq!(
        sample(&samples, durations, &[]),
        Some(0.0),
        "never answered"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    server.shutdown();
}

#[test]
fn a_scrape_hook_sets_the_gpu_gauges_as_each_scrape_reads_them() {
    let metrics = Metrics::new("double", "1", &batching("Static"));
    let reads = Arc::new(AtomicUsize::new(0));
    let seen = reads.clone();
    metrics.on_scrape(move |metrics| {
        let used = (seen.fetch_add(1, Ordering::SeqCst) + 1) as f64 * 1e9;
        let device = [("device", "0"), ("name", "NVIDIA H100")];
        metrics
            .set_gauge("kubeinfer_gpu_memory_used_bytes", &device, used)
            .unwrap();
    });
    let used = |samples: &Samples| {
        let key = (
            "kubeinfer_gpu_memory_used_bytes".to_string(),
            vec![
                ("device".to_string(), "0".to_string()),
                ("name".to_string(), "NVIDIA H100".to_string()),
            ],
        );
        samples.get(&key).copied()
    };
    assert_eq!(used(&rendered(&metrics)), Some(1e9));
    assert_eq!(
        used(&rendered(&metrics)),
        Some(2e9),
        "read again at each scrape"
    );
}

#[test]
fn the_slots_buffer_bytes_are_exported_from_the_start() {
    let (server, _) = serve(0, Duration::ZERO, json!({}));
    let samples = client().block_on(scrape(server.http_port()));
    // One slot: 8 rows of x and of y, 2 FP32 each.
    let buffers = "kubeinfer_engine_buffer_bytes";
    assert_eq!(sample(&samples, buffers, &[]), Some((8 * 2 * 4 * 2) as f64));
    server.shutdown();
}
