"""What the operator costs as its work grows: N InferenceDeployments created at once on
simulated GPU nodes, against the real control plane, in one run.

A script, not a test (nothing here is named test_*, so pytest never collects it); as root:

    .venv/bin/python tests/benchmarks/bench_fleet.py [--sizes 10,100,1000] [--nodes 300]
        [--steady-seconds 60] [--churn-minutes 2] [--autoscale-seconds 60]
        [--failover-at 1000] [--cache shared|per-object] [--known-answers off|on|both]
        [--json out.json]

The cluster is `kubeinfer cluster up`'s (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the real node) with `--nodes` simulated GPU nodes (`cluster.fleet`:
KWOK, H100/H200/L4/A10G in three zones) on which the real scheduler places every pod and
KWOK plays the kubelet: pods start 1 s after they are bound, builds take 2 s and report an
engine digest as `kubeinfer build` does. The operator runs as its own process
(`kubeinfer operator -A --metrics-port`), started afresh for each size, so its CPU and
peak memory (from /proc) are that size's.

Per size N, in a namespace of its own (or spread over K with `--namespaces K`): the N
objects (TensorRT fp16, one GPU per pod, 2 replicas, each pinned to one GPU product in
turn; their engine cache one claim each namespace shares, or with `--cache per-object` a
claim each) are created at once (16
clients in parallel), then: seconds until the operator has written Ready True on all of them, its
passes (count, p50/p99 from its own histogram), CPU seconds, peak and settled memory, its
API requests by verb (its own counter), the watch events its handlers took, every
client's requests by verb from the API server's `apiserver_request_total`; then
`--steady-seconds` with nothing changing (goal: no writes at all); then
`--churn-minutes` in which 10 % of the objects a minute have their replica count changed
(spread evenly over each minute), with the CPU per minute and the writes per change;
`--autoscale-seconds` with autoscaling on for every object, reading a real Prometheus
fed with the simulated pods' series (`fleet_load`): metrics queries per poll and which
objects scaled; at
`--failover-at`, a leader failover: a second replica waits on the Lease, the leader is
killed, one object's spec changes, and the time until its status shows the new
generation is the failover's cost. The namespace is deleted before the next size.
With `--known-answers on` the objects' known-answer checks are on (every
`--known-answers-interval` s), and with `both` each size runs twice, off then on: one real
runtime answers the checks of every simulated pod at its own address (fleet_answers), and
the steady phase counts the sets it ran.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fleet_answers
import fleet_load
import fleet_probe as probe
from checkout_site import package_links
from kubeinfer.cluster import netns
from kubeinfer.operator.settings import LeaderElection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # waiting
from waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "inferencedeployments.kubeinfer.io.yaml"
PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-L4", "NVIDIA-A10G")
API = "/apis/kubeinfer.io/v1alpha1"


SHARED_CACHE = "fleet-engine-cache"
"""The engine cache claim every object of a namespace shares (`--cache shared`)."""


def manifest(
    namespace: str, index: int, storage_class: str, shared: bool, answers_every: int = 0
) -> dict[str, Any]:
    """Object `index`; with `answers_every` (seconds), its known-answer checks on."""
    own = {"storageClassName": storage_class, "size": "1Gi", "accessMode": "ReadWriteMany"}
    cache = {"existingClaim": SHARED_CACHE} if shared else own
    checks = {"knownAnswers": {"intervalSeconds": answers_every}} if answers_every else {}
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": f"model-{index:05d}", "namespace": namespace},
        "spec": {
            "model": {"name": f"model-{index:05d}", "version": "1",
                      "source": {"uri": f"https://models.example/fleet/{index}.onnx"}},
            "engine": {"backend": "tensorrt", "precision": "fp16", "maxBatchSize": 8,
                       "cache": cache},
            "runtime": {
                "replicas": 2,
                "resources": {"gpus": 1},
                "gpuProduct": PRODUCTS[index % len(PRODUCTS)],
                "nodeSelector": {"type": "kwok"},
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists",
                                 "effect": "NoSchedule"}],
                "batching": {"maxBatchSize": 8},
            },
            **checks,
        },
    }  # fmt: skip


class Fleet:
    """The cluster, its simulated nodes and the requests the benchmark makes."""

    def __init__(self, directory: Path, nodes: int) -> None:
        from kubeinfer.cluster import control_plane, fleet, fleet_stages

        self.control_plane = control_plane
        self.cluster = control_plane.up(directory / "cluster", in_this_namespace=True, audit=True)
        self.audit = self.cluster.directory / "audit.log"
        control_plane.kubectl(self.cluster, "apply", "--server-side", "-f", str(CRD))
        self._wait(lambda: self.cluster.get(f"{API}/inferencedeployments")[0] == 200, 60)
        t0 = time.monotonic()
        try:
            fleet.start(self.cluster, fleet.plan_fleet(nodes), start_seconds=1,
                        build_seconds=2, timeout_seconds=600)  # fmt: skip
        except BaseException:
            control_plane.down(self.cluster.directory)  # main has no Fleet to stop
            raise
        print(f"# {nodes} simulated nodes Ready in {time.monotonic() - t0:.1f} s", flush=True)
        self.storage_class = fleet_stages.STORAGE_CLASS
        self.load: fleet_load.FleetLoad | None = None
        self.answers: fleet_answers.FleetAnswers | None = None

    def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        import urllib.error
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type or "application/json"}
        req = urllib.request.Request(self.cluster.server + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(req, context=self.cluster.ssl_context(), timeout=60) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"{method} {path}: {error.code} {error.read()[:300]!r}") from None

    def watch(self, path: str) -> Iterator[dict[str, Any]]:
        """The events of a watch request, until the server ends it."""
        import urllib.request

        with urllib.request.urlopen(
            self.cluster.server + path, context=self.cluster.ssl_context(), timeout=90
        ) as response:
            for line in response:
                if line.strip():
                    yield json.loads(line)

    def namespace(self, name: str) -> None:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        self.request("POST", "/api/v1/namespaces", namespace)
        self._wait(lambda: self.cluster.get(
            f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200, 30)  # fmt: skip

    def shared_cache(self, namespace: str) -> None:
        """The namespace's one engine cache claim (ReadWriteMany, as a fleet shares one),
        bound by KWOK's provisioner stage."""
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": SHARED_CACHE, "namespace": namespace},
                 "spec": {"storageClassName": self.storage_class, "accessModes": ["ReadWriteMany"],
                          "resources": {"requests": {"storage": "100Gi"}}}}  # fmt: skip
        path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
        self.request("POST", path, claim)
        bound = lambda: self.request("GET", f"{path}/{SHARED_CACHE}").get("status", {})  # noqa: E731
        self._wait(lambda: bound().get("phase") == "Bound", 120)

    def delete_namespace(self, name: str, timeout: float = 900) -> float:
        t0 = time.monotonic()
        self.request("DELETE", f"/api/v1/namespaces/{name}")
        self._wait(lambda: self.cluster.get(f"/api/v1/namespaces/{name}")[0] == 404, timeout)
        return time.monotonic() - t0

    def create_all(self, objects: list[dict[str, Any]], clients: int = 16) -> float:
        t0 = time.monotonic()

        def create(obj: dict[str, Any]) -> None:
            namespace = obj["metadata"]["namespace"]
            self.request("POST", f"{API}/namespaces/{namespace}/inferencedeployments", obj)

        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            list(pool.map(create, objects))
        return time.monotonic() - t0

    def objects(self) -> list[dict[str, Any]]:
        """Every InferenceDeployment: one size's, which are all that exist at a time."""
        return self.request("GET", f"{API}/inferencedeployments")["items"]

    def patch_spec(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        self.request("PATCH", f"{API}/namespaces/{namespace}/inferencedeployments/{name}",
                     {"spec": spec}, "application/merge-patch+json")  # fmt: skip

    @staticmethod
    def _wait(check: Any, timeout: float) -> None:
        """`wait_for`, failing with a TimeoutError (a phase's row keeps what it measured)."""
        try:
            wait_for(check, within=timeout, every=0.2)
        except AssertionError as error:
            raise TimeoutError(str(error)) from None


def ready_in_api(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    return status.get("observedGeneration") == obj["metadata"].get("generation") and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


PROFILE: Path | None = None
"""With --profile, where each operator process writes its cProfile statistics."""
PROMETHEUS_URL = ""
"""The Prometheus the operators read (fleet_load's), once it runs."""
OPERATOR_SITE: Path | None = None
"""With --operator-checkout, a PYTHONPATH folder whose `kubeinfer` is that checkout's."""


def operator_process(fleet: Fleet, log: Path, election: bool = False) -> probe.OperatorProcess:
    port = fleet.control_plane.free_port()
    argv = [str(REPO / ".venv" / "bin" / "kubeinfer"), "operator", "-A", "--metrics-port",
            str(port)]  # fmt: skip
    if PROFILE is not None:
        argv = [sys.executable, "-m", "cProfile", "-o", str(PROFILE / f"{log.stem}.prof"), *argv]
    if election:
        argv += ["--leader-election", "--lease-namespace", "kube-system"]
    environment = {**os.environ, "KUBECONFIG": str(fleet.cluster.kubeconfig)}
    if PROMETHEUS_URL:
        environment["KUBEINFER_METRICS__PROMETHEUS_URL"] = PROMETHEUS_URL
    if OPERATOR_SITE is not None:
        environment["PYTHONPATH"] = str(OPERATOR_SITE)
    return probe.OperatorProcess(argv, environment, log, port).start()


def summary(before: probe.Reading, after: probe.Reading) -> dict[str, Any]:
    """What the operator did between two readings."""
    return {
        "seconds": round(after.at - before.at, 1),
        "cpu_seconds": round(after.cpu_seconds - before.cpu_seconds, 2),
        "passes": probe.difference(after.passes(), before.passes()),
        "pass_p50_seconds": probe.quantile(0.5, before, after),
        "pass_p99_seconds": probe.quantile(0.99, before, after),
        "operator_requests": probe.difference(after.requests(), before.requests()),
        "watch_events": sum(after.watch_events().values()) - sum(before.watch_events().values()),
        "watch_events_by_resource": probe.difference(after.watch_events(), before.watch_events()),
        "metrics_queries": probe.difference(after.metrics_queries(), before.metrics_queries()),
        "apiserver_requests": probe.difference(after.apiserver, before.apiserver),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def writes_during(fleet: Fleet, seconds: float) -> dict[str, int]:
    """Every client's writes in the next `seconds`, from the API server's audit log."""
    offset = fleet.audit.stat().st_size
    time.sleep(seconds)
    counts, _ = probe.audit_writes(fleet.audit, offset)
    return dict(sorted(counts.items()))


def wait_ready(fleet: Fleet, operator: probe.OperatorProcess, n: int, timeout: float) -> int:
    """Until all n have Ready True in their status, as `kubectl wait` sees it: a list of the
    InferenceDeployments, then a watch from the list's version, renewed every 30 s from
    where it stopped; listed again when the version has expired or a whole watch brought
    nothing while some are not Ready (a watch resumed from an object's version once missed
    the last changes of some objects). (Read from the operator's /metrics every second,
    as before, the wait cost the operator a rendering of its per-object series each
    second, and this script as much to parse them: CPU taken from the two cores the run
    measures.)"""
    progress = Progress(n)
    deadline, version = time.monotonic() + timeout, ""
    ready: set[str] = set()
    path = f"{API}/inferencedeployments"  # one size's objects exist at a time
    while len(ready) < n and time.monotonic() < deadline:
        if operator.popen.poll() is not None:  # type: ignore[union-attr]
            raise RuntimeError(f"the operator exited with {len(ready)}/{n} Ready")
        if not version:
            listed = fleet.request("GET", path)
            ready = {o["metadata"]["name"] for o in listed["items"] if ready_in_api(o)}
            version = listed["metadata"]["resourceVersion"]
            progress.report(len(ready))
        query = f"?watch=1&allowWatchBookmarks=true&timeoutSeconds=30&resourceVersion={version}"
        expired, changes = False, 0
        for event in fleet.watch(path + query):
            obj = event["object"]
            if event["type"] == "ERROR":  # the version has expired
                expired = True
                break
            version = obj["metadata"]["resourceVersion"]
            if event["type"] == "BOOKMARK":
                continue
            changes += 1
            if event["type"] != "DELETED" and ready_in_api(obj):
                ready.add(obj["metadata"]["name"])
            else:
                ready.discard(obj["metadata"]["name"])
            progress.report(len(ready))
            if len(ready) >= n:
                break
        if expired or not changes:  # list again
            version = ""
    return len(ready)  # short of n: the row says how many, and the phases go on


class Progress:
    """A line at every twentieth of n Ready: the seconds since the wait began and the
    machine's CPU since the previous line."""

    def __init__(self, n: int) -> None:
        self.n, self.step, self.shown = n, max(1, n // 20), 0
        self.started, self.machine = time.monotonic(), probe.MachineCpu.read()

    def report(self, ready: int) -> None:
        if ready // self.step <= self.shown // self.step:
            return
        self.shown = ready
        now = probe.MachineCpu.read()
        cpu = " ".join(f"{k} {v}" for k, v in now.since(self.machine).items())
        print(f"#   {ready}/{self.n} Ready at {time.monotonic() - self.started:.1f} s "
              f"(machine CPU s since the last line: {cpu})", flush=True)  # fmt: skip
        self.machine = now


@dataclass(frozen=True)
class Spaces:
    """The namespaces one size's objects live in: object i in the (i mod K)th. One by
    default (every budget and Service of the fleet in one namespace, the controller
    manager's worst case: its disruption and EndpointSlice controllers scan a namespace's
    budgets and pods at every pod event); `--namespaces K` spreads them as teams would."""

    names: tuple[str, ...]

    @classmethod
    def of_size(cls, n: int, count: int) -> Spaces:
        if count == 1:
            return cls((f"fleet-{n}",))
        return cls(tuple(f"fleet-{n}-{k}" for k in range(count)))

    def of(self, index: int) -> str:
        return self.names[index % len(self.names)]


def churn(fleet: Fleet, spaces: Spaces, n: int, minutes: float) -> int:
    """10 % of the objects a minute get a new replica count, evenly spread; returns how
    many changes were made."""
    changes = max(1, round(n * 0.10 * minutes))
    interval = minutes * 60 / changes
    start = time.monotonic()
    for i in range(changes):
        index = (i * 7919) % n  # a stride through every object
        replicas = 3 + (i * 7919 // n) % 2  # created with 2: every visit changes the count
        spec = {"runtime": {"replicas": replicas}}
        fleet.patch_spec(spaces.of(index), f"model-{index:05d}", spec)
        time.sleep(max(0.0, start + (i + 1) * interval - time.monotonic()))
    return changes


def failover(fleet: Fleet, spaces: Spaces, directory: Path) -> dict[str, Any]:
    """Two replicas with leader election; the leader is killed; seconds until the standby
    has reconciled a spec change made at the kill."""
    first = operator_process(fleet, directory / "operator-a.log", election=True)
    time.sleep(5)  # the first takes the Lease
    second = operator_process(fleet, directory / "operator-b.log", election=True)
    try:
        fleet._wait(lambda: probe.passes_of(first) > 0, 300)
        target, namespace = "model-00001", spaces.of(1)
        obj = fleet.request("GET", f"{API}/namespaces/{namespace}/inferencedeployments/{target}")
        generation = obj["metadata"]["generation"]
        replicas = 1 if obj["spec"]["runtime"].get("replicas") != 1 else 2
        killed = time.monotonic()
        first.stop(signal.SIGKILL)
        fleet.patch_spec(namespace, target, {"runtime": {"replicas": replicas}})
        fleet._wait(lambda: probe.passes_of(second) > 0, 300)
        first_pass = time.monotonic() - killed

        def reconciled() -> bool:
            obj = fleet.request(
                "GET", f"{API}/namespaces/{namespace}/inferencedeployments/{target}"
            )
            return (obj.get("status") or {}).get("observedGeneration", 0) > generation

        fleet._wait(reconciled, 600)
        return {"seconds_to_first_reconcile": round(first_pass, 1),
                "seconds_to_changed_object_reconciled": round(time.monotonic() - killed, 1),
                "lease_duration_seconds": LeaderElection().lease_duration_seconds}  # fmt: skip
    finally:
        first.stop()
        second.stop()


def autoscale(
    fleet: Fleet, operator: probe.OperatorProcess, spaces: Spaces, n: int, seconds: float
) -> dict[str, Any]:
    """Autoscaling turned on for every object (fleet_load's Prometheus as the source, one
    object in ten loaded above the target); what the operator did in `seconds`, the
    metrics queries per autoscale poll, and how many objects scaled up (expected: the
    loaded ones, each to maxReplicas)."""
    spec = {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4,
                            "targetRequestsInProgressPerReplica": 8}}  # fmt: skip
    counts_before = replica_counts(fleet)
    before = probe.read(fleet.cluster, operator)
    asked = fleet.load.queries_answered() if fleet.load else 0.0
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: fleet.patch_spec(spaces.of(i), f"model-{i:05d}", spec), range(n)))
    time.sleep(seconds)
    after = probe.read(fleet.cluster, operator)
    answered = fleet.load.queries_answered() - asked if fleet.load else None
    result = summary(before, after)
    polls = result["seconds"] / AUTOSCALE_POLL_SECONDS
    grouped = result["metrics_queries"].get("prometheus_grouped", 0)
    result["polls"] = round(polls, 1)
    result["grouped_queries_per_poll"] = round(grouped / polls, 2)
    result["per_object_queries_per_poll"] = round(
        result["metrics_queries"].get("prometheus", 0) / polls, 2
    )
    result["prometheus_queries_answered"] = answered
    counts = replica_counts(fleet)
    scaled_up = {owner for owner, count in counts.items() if count > counts_before.get(owner, 0)}
    loaded = {f"model-{i:05d}" for i in range(n) if fleet_load.hot(f"model-{i:05d}")}
    result["loaded"] = len(loaded)
    result["scaled_up"] = len(scaled_up)
    result["loaded_at_max"] = sum(counts.get(owner) == 4 for owner in loaded)
    result["scaled_up_only_loaded"] = scaled_up <= loaded
    return result


def replica_counts(fleet: Fleet) -> dict[str, int]:
    """Each object's runtime Deployment's replica count (what the autoscaler sets): of the
    one size whose objects exist."""
    deployments = fleet.request("GET", "/apis/apps/v1/deployments")
    return {d["metadata"]["name"].removesuffix("-runtime"): int(d["spec"].get("replicas") or 0)
            for d in deployments["items"]}  # fmt: skip


AUTOSCALE_POLL_SECONDS = 15.0
"""The operator's default `requeue.autoscale_poll_seconds`."""


def phase(
    fleet: Fleet, n: int, args: argparse.Namespace, directory: Path, answers_every: int = 0
) -> dict[str, Any]:
    """One size's run; with `answers_every`, its objects' known-answer checks on, every
    that many seconds, answered by `fleet.answers`."""
    spaces = Spaces.of_size(n, args.namespaces)
    for namespace in spaces.names:
        fleet.namespace(namespace)
        if args.cache == "shared":
            fleet.shared_cache(namespace)
    log = f"operator-{n}{'-answers' if answers_every else ''}.log"
    operator = operator_process(fleet, directory / log)
    result: dict[str, Any] = {"n": n, "nodes": args.nodes, "namespaces": len(spaces.names),
                              "known_answers_interval_seconds": answers_every}  # fmt: skip
    try:
        time.sleep(2)  # its watches started
        start = probe.read(fleet.cluster, operator)
        processes_before, machine_before = probe.cpu_by_process_name(), probe.MachineCpu.read()
        if args.pprof_seconds:
            probe.start_go_profiles(fleet.cluster, args.pprof_seconds, directory / f"pprof-{n}")
        objects = [manifest(spaces.of(i), i, fleet.storage_class, args.cache == "shared",
                            answers_every) for i in range(n)]  # fmt: skip
        result["create_seconds"] = round(fleet.create_all(objects), 1)
        result["ready"] = wait_ready(fleet, operator, n, args.ready_timeout)
        ready = probe.read(fleet.cluster, operator)
        listed = fleet.objects()
        result["ready_in_api"] = sum(ready_in_api(o) for o in listed)
        result["seconds_to_all_ready"] = round(ready.at - start.at, 1)
        result["cpu_seconds_to_ready_by_process"] = probe.cpu_spent(
            probe.cpu_by_process_name(), processes_before
        )
        result["machine_cpu_seconds_to_ready"] = probe.MachineCpu.read().since(machine_before)
        result["to_ready"] = summary(start, ready)
        result["peak_rss_mib_to_ready"] = round(ready.peak_kib / 1024, 1)
        time.sleep(args.settle_seconds)  # build Jobs' last events, requeues after Ready
        quiet = probe.read(fleet.cluster, operator)
        processes_quiet, machine_quiet = probe.cpu_by_process_name(), probe.MachineCpu.read()
        checks_before = fleet.answers.checks() if answers_every and fleet.answers else {}
        writes = writes_during(fleet, args.steady_seconds)
        steady = probe.read(fleet.cluster, operator)
        result["steady"] = summary(quiet, steady)
        if answers_every and fleet.answers:
            result["steady"]["known_answer_sets_run"] = probe.difference(
                fleet.answers.checks(), checks_before
            )
        # What the fleet costs with nothing changing (node heartbeats, Leases): the part
        # of the time to Ready that grows with the time itself.
        result["steady"]["cpu_seconds_by_process"] = probe.cpu_spent(
            probe.cpu_by_process_name(), processes_quiet
        )
        result["steady"]["machine_cpu_seconds"] = probe.MachineCpu.read().since(machine_quiet)
        result["steady"]["writes_by_client"] = writes
        result["steady"]["operator_writes"] = sum(
            v for k, v in writes.items() if k.split()[0] in ("kopf", "kubeinfer-operator")
        )
        result["rss_mib_steady"] = round(steady.rss_kib / 1024, 1)
        if args.churn_minutes:
            changes = churn(fleet, spaces, n, args.churn_minutes)
            churned = probe.read(fleet.cluster, operator)
            result["churn"] = {"changes": changes, **summary(steady, churned)}
        if PROMETHEUS_URL and args.autoscale_seconds:
            result["autoscale"] = autoscale(fleet, operator, spaces, n, args.autoscale_seconds)
        result["peak_rss_mib"] = round(probe.read(fleet.cluster, operator).peak_kib / 1024, 1)
    finally:
        operator.stop()
    if n == args.failover_at:
        try:
            result["failover"] = failover(fleet, spaces, directory)
        except TimeoutError as error:  # the row keeps what the other phases measured
            result["failover"] = {"error": str(error)}
        if args.json:
            partial = args.json.with_suffix(".partial.json")  # before the namespace delete
            partial.write_text(json.dumps(result, indent=1) + "\n")
    result["namespace_delete_seconds"] = round(
        sum(fleet.delete_namespace(namespace) for namespace in spaces.names), 1
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--steady-seconds", type=float, default=60)
    parser.add_argument("--settle-seconds", type=float, default=20)
    parser.add_argument("--churn-minutes", type=float, default=2)
    parser.add_argument("--failover-at", type=int, default=1000)
    parser.add_argument("--ready-timeout", type=float, default=1500)
    parser.add_argument(
        "--cache",
        choices=("shared", "per-object"),
        default="shared",
        help="one engine cache claim per namespace, or one per object (each "
        "provisioned by KWOK's one-at-a-time claim stage and bound by the "
        "persistent volume controller)",
    )
    parser.add_argument(
        "--autoscale-seconds",
        type=float,
        default=60,
        help="the autoscaler phase's length (0: none)",
    )
    parser.add_argument(
        "--namespaces", type=int, default=1,
        help="spread each size's objects over this many namespaces (default: all in one)",
    )  # fmt: skip
    parser.add_argument(
        "--known-answers", choices=("off", "on", "both"), default="off",
        help="the objects' known-answer checks: off, on, or each size run twice, off then "
        "on (side by side in one run); one real runtime answers every simulated pod "
        "(fleet_answers)",
    )  # fmt: skip
    parser.add_argument(
        "--known-answers-interval", type=int, default=30,
        help="knownAnswers.intervalSeconds with checks on (30, the least the API allows, "
        "puts checks inside the steady phase)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory")
    parser.add_argument("--profile", type=Path, help="write each operator's cProfile here")
    parser.add_argument(
        "--pprof-seconds", type=int, default=0,
        help="CPU-profile the API server and the controller manager for this long from "
        "the first create (into the logs' directory, pprof-N/; with --keep)",
    )  # fmt: skip
    parser.add_argument(
        "--operator-checkout", type=Path, default=None,
        help="run the operator of this checkout instead (a `git worktree add DIR COMMIT`): "
        "an earlier version against this one on the same machine in the same hour",
    )  # fmt: skip
    args = parser.parse_args()
    global PROFILE, PROMETHEUS_URL, OPERATOR_SITE
    PROFILE = args.profile
    if os.geteuid() != 0:
        print("bench_fleet: needs root (a network namespace for the cluster)", file=sys.stderr)
        return 2
    # Stopped by SIGTERM or SIGINT (which a shell ignores in a background job), the
    # cluster still comes down: the signal raises, and `finally` stops it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    netns.enter_new_namespace()
    directory = Path(tempfile.mkdtemp(prefix="bench-fleet-", dir="/var/tmp"))
    print(f"# logs in {directory}", flush=True)
    if args.operator_checkout is not None:
        OPERATOR_SITE = package_links(args.operator_checkout, directory)
        print(f"# the operator of {args.operator_checkout}", flush=True)
    results = []
    fleet = None
    try:
        fleet = Fleet(directory, args.nodes)
        if args.autoscale_seconds:
            fleet.load = fleet_load.FleetLoad(fleet.cluster, directory)
            PROMETHEUS_URL = fleet.load.url
        if args.known_answers != "off":
            fleet.answers = fleet_answers.FleetAnswers(directory)
        every = {"off": (0,), "on": (args.known_answers_interval,),
                 "both": (0, args.known_answers_interval)}[args.known_answers]  # fmt: skip
        for n in (int(s) for s in args.sizes.split(",")):
            for answers_every in every:
                checks = f", checks every {answers_every} s" if answers_every else ""
                print(f"# N = {n}{checks}", flush=True)
                results.append(phase(fleet, n, args, directory, answers_every))
                print(json.dumps(results[-1]), flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1) + "\n")
    finally:
        if fleet is not None:
            if fleet.load is not None:
                fleet.load.stop()
            if fleet.answers is not None:
                fleet.answers.stop()
            fleet.control_plane.down(fleet.cluster.directory)
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
