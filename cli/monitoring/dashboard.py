"""The chart's Grafana dashboard, built with Grafana's own typed builders
(`grafana-foundation-sdk`) from the contract's series: serving latency by model version,
the batch queue, batch sizes, the shadow and the quality watch, the known-answer checks,
GPU memory and replicas, and the cost of 1,000 inferences.
Rendered once into `helm/kubeinfer/files/monitoring/grafana-dashboard.json`, which the
chart ships in a ConfigMap for Grafana's dashboard sidecar.

Each panel is a `PanelSpec` first (a title, a unit, PromQL targets from `promql`), so the
panels can be listed apart from Grafana's model; `build()` lays them out two to a row
under section rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kubeinfer.cli.monitoring import promql
from kubeinfer.contract import cost
from kubeinfer.contract import metric_series as series

UID = "kubeinfer"
WINDOW = "$__rate_interval"
NAMESPACE = {"namespace": "=~$namespace"}
SERVING = {**NAMESPACE, "model": "=~$model"}
VERSION = ("model", "version")
COST_WINDOW_SECONDS = 3600
"""The cost panel's window: the hour `cost.windowSeconds` defaults to."""
COST_RESOLUTION_SECONDS = 15
"""How finely the cost panel counts the pods' seconds: each pod's start and end to within
this (a subquery step)."""


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    targets: tuple[Target, ...]
    kind: Literal["timeseries", "heatmap"] = "timeseries"
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Section:
    title: str
    panels: tuple[PanelSpec, ...] = field(default_factory=tuple)


def _quantiles(
    family: series.Series, group: Sequence[str], legend: str, **match: str
) -> tuple[Target, ...]:
    return tuple(
        Target(promql.quantile(q, family, group, WINDOW, **match), f"p{round(q * 100)} {legend}")
        for q in (0.5, 0.95, 0.99)
    )


def _agreement(by: str, rows: series.Series, agreements: series.Series, role: str) -> str:
    group = ("model", "serving_version", by) if by else ("model", "candidate_version")
    return promql.ratio(agreements, rows, group, WINDOW, {**SERVING, "role": role})


