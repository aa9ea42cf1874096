"""The shadow's running aggregates, its metrics, and the mirror target file, in-process:

- `histogram_quantile` gives what Prometheus' own `histogram_quantile` gives on the same
  buckets (evaluated by `promtool test rules`, Prometheus' code, not ours);
- `RunningAggregates.status()` (the /v2/shadow body) and the `kubeinfer_shadow_*` series
  in /metrics say the same thing: counts, means as histogram sum/count, the max gauge,
  top-1, and p99s computed from the scraped buckets; mismatches stay out of the
  difference/cosine histograms; `close()` removes the candidate's series and only its;
- `parse_mirror_file`: empty or target-less content turns mirroring off, and each way a
  file can be wrong is an error naming the problem;
- `TargetWatcher` on a real file: a change of target (also through a kubelet-style
  symlink swap) reaches `on_target` at the next poll; an unchanged file does not; an
  invalid file keeps the previous target and is reported once, however often it is read.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.contract.metric_series import SHADOW_LATENCY_BUCKETS, histogram_quantile
from kubeinfer.contract.runtime_config import MirrorTarget
from kubeinfer.runtime.shadow.aggregates import RunningAggregates, ShadowMetrics
from kubeinfer.runtime.shadow.comparison import RequestComparison
from kubeinfer.runtime.shadow.target import (
    MirrorFileError,
    TargetWatcher,
    parse_mirror_file,
    same_candidate,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from waiting import eventually

INF = float("inf")


# --------------------------------------------------------------------------- quantiles


def _promtool_cases() -> list[tuple[float, list[tuple[float, float]]]]:
    rng = np.random.default_rng(5)
    cases = []
    for _ in range(12):
        seconds = rng.lognormal(np.log(0.004), 0.8, size=int(rng.integers(1, 400)))
        counts = np.cumsum(np.bincount(np.searchsorted(SHADOW_LATENCY_BUCKETS, seconds),
                                       minlength=len(SHADOW_LATENCY_BUCKETS) + 1))  # fmt: skip
        bounds = (*SHADOW_LATENCY_BUCKETS, INF)
        cases.append((float(rng.choice([0.5, 0.9, 0.99])), list(zip(bounds, counts.tolist(),
                                                                    strict=True))))  # fmt: skip
    cases.append((0.99, [(1.0, 0), (2.0, 50), (4.0, 100), (INF, 100)]))
    cases.append((0.99, [(1.0, 10), (2.0, 10), (INF, 20)]))  # the +Inf bucket
    cases.append((0.5, [(1.0, 4), (2.0, 3), (INF, 4)]))  # not monotonic
    return cases


def test_histogram_quantile_equals_prometheus_own(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool (Debian package prometheus) is needed in CI")
        pytest.skip("promtool (Debian package prometheus) is not installed")
    series, tests = [], []
    for index, (q, buckets) in enumerate(_promtool_cases()):
        for bound, count in buckets:
            le = "+Inf" if bound == INF else repr(bound)
            series.append(f"      - series: 'h_bucket{{case=\"{index}\",le=\"{le}\"}}'\n"
                          f"        values: '{count}'")  # fmt: skip
        expected = histogram_quantile(q, buckets)
        assert expected is not None
        tests.append(
            f'      - expr: histogram_quantile({q}, h_bucket{{case="{index}"}})\n'
            f"        eval_time: 0m\n"
            f"        exp_samples:\n"
            f"          - labels: '{{case=\"{index}\"}}'\n"
            f"            value: {expected!r}"
        )
    spec = tmp_path / "quantiles.yaml"
    spec.write_text(
        "rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n"
        "    input_series:\n"
        + "\n".join(series)
        + "\n    promql_expr_test:\n"
        + "\n".join(tests)
        + "\n"
    )
    done = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


# --------------------------------------------------------------------------- aggregates

TARGET = MirrorTarget(
    url="http://candidate:8000", model_name="m", candidate_version="2",
    candidate_digest="sha256:" + "ab" * 32, traffic_percent=10,
)  # fmt: skip


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def series(scraped, name: str, digest: str = TARGET.candidate_digest, **extra: str):
    found = {}
    for (sample, labels), value in scraped.items():
        labels = dict(labels)
        if (
            sample == name
            and labels.get("candidate_digest") == digest
            and all(labels.get(k) == v for k, v in extra.items())
        ):
            found[labels.get("le")] = value
    return found


def p99_from_scrape(scraped, name: str) -> float | None:
    buckets = series(scraped, name + "_bucket")
    return histogram_quantile(0.99, [(float(le), count) for le, count in buckets.items()])


def test_status_and_metrics_say_the_same_thing() -> None:
    registry = CollectorRegistry()
    aggregates = RunningAggregates(TARGET, "m", "1", ShadowMetrics(registry))
    rng = np.random.default_rng(0)
    differences = rng.uniform(0, 0.05, 40)
    cosines = 1 - rng.uniform(0, 0.01, 40)
    for i, (difference, cosine) in enumerate(zip(differences, cosines, strict=True)):
        comparison = RequestComparison(max_abs_difference=difference, min_cosine=cosine,
                                       top1_rows=2, top1_agreements=2 - (i % 5 == 0))  # fmt: skip
        aggregates.record_comparison(comparison, 0.001 + i * 1e-4, 0.002 + i * 2e-4)
    aggregates.record_comparison(RequestComparison(mismatch="shape"), 0.5, 0.5)
    for outcome, times in (("dropped", 3), ("candidate_error", 2), ("timeout", 1)):
        for _ in range(times):
            aggregates.record_outcome(outcome)

    status = aggregates.status()
    scraped = scrape(registry)
    assert status["requests"] == {"compared": 41, "dropped": 3, "candidateError": 2, "timeout": 1}
    for outcome, key in (
        ("compared", "compared"),
        ("dropped", "dropped"),
        ("candidate_error", "candidateError"),
        ("timeout", "timeout"),
    ):
        got = series(scraped, "kubeinfer_shadow_requests_total", outcome=outcome)
        assert list(got.values()) == [status["requests"][key]]  # fmt: skip
    assert status["mismatches"] == 1
    assert series(scraped, "kubeinfer_shadow_mismatches_total")[None] == 1
    assert status["maxAbsDifference"] == differences.max()
    assert series(scraped, "kubeinfer_shadow_max_abs_difference")[None] == differences.max()
    # the mismatch is in neither histogram: 40 observations, not 41
    assert series(scraped, "kubeinfer_shadow_abs_difference_count")[None] == 40
    assert status["meanAbsDifference"] == pytest.approx(
        series(scraped, "kubeinfer_shadow_abs_difference_sum")[None] / 40
    )
    assert status["meanCosineSimilarity"] == pytest.approx(
        series(scraped, "kubeinfer_shadow_cosine_similarity_sum")[None] / 40
    )
    assert status["minCosineSimilarity"] == cosines.min()
    assert status["top1"] == {"rows": 80, "agreements": 72, "agreement": 0.9}
    assert series(scraped, "kubeinfer_shadow_top1_rows_total")[None] == 80
    assert series(scraped, "kubeinfer_shadow_top1_agreements_total")[None] == 72
    latency = status["latency"]
    assert latency["servingP99Seconds"] == p99_from_scrape(
        scraped, "kubeinfer_shadow_serving_duration_seconds"
    )
    assert latency["candidateP99Seconds"] == p99_from_scrape(
        scraped, "kubeinfer_shadow_candidate_duration_seconds"
    )
    # 41 observations (the mismatch too) with the largest at 0.5 s: p99 in its bucket
    assert 0.4 < latency["servingP99Seconds"] <= 0.5 * 2 ** (1 / 6)


def test_closing_a_candidate_removes_its_series_and_only_its() -> None:
    registry = CollectorRegistry()
    metrics = ShadowMetrics(registry)
    old = RunningAggregates(TARGET, "m", "1", metrics)
    other = TARGET.model_copy(update={"candidate_digest": "sha256:" + "cd" * 32})
    new = RunningAggregates(other, "m", "1", metrics)
    for aggregates in (old, new):
        aggregates.record_comparison(RequestComparison(max_abs_difference=0.1), 0.01, 0.01)
    old.close()
    old.record_outcome("dropped")  # ignored after close
    scraped = scrape(registry)
    assert not any(dict(labels).get("candidate_digest") == TARGET.candidate_digest
                   for _, labels in scraped)  # fmt: skip
    assert series(scraped, "kubeinfer_shadow_requests_total", other.candidate_digest,
                  outcome="compared") == {None: 1}  # fmt: skip


def test_nothing_compared_yet_is_null_rather_than_zero() -> None:
    status = RunningAggregates(TARGET, "m", "1", ShadowMetrics(CollectorRegistry())).status()
    assert status["active"] and status["candidate"]["digest"] == TARGET.candidate_digest
    assert status["maxAbsDifference"] is None and status["meanCosineSimilarity"] is None
    assert status["top1"]["agreement"] is None
    assert status["latency"] == {"servingP99Seconds": None, "candidateP99Seconds": None}


# --------------------------------------------------------------------------- target file

VALID = (
    "target:\n  url: http://cand:8000\n  modelName: m\n  candidateVersion: '2'\n"
    "  candidateDigest: sha256:abc\n  trafficPercent: 25\n"
    "  policy: {maxConcurrency: 2, timeoutMilliseconds: 300}\n"
)


def test_a_valid_file_names_its_target_in_yaml_or_json() -> None:
    target = parse_mirror_file(VALID.encode())
    assert target is not None and target.traffic_percent == 25
    assert target.policy.max_concurrency == 2 and target.policy.max_queue_size == 64
    as_json = parse_mirror_file(
        b'{"target": {"url": "http://cand:8000", "modelName": "m", "candidateVersion": "2"}}'
    )
    assert as_json is not None and as_json.traffic_percent == 10


@pytest.mark.parametrize("content", [b"", b"  \n", b"target: null\n", b"{}", b"# nothing\n"])
def test_empty_content_or_no_target_turns_mirroring_off(content: bytes) -> None:
    assert parse_mirror_file(content) is None


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"target: [unclosed\n", "not valid YAML"),
        (b"- a\n- list\n", "expected a mapping"),
        (VALID.replace("trafficPercent: 25", "trafficPercent: 0").encode(),
         "target.trafficPercent"),
        (VALID.replace("http://cand:8000", "cand:8000").encode(), "target.url"),
        (VALID.replace("modelName", "modelname").encode(), "target.modelname"),
        (b"target: {url: 'http://c:1'}\n", "target.modelName"),
    ],
)  # fmt: skip
def test_an_invalid_file_is_an_error_naming_the_problem(content: bytes, reason: str) -> None:
    with pytest.raises(MirrorFileError, match=reason):
        parse_mirror_file(content)


def test_a_new_share_is_the_same_candidate_and_a_new_digest_is_not() -> None:
    target = parse_mirror_file(VALID.encode())
    assert same_candidate(target, target.model_copy(update={"traffic_percent": 100}))
    assert not same_candidate(target, target.model_copy(update={"candidate_digest": "sha256:d"}))
    assert not same_candidate(target, target.model_copy(update={"url": "http://other:1"}))
    assert not same_candidate(target, None) and same_candidate(None, None)


async def test_the_watcher_follows_the_file_and_reports_a_bad_one_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The ConfigMap volume's layout: mirror.yaml -> ..data/mirror.yaml, ..data -> a
    # timestamped directory, swapped by renaming a new symlink over ..data.
    def publish(content: str, generation: int) -> None:
        directory = tmp_path / f"..2024_{generation}"
        directory.mkdir()
        (directory / "mirror.yaml").write_text(content)
        (tmp_path / "..data_tmp").symlink_to(directory.name)
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")

    publish(VALID, 0)
    (tmp_path / "mirror.yaml").symlink_to("..data/mirror.yaml")
    seen: list[MirrorTarget | None] = []

    async def on_target(target: MirrorTarget | None) -> None:
        seen.append(target)

    watcher = TargetWatcher(tmp_path / "mirror.yaml", 0.02, on_target)
    polls = [0]  # the watcher's reads done; "nothing new" holds over a few of them
    poll = watcher.poll

    async def counted_poll() -> None:
        try:
            await poll()
        finally:
            polls[0] += 1

    watcher.poll = counted_poll  # type: ignore[method-assign]

    async def polled(times: int) -> None:
        done = polls[0] + times
        await eventually(lambda: polls[0] >= done, what=f"{times} more reads", in_thread=False)

    caplog.set_level(logging.WARNING, logger="kubeinfer.runtime.shadow.target")
    await watcher.start()
    try:
        assert [t.candidate_digest for t in seen] == ["sha256:abc"]  # read before start returns
        await polled(5)
        assert len(seen) == 1  # unchanged content: nothing new

        publish(VALID.replace("sha256:abc", "sha256:def"), 1)
        await eventually(lambda: len(seen) == 2, what="the new target", in_thread=False)
        assert [t.candidate_digest for t in seen] == ["sha256:abc", "sha256:def"]

        def warnings() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.levelno == logging.WARNING]

        publish("target: {url: 5}\n", 2)
        await eventually(warnings, what="the bad file reported", in_thread=False)
        await polled(10)  # of the same bad content
        assert len(seen) == 2  # the previous target stays
        assert len(warnings()) == 1 and "target.url" in warnings()[0].getMessage()
        assert "kept the previous target" in warnings()[0].getMessage()

        publish("", 3)
        await eventually(lambda: seen[-1] is None, what="mirroring off", in_thread=False)
        (tmp_path / "mirror.yaml").unlink()
        publish(VALID, 4)
        await polled(5)
        assert seen[-1] is None  # the file is gone: still off, and not an error
        assert len(warnings()) == 1
    finally:
        await watcher.stop()
