"""A pod's file system on the shared node (`kubeinfer.cluster.node.paths`), table-driven:
`PathMap.apply` rewrites a mount path only as whole leading path components (`/tmp` in
`/tmp/x`, `--config=/tmp/x` and `file:///tmp/x`, never in `/var/tmp`, `/tmpfoo` or a
relative `a/tmp`), the longest mount first; `host_path` finds the innermost mount; and
`resolve_services` sends a Service's cluster DNS URL to a ready endpoint, leaving alone
URLs with no endpoint and hosts that merely contain `.svc.`."""

from __future__ import annotations

import pytest
from kubeinfer.cluster.node.paths import PathMap, resolve_services, service_references

TMP = "/node/pods/ml_runtime-0_1a2b3c4d/volumes/tmp"
CONFIG = "/node/pods/ml_runtime-0_1a2b3c4d/volumes/config"
MIRROR = "/node/pods/ml_runtime-0_1a2b3c4d/volumes/mirror"
CACHE = "/node/claims/ml/engine-cache"
TERMINATION = "/node/pods/ml_runtime-0_1a2b3c4d/termination/runtime"
MOUNTS = PathMap({
    "/tmp": TMP,
    "/etc/kubeinfer": CONFIG,
    "/etc/kubeinfer-mirror": MIRROR,
    "/cache/": CACHE + "/",  # a mount path written with a trailing slash
    "/dev/termination-log": TERMINATION,
})  # fmt: skip

REWRITES = [
    ("/tmp", TMP),
    ("/tmp/", f"{TMP}/"),
    ("/tmp/model.onnx", f"{TMP}/model.onnx"),
    ("--config=/etc/kubeinfer/runtime.yaml", f"--config={CONFIG}/runtime.yaml"),
    ("/etc/kubeinfer-mirror/target", f"{MIRROR}/target"),
    ("/etc/kubeinfer/a /etc/kubeinfer-mirror/b", f"{CONFIG}/a {MIRROR}/b"),
    ("file:///tmp/model.onnx", f"file://{TMP}/model.onnx"),
    ("cache: /cache/engines\n", f"cache: {CACHE}/engines\n"),
    ("cache: /cache\n", f"cache: {CACHE}\n"),
    ('{"path": "/cache/e"}', f'{{"path": "{CACHE}/e"}}'),
    ("'/tmp/x'", f"'{TMP}/x'"),
    ("PATH=/bin:/tmp:/usr/bin", f"PATH=/bin:{TMP}:/usr/bin"),
    ("/dev/termination-log", TERMINATION),
    ("echo done > /dev/termination-log", f"echo done > {TERMINATION}"),
    ("dirs=(/tmp)", f"dirs=({TMP})"),
    # Not the mount: a longer name, a path inside another directory, a relative path.
    ("/var/tmp/model.onnx", "/var/tmp/model.onnx"),
    ("/tmpfoo/x", "/tmpfoo/x"),
    ("/tmp.d/x", "/tmp.d/x"),
    ("models/tmp/x", "models/tmp/x"),
    ("~/tmp", "~/tmp"),
    ("./tmp", "./tmp"),
    ("/etc/kubeinfer-other/x", "/etc/kubeinfer-other/x"),
    ("file:///var/tmp/model.onnx", "file:///var/tmp/model.onnx"),
    ("https://example.com/tmp/x", "https://example.com/tmp/x"),
    ("/cachet", "/cachet"),
    ("/dev/termination-log2", "/dev/termination-log2"),
    ("", ""),
]


@pytest.mark.parametrize(("text", "expected"), REWRITES, ids=[t or "(empty)" for t, _ in REWRITES])
def test_apply_rewrites_whole_path_components_only(text: str, expected: str) -> None:
    assert MOUNTS.apply(text) == expected


def test_the_innermost_of_nested_mounts_wins() -> None:
    nested = PathMap({"/data": "/host/a", "/data/models": "/host/b"})
    assert nested.apply("/data/models/m.onnx") == "/host/b/m.onnx"
    assert nested.apply("/data/modelsx/m.onnx") == "/host/a/modelsx/m.onnx"
    assert nested.apply("/data/other") == "/host/a/other"
    assert nested.host_path("/data/models/m.onnx") == "/host/b/m.onnx"
    assert nested.host_path("/data/models") == "/host/b"
    assert nested.host_path("/data/x") == "/host/a/x"


@pytest.mark.parametrize(
    ("path", "host"),
    [
        ("/tmp/work", f"{TMP}/work"),
        ("/cache/engines", f"{CACHE}/engines"),
        ("/tmpfoo", None),
        ("/var/tmp", None),
        ("/", None),
    ],
)
def test_host_path_of_a_working_directory(path: str, host: str | None) -> None:
    assert MOUNTS.host_path(path) == host


def test_no_mounts_leave_text_alone() -> None:
    assert PathMap({}).apply("/tmp/x") == "/tmp/x"
    assert PathMap({"/": "/host"}).apply("/tmp/x") == "/tmp/x"  # the root is never rewritten


RUNTIME = ("ml", "runtime", 8000)
ENDPOINTS = {RUNTIME: "10.244.0.5:8000", ("ml", "shadow", None): "10.244.0.9:8000"}
SERVICE_URLS = [
    ("http://runtime.ml.svc:8000/v2/models", "http://10.244.0.5:8000/v2/models"),
    ("http://runtime.ml.svc.cluster.local:8000/v2", "http://10.244.0.5:8000/v2"),
    ("url: http://shadow.ml.svc/v2/health/ready", "url: http://10.244.0.9:8000/v2/health/ready"),
    ("https://shadow.ml.svc.cluster.local", "https://10.244.0.9:8000"),
    ("a http://runtime.ml.svc:8000 b http://shadow.ml.svc c",
     "a http://10.244.0.5:8000 b http://10.244.0.9:8000 c"),
    # No ready endpoint for that Service or port: the URL stays, and its connection fails.
    ("http://runtime.ml.svc:9000/x", "http://runtime.ml.svc:9000/x"),
    ("http://runtime.other.svc:8000/x", "http://runtime.other.svc:8000/x"),
    # Not a Service's cluster DNS name.
    ("http://runtime.ml:8000/x", "http://runtime.ml:8000/x"),
    ("http://auth.ml.svc.example.com/x", "http://auth.ml.svc.example.com/x"),
    ("http://shadow.ml.svc.cluster.localhost/x", "http://shadow.ml.svc.cluster.localhost/x"),
    ("ftp://runtime.ml.svc:8000/x", "ftp://runtime.ml.svc:8000/x"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), SERVICE_URLS, ids=[t for t, _ in SERVICE_URLS])
def test_resolve_services_sends_cluster_dns_urls_to_a_ready_endpoint(
    text: str, expected: str
) -> None:
    assert resolve_services(text, ENDPOINTS) == expected


def test_service_references_name_namespace_service_and_port() -> None:
    text = "http://runtime.ml.svc:8000/a https://shadow.team-a.svc.cluster.local/b http://x.y:1"
    assert service_references(text) == [("ml", "runtime", 8000), ("team-a", "shadow", None)]