SECTIONS = (
    Section(
        "Serving",
        (
            PanelSpec(
                "Latency by model version",
                "p50, p95 and p99 of the time from a request's arrival to its response, over "
                "every serving pod, and the p99 objective (slo.p99LatencyMilliseconds).",
                "s",
                (
                    *_quantiles(
                        series.REQUEST_DURATION, VERSION, "{{model}} v{{version}}", **SERVING
                    ),
                    Target(
                        promql.gauge(series.SLO_P99_LATENCY, VERSION, **SERVING),
                        "p99 objective {{model}} v{{version}}",
                    ),
                ),
            ),
            PanelSpec(
                "Requests by status code",
                "Inference requests answered per second; 503 is the batch queue full.",
                "reqps",
                (
                    Target(
                        promql.summed_rate(series.REQUESTS, (*VERSION, "code"), WINDOW, **SERVING),
                        "{{model}} v{{version}} {{code}}",
                    ),
                ),
            ),
            PanelSpec(
                "Queue depth",
                "Requests waiting in the batch queues, summed over the serving pods.",
                "short",
                (
                    Target(
                        promql.gauge(series.QUEUE_DEPTH, VERSION, "sum", **SERVING),
                        "{{model}} v{{version}}",
                    ),
                ),
                min=0,
            ),
            PanelSpec(
                "Time in queue",
                "How long requests waited in the queue before their batch started.",
                "s",
                _quantiles(series.QUEUE_DURATION, VERSION, "{{model}} v{{version}}", **SERVING),
            ),
            PanelSpec(
                "Batch size distribution",
                "Batches run per second by rows per batch (the bucket's upper bound).",
                "short",
                (
                    Target(
                        promql.summed_rate(series.BATCH_SIZE, ("le",), WINDOW, "bucket", **SERVING),
                        "{{le}}",
                    ),
                ),
                kind="heatmap",
            ),
        ),
    ),
    Section(
        "Shadow and quality watch",
        (
            PanelSpec(
                "Shadow top-1 agreement",
                "Share of compared rows whose top-1 class the candidate and the serving engine "
                "agree on.",
                "percentunit",
                (
                    Target(
                        _agreement(
                            "", series.SHADOW_TOP1_ROWS, series.SHADOW_TOP1_AGREEMENTS, "shadow"
                        ),
                        "{{model}} candidate v{{candidate_version}}",
                    ),
                ),
                max=1,
            ),
            PanelSpec(
                "Candidate versus serving latency (p99)",
                "Server time of the same mirrored requests: the candidate's own, and the "
                "serving pods'.",
                "s",
                (
                    Target(
                        promql.quantile(
                            0.99,
                            series.SHADOW_CANDIDATE_DURATION,
                            ("model", "candidate_version"),
                            WINDOW,
                            **SERVING,
                            role="shadow",
                        ),
                        "candidate {{model}} v{{candidate_version}}",
                    ),
                    Target(
                        promql.quantile(
                            0.99,
                            series.SHADOW_SERVING_DURATION,
                            ("model", "serving_version"),
                            WINDOW,
                            **SERVING,
                            role="shadow",
                        ),
                        "serving {{model}} v{{serving_version}}",
                    ),
                ),
            ),
            PanelSpec(
                "Quality watch: agreement by reference class",
                "Top-1 agreement of the served engine with its reference, by the class the "
                "reference gives the row.",
                "percentunit",
                (
                    Target(
                        _agreement(
                            "reference_class",
                            series.SHADOW_CLASS_TOP1_ROWS,
                            series.SHADOW_CLASS_TOP1_AGREEMENTS,
                            "quality",
                        ),
                        "{{model}} v{{serving_version}} class {{reference_class}}",
                    ),
                ),
                max=1,
            ),
            PanelSpec(
                "Quality watch: agreement by slice",
                "Top-1 agreement with the reference by the request's slice (the watch's slice "
                "header).",
                "percentunit",
                (
                    Target(
                        _agreement(
                            "slice",
                            series.SHADOW_SLICE_TOP1_ROWS,
                            series.SHADOW_SLICE_TOP1_AGREEMENTS,
                            "quality",
                        ),
                        "{{model}} v{{serving_version}} {{slice}}",
                    ),
                ),
                max=1,
            ),
        ),
    ),
    Section(
        "Known answers",
        (
            PanelSpec(
                "Pods taken out for wrong answers",
                "Pods the operator's known-answer checks took out of serving that still exist "
                "(status.wrongAnswers), per InferenceDeployment, node and reason; each is kept "
                "as evidence until deleted.",
                "short",
                (
                    Target(
                        promql.gauge(
                            series.INFERENCE_DEPLOYMENT_WRONG_ANSWERS,
                            ("namespace", "name", "node", "reason"),
                            "sum",
                            **NAMESPACE,
                        ),
                        "{{name}} on {{node}} ({{reason}})",
                    ),
                ),
                min=0,
            ),
            PanelSpec(
                "Known-answer error over tolerance",
                "Each serving pod's latest known-answer run: its worst probe error on each "
                "output over that output's tolerance. Above 1 fails; a pod creeping towards "
                "it computes differently from the build node.",
                "short",
                (
                    Target(
                        promql.gauge(
                            series.KNOWN_ANSWER_ERROR_RATIO,
                            ("namespace", "pod", "output"),
                            **SERVING,
                        ),
                        "{{pod}} {{output}}",
                    ),
                ),
                min=0,
            ),
        ),
    ),
    Section(
        "Capacity",
        (
            PanelSpec(
                "GPU memory used",
                "Used over total per device of each serving pod (NVML; absent on CPU pods).",
                "percentunit",
                (
                    Target(
                        promql.gauge(
                            series.GPU_MEMORY_USED, ("namespace", "pod", "device"), **NAMESPACE
                        )
                        + "\n/\n"
                        + promql.gauge(
                            series.GPU_MEMORY_TOTAL, ("namespace", "pod", "device"), **NAMESPACE
                        ),
                        "{{pod}} GPU {{device}}",
                    ),
                ),
                min=0,
                max=1,
            ),
            PanelSpec(
                "Replicas desired and ready",
                "The operator's status.replicas and status.readyReplicas per InferenceDeployment.",
                "short",
                (
                    Target(
                        promql.gauge(
                            series.INFERENCE_DEPLOYMENT_REPLICAS, ("namespace", "name"), **NAMESPACE
                        ),
                        "{{name}} desired",
                    ),
                    Target(
                        promql.gauge(
                            series.INFERENCE_DEPLOYMENT_READY_REPLICAS,
                            ("namespace", "name"),
                            **NAMESPACE,
                        ),
                        "{{name}} ready",
                    ),
                ),
                min=0,
            ),
        ),
    ),
    Section(
        "Cost",
        (
            PanelSpec(
                "Cost of 1,000 inferences (last hour)",
                "What 1,000 inferences cost over the hour before each point, per "
                "InferenceDeployment: each serving pod's share of its node times the node's "
                "price per hour (the operator's settings.cost.pricePerNodeHour, in their "
                "currency), for the seconds it ran, idle or not, over the inferences those pods "
                "answered (HTTP 200). The status shows the same formula over cost.windowSeconds "
                "(`kubectl get infd -o wide`, Cost/1k). Empty without prices or inferences.",
                "short",
                (
                    Target(
                        cost.per_thousand_inferences_promql(
                            COST_WINDOW_SECONDS, COST_RESOLUTION_SECONDS, 'namespace=~"$namespace"'
                        ),
                        "{{namespace}}/{{name}}",
                    ),
                ),
                min=0,
            ),
        ),
    ),
)


