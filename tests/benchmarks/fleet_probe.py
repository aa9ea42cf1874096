"""What `bench_fleet.py` reads while the operator works: the operator process' CPU and
memory from /proc, its own counters from its /metrics (`kubeinfer.operator.telemetry.activity`),
the API server's `apiserver_request_total`, a Prometheus exposition parsed into plain
numbers, the CPU of every process in the cluster's network namespace by name (where the
2 cores went: etcd, kube-apiserver, the controller manager, KWOK...), and Go CPU profiles
of the API server and the controller manager. No decisions here: readings in, numbers out.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kubeinfer.cluster import control_plane
from kubeinfer.contract import metric_series as series
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""(sample name, sorted labels) -> value."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def parse(text: str) -> Samples:
    result: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            result[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return result


def by_label(samples: Samples, name: str, label: str) -> Counter[str]:
    """The samples of `name`, summed by one label's value."""
    counts: Counter[str] = Counter()
    for (sample, labels), value in samples.items():
        if sample == name:
            counts[dict(labels).get(label, "")] += value
    return counts


def difference(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(after) | set(before))
            if after.get(k, 0) - before.get(k, 0)}  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """User and system CPU of the process (its threads included), from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_by_process_name() -> Counter[str]:
    """CPU seconds of every process in this network namespace (the cluster's, for the
    benchmarks, which move into one of their own), summed by command name."""
    own = os.readlink("/proc/self/ns/net")
    totals: Counter[str] = Counter()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "net") != own:
                continue
            totals[(entry / "comm").read_text().strip()] += cpu_seconds(int(entry.name))
        except (OSError, ValueError):  # gone meanwhile
            continue
    return totals


def cpu_spent(after: Counter[str], before: Counter[str]) -> dict[str, float]:
    """CPU seconds by process name between two `cpu_by_process_name` readings, largest
    first (a process that exited meanwhile is left out: its time is not in `after`)."""
    spent = {name: round(after[name] - before.get(name, 0), 1) for name in after}
    return dict(sorted(((k, v) for k, v in spent.items() if v >= 0.1), key=lambda kv: -kv[1]))


@dataclass(frozen=True)
class MachineCpu:
    """The whole machine's CPU seconds since boot, from /proc/stat's first line: busy
    (user, nice, system, irq, softirq), idle (idle, iowait) and stolen (the time a
    virtual machine's host gave to others while this one had work: when it grows, a
    slower run is the host's doing, not the run's)."""

    busy: float
    idle: float
    steal: float

    @classmethod
    def read(cls) -> MachineCpu:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
        return cls((user + nice + system + irq + softirq) / CLOCK_TICKS,
                   (idle + iowait) / CLOCK_TICKS, steal / CLOCK_TICKS)  # fmt: skip

    def since(self, before: MachineCpu) -> dict[str, float]:
        """CPU seconds busy, idle and stolen between `before` and this reading."""
        return {name: round(getattr(self, name) - getattr(before, name), 1)
                for name in ("busy", "idle", "steal")}  # fmt: skip


CONTROLLER_MANAGER_PROFILE = "https://127.0.0.1:10257/debug/pprof/profile"


def start_go_profiles(
    cluster: control_plane.Cluster, seconds: int, directory: Path
) -> list[threading.Thread]:
    """CPU profiles of the API server and the controller manager over the next `seconds`
    (their `/debug/pprof`, on by default), written to DIRECTORY/{apiserver,
    controller-manager}.pprof; `go tool pprof -top BINARY FILE` reads them."""
    directory.mkdir(parents=True, exist_ok=True)
    admin = ssl.create_default_context()  # the controller manager's serving cert is its own
    admin.check_hostname, admin.verify_mode = False, ssl.CERT_NONE
    admin.load_cert_chain(str(cluster.pki.admin_cert), str(cluster.pki.admin_key))
    targets = {"apiserver": (f"{cluster.server}/debug/pprof/profile", cluster.ssl_context()),
               "controller-manager": (CONTROLLER_MANAGER_PROFILE, admin)}  # fmt: skip

    def fetch(name: str, url: str, context: ssl.SSLContext) -> None:
        try:
            with urllib.request.urlopen(
                f"{url}?seconds={seconds}", context=context, timeout=seconds + 60
            ) as response:
                (directory / f"{name}.pprof").write_bytes(response.read())
        except OSError as error:  # the run goes on; the file says why it is missing
            (directory / f"{name}.error").write_text(f"{error!r}\n")

    threads = [threading.Thread(target=fetch, args=(name, *target), daemon=True)
               for name, target in targets.items()]  # fmt: skip
    for thread in threads:
        thread.start()
    return threads


def memory_kib(pid: int) -> tuple[int, int]:
    """(resident now, peak resident) of the process, in KiB (VmRSS, VmHWM)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def reset_peak(pid: int) -> None:
    """Resets the process' peak resident size to its current one (Linux 4.0+)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@dataclass
class OperatorProcess:
    """`kubeinfer operator` as a process of its own, so its CPU and memory are its own."""

    argv: list[str]
    environment: dict[str, str]
    log: Path
    metrics_port: int
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> OperatorProcess:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, env=self.environment, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                self.metrics()
                return self
            except OSError:
                if self.popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the operator did not start: see {self.log}") from None
                time.sleep(0.2)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def metrics(self) -> Samples:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return parse(response.read().decode())

    def stop(self, signal_number: int = 15) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        os.killpg(self.popen.pid, signal_number)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, 9)
            self.popen.wait()


@dataclass(frozen=True)
class Reading:
    """One look at the operator and the API server."""

    at: float
    cpu_seconds: float
    rss_kib: int
    peak_kib: int
    operator: Samples
    apiserver: Counter[str]
    """apiserver_request_total by verb (every client's)."""

    def requests(self) -> Counter[str]:
        return by_label(self.operator, series.OPERATOR_API_REQUESTS.total, "verb")

    def passes(self) -> Counter[str]:
        return by_label(self.operator, series.OPERATOR_RECONCILES.total, "result")

    def watch_events(self) -> Counter[str]:
        """The watch events the operator's handlers took, by resource."""
        return by_label(self.operator, series.OPERATOR_WATCH_EVENTS.total, "resource")

    def metrics_queries(self) -> Counter[str]:
        return by_label(self.operator, series.OPERATOR_METRICS_QUERIES.total, "kind")

    def pass_buckets(self) -> dict[float, float]:
        name = series.OPERATOR_RECONCILE_DURATION.name + "_bucket"
        return {float(le): v for le, v in by_label(self.operator, name, "le").items()}

    def ready(self) -> int:
        """Objects whose last pass wrote Ready True, by the operator's own gauge."""
        return ready_count(self.operator)


def ready_count(operator: Samples) -> int:
    """Objects whose last pass wrote Ready True, by the operator's own gauge."""
    return sum(
        1 for (name, labels), value in operator.items()
        if name == series.INFERENCE_DEPLOYMENT_CONDITION.name and value
        and dict(labels).get("type") == "Ready" and dict(labels).get("status") == "True"
    )  # fmt: skip


def apiserver_requests(cluster: control_plane.Cluster) -> Counter[str]:
    status, body = cluster.get("/metrics", timeout=30)
    if status != 200:
        raise RuntimeError(f"the API server's /metrics answered {status}")
    return by_label(parse(body.decode()), "apiserver_request_total", "verb")


WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def audit_writes(log: Path, offset: int) -> tuple[Counter[str], int]:
    """The writes the API server's audit log holds from byte `offset` on, counted by
    "<client> <verb> <resource>[/<subresource>]" (the client: its user agent's first word,
    e.g. `kopf`, `kubeinfer-operator`, `kube-controller-manager`); and the offset reached."""
    counts: Counter[str] = Counter()
    with log.open("rb") as stream:
        stream.seek(max(0, offset - 1))
        data = stream.read()
    start = 0 if offset == 0 else data.find(b"\n") + 1  # from the first whole line on
    end = data.rfind(b"\n") + 1
    for line in data[start:end].splitlines():
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITES:
            continue
        agent = str(event.get("userAgent") or "?").split("/")[0].split(" ")[0]
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "?") + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        counts[f"{agent} {event['verb']} {resource}"] += 1
    return counts, max(0, offset - 1) + end


def read(cluster: control_plane.Cluster, operator: OperatorProcess) -> Reading:
    rss, peak = memory_kib(operator.pid)
    return Reading(time.monotonic(), cpu_seconds(operator.pid), rss, peak, operator.metrics(),
                   apiserver_requests(cluster))  # fmt: skip


def passes_of(operator: OperatorProcess) -> float:
    """The operator's reconcile passes so far (0 while it cannot answer)."""
    try:
        return sum(
            by_label(operator.metrics(), series.OPERATOR_RECONCILES.total, "result").values()
        )
    except OSError:
        return 0.0


def quantile(q: float, before: Reading, after: Reading) -> float | None:
    """The q-quantile of the passes between two readings (Prometheus' interpolation)."""
    b, a = before.pass_buckets(), after.pass_buckets()
    return series.histogram_quantile(q, [(le, a[le] - b.get(le, 0)) for le in a])
