"""The runtime's Prometheus metrics: names, labels and units of every series, a registry
per app (two apps in one process do not collide), and the GPU memory gauges read through
`GpuMemoryReader` at scrape time: present with NVML (a stand-in NVML module, as no GPU is
here), absent without it, and a failing read never fails the scrape."""

from __future__ import annotations

from types import SimpleNamespace

from kubeinfer.runtime.gpu_memory import GpuMemoryReader
from kubeinfer.runtime.metrics import RuntimeMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families


def samples(metrics: RuntimeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def fake_nvml(used: int, total: int, fail: bool = False) -> SimpleNamespace:
    def memory_info(handle):
        if fail:
            raise RuntimeError("NVML: GPU is lost")
        return SimpleNamespace(used=used, total=total)

    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=lambda handle: b"NVIDIA H100",
        nvmlDeviceGetMemoryInfo=memory_info,
    )


def test_every_series_is_labelled_by_model_and_version() -> None:
    metrics = RuntimeMetrics("resnet", "3")
    metrics.queue_depth(4)
    metrics.inflight_batches(2)
    metrics.batch_started(8, [0.001] * 3)
    metrics.batch_finished(0.02)
    metrics.request_answered(200, 0.03)
    metrics.request_answered(503, 0.0)
    got = samples(metrics)
    mv = (("model", "resnet"), ("version", "3"))
    assert got[("kubeinfer_queue_depth", mv)] == 4
    assert got[("kubeinfer_inflight_batches", mv)] == 2
    assert got[("kubeinfer_batch_size_sum", mv)] == 8
    assert got[("kubeinfer_batch_size_bucket", tuple(sorted((*mv, ("le", "8.0")))))] == 1
    assert got[("kubeinfer_queue_duration_seconds_count", mv)] == 3
    assert got[("kubeinfer_compute_duration_seconds_sum", mv)] == 0.02
    assert got[("kubeinfer_request_duration_seconds_count", mv)] == 2
    for code in ("200", "503"):
        assert got[("kubeinfer_requests_total", tuple(sorted((*mv, ("code", code)))))] == 1
    assert not any(name.startswith("kubeinfer_gpu") for name, _ in got)


def test_each_app_has_its_own_registry() -> None:
    first, second = RuntimeMetrics("a", "1"), RuntimeMetrics("a", "1")
    first.request_answered(200, 0.01)
    key = ("kubeinfer_requests_total", (("code", "200"), ("model", "a"), ("version", "1")))
    assert samples(first)[key] == 1 and key not in samples(second)


def test_gpu_memory_gauges_come_from_nvml_at_scrape_time() -> None:
    nvml = fake_nvml(used=3 << 30, total=80 << 30)
    metrics = RuntimeMetrics("m", "1", gpu_memory=GpuMemoryReader(nvml).read)
    device = (("device", "0"), ("name", "NVIDIA H100"))
    got = samples(metrics)
    assert got[("kubeinfer_gpu_memory_used_bytes", device)] == 3 << 30
    assert got[("kubeinfer_gpu_memory_total_bytes", device)] == 80 << 30


def test_a_failing_nvml_read_does_not_fail_the_scrape() -> None:
    metrics = RuntimeMetrics("m", "1", gpu_memory=GpuMemoryReader(fake_nvml(1, 2, fail=True)).read)
    got = samples(metrics)
    assert not any(name.startswith("kubeinfer_gpu") for name, _ in got)
    assert ("kubeinfer_queue_depth", (("model", "m"), ("version", "1"))) in got