def build() -> dict[str, Any]:
    """The dashboard's JSON model, as Grafana imports it."""
    from grafana_foundation_sdk.builders import dashboard, heatmap, prometheus, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import (
        DashboardCursorSync,
        DataSourceRef,
        GridPos,
        VariableRefresh,
    )
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    source = DataSourceRef(type_val="prometheus", uid="${datasource}")
    namespaces = promql.sample(series.REQUEST_DURATION, "count")
    board = (
        dashboard.Dashboard("kubeinfer")
        .uid(UID)
        .description(
            "Serving, batching, shadow rollouts, the quality watch and capacity of "
            "kubeinfer's InferenceDeployments."
        )
        .tags(["kubeinfer"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(
            dashboard.QueryVariable("namespace")
            .label("Namespace")
            .datasource(source)
            .query(f"label_values({namespaces}, namespace)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        .with_variable(
            dashboard.QueryVariable("model")
            .label("Model")
            .datasource(source)
            .query(f'label_values({namespaces}{{namespace=~"$namespace"}}, model)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    y, panel_id = 0, 1
    for section in SECTIONS:
        board = board.with_row(
            dashboard.Row(section.title).id(panel_id).grid_pos(GridPos(h=1, w=24, x=0, y=y))
        )
        panel_id, y = panel_id + 1, y + 1
        for index, spec in enumerate(section.panels):
            x = 0 if index % 2 == 0 else 12
            panel: Any = heatmap.Panel() if spec.kind == "heatmap" else timeseries.Panel()
            panel = (
                panel.id(panel_id)
                .title(spec.title)
                .description(spec.description)
                .unit(spec.unit)
                .datasource(source)
                .grid_pos(GridPos(h=8, w=12, x=x, y=y))
            )
            if spec.min is not None:
                panel = panel.min(spec.min)
            if spec.max is not None:
                panel = panel.max(spec.max)
            if spec.kind == "timeseries":
                panel = panel.fill_opacity(10).line_width(1)
            for ref, target in zip("ABCDEFGH", spec.targets, strict=False):
                query = (
                    prometheus.Dataquery()
                    .expr(target.expr)
                    .legend_format(target.legend)
                    .ref_id(ref)
                    .datasource(source)
                )
                if spec.kind == "heatmap":
                    query = query.format(PromQueryFormat.HEATMAP)
                panel = panel.with_target(query)
            board = board.with_panel(panel)
            panel_id += 1
            if index % 2 == 1 or index == len(section.panels) - 1:
                y += 8
    import json

    built: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return built


def panels() -> tuple[PanelSpec, ...]:
    return tuple(panel for section in SECTIONS for panel in section.panels)
