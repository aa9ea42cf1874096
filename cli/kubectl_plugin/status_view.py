"""`kubectl infd status NAME` and `answers NAME`: an InferenceDeployment's status as a
person reads it. Pure: the object as the API server returns it, and `now` for the ages,
in; lines out.

Five blocks: the summary (phase, Ready and Degraded with their reasons and messages, the
replicas), the versions (the engine the spec asks for, the serving version and the shadow
candidate with its figures against the thresholds), the quality watch (overall, the worst
class and slice, what drifts), the pods taken out for wrong answers (where there are any;
`kubectl infd answers NAME` prints that block alone, always) and the conditions. A figure
the operator has not read yet is `-`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

Obj = dict[str, Any]
NONE = "-"


def table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Aligned columns, kubectl's way: upper-case headers, three spaces between columns."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        indent + "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def short(digest: str | None) -> str:
    """`sha256:` and the first 12 hex digits, as `docker images` shortens an id."""
    if not digest:
        return NONE
    algorithm, _, hexdigits = digest.partition(":")
    return f"{algorithm}:{hexdigits[:12]}" if hexdigits else digest


def figure(value: Any, digits: int = 4) -> str:
    if value is None:
        return NONE
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if value else "0"
    return str(value)


def age(since: str | None, now: datetime) -> str:
    """kubectl's ages: 42s, 5m, 3h, 2d."""
    if not since:
        return NONE
    seconds = int((now - datetime.fromisoformat(since.replace("Z", "+00:00"))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def condition(status: Obj, type_: str) -> Obj:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def said(found: Obj) -> str:
    if not found:
        return NONE
    words = f"{found.get('status')}  {found.get('reason', '')}"
    return f"{words}: {found['message']}" if found.get("message") else words


def summary(obj: Obj) -> list[str]:
    metadata, status = obj.get("metadata") or {}, obj.get("status") or {}
    generation, observed = metadata.get("generation"), status.get("observedGeneration")
    seen = "" if observed == generation else f" (the operator has seen generation {observed})"
    pairs = [
        ("Name", metadata.get("name", "")),
        ("Namespace", metadata.get("namespace", "")),
        ("Phase", status.get("phase", "Pending") + seen),
        ("Ready", said(condition(status, "Ready"))),
        ("Degraded", said(condition(status, "Degraded"))),
        ("Replicas", f"{status.get('readyReplicas', 0)} of {status.get('replicas', 0)} ready"),
    ]
    return [f"{key + ':':<11} {value}" for key, value in pairs]


def versions(status: Obj) -> list[str]:
    engine = status.get("engine") or {}
    serving = status.get("serving") or {}
    candidate = status.get("candidate") or {}
    metrics = status.get("metrics") or {}
    built = " ".join(
        str(engine[key]) for key in ("backend", "precision", "target") if engine.get(key)
    )
    lines = [
        f"Engine:     {engine.get('digest') or NONE}  {built}".rstrip(),
        "",
        "VERSIONS",
    ]
    header = ["ROLE", "VERSION", "ENGINE", "VERDICT", "SAMPLES", "TOP-1", "MAX-DIFF", "P99-MS"]
    rows = [
        ["serving", serving.get("version") or NONE, short(serving.get("engineDigest")),
         NONE, NONE, NONE, NONE, figure(metrics.get("p99Milliseconds"), 1)],
    ]  # fmt: skip
    if candidate:
        p99 = figure(candidate.get("candidateP99Milliseconds"), 1)
        if candidate.get("servingP99Milliseconds") is not None:
            p99 += f" (serving {figure(candidate['servingP99Milliseconds'], 1)})"
        rows.append([
            "candidate", candidate.get("version") or NONE, short(candidate.get("engineDigest")),
            candidate.get("verdict", NONE), figure(candidate.get("samples")),
            figure(candidate.get("top1Agreement")),
            figure(candidate.get("maxAbsoluteDifference")), p99,
        ])  # fmt: skip
    lines += table(header, rows)
    if candidate:
        why = candidate.get("reason") or NONE
        message = candidate.get("message")
        lines.append(f"  Candidate {candidate.get('engineDigest')}: {why}")
        if message:
            lines.append(f"    {message}")
    return lines


def quality(status: Obj) -> list[str]:
    watch = status.get("qualityWatch")
    if not watch:
        return []
    lines = [
        f"QUALITY WATCH  {watch.get('state', 'Pending')}  window {watch.get('windowSeconds', 0)} s"
        f"  reference {short(watch.get('referenceEngineDigest'))}",
    ]
    header = ["GROUP", "SAMPLES", "TOP-1", "THRESHOLD"]
    rows = [["overall", figure(watch.get("samples")), figure(watch.get("top1Agreement")), NONE]]
    for key, label in (("worstClass", "worst class"), ("worstSlice", "worst slice")):
        group = watch.get(key)
        if group:
            rows.append([
                f"{label} {group.get('name', '')}".rstrip(), figure(group.get("samples")),
                figure(group.get("top1Agreement")), figure(group.get("threshold")),
            ])  # fmt: skip
    lines += table(header, rows)
    drifting = [
        f"{g.get('kind')} {g.get('name', '')}".rstrip() for g in watch.get("drifting") or []
    ]
    lines.append(f"  Drifting: {', '.join(drifting) or 'none'}")
    lines.append(f"  Mean |difference|: {figure(watch.get('meanAbsoluteDifference'))}")
    if watch.get("message"):
        lines.append(f"  {watch['message']}")
    return lines


def _device(record: Obj) -> str:
    if record.get("gpuProduct"):
        return " ".join(str(record[k]) for k in ("gpuProduct", "gpuUuid") if record.get(k))
    return str(record.get("cpuModel") or NONE)


def _error(record: Obj) -> str:
    """The probe's error and its tolerance; `not finite` where the runtime reported a NaN
    or an infinity (the status leaves the error unset), `-` for a disagreement."""
    if record.get("error") is None:
        return "not finite" if record.get("reason") == "KnownAnswersFailed" else NONE
    error = figure(float(record["error"]))
    tolerance = record.get("tolerance")
    return f"{error} (tolerance {figure(float(tolerance))})" if tolerance is not None else error


def wrong_answers(obj: Obj, now: datetime, always: bool = False) -> list[str]:
    """The pods the known-answer checks took out of serving (status.wrongAnswers, newest
    first) and the suspect nodes. Nothing when there are none, unless `always` (the
    `answers` command, which then says the checks' state)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    records = status.get("wrongAnswers") or []
    if not records and not always:
        return []
    lines = ["WRONG ANSWERS"]
    if spec.get("knownAnswers") is None:
        lines.append("  Known-answer checks are off (spec.knownAnswers is unset)")
    else:
        lines.append(f"  AnswersCorrect: {said(condition(status, 'AnswersCorrect'))}")
    if records:
        header = ["POD", "NODE", "DEVICE", "ENGINE", "REASON", "OUTPUT", "PROBE", "ERROR", "AGE"]
        rows = [
            [str(r.get("pod", "")), r.get("node") or NONE, _device(r),
             short(r.get("engineDigest")), str(r.get("reason", "")), r.get("output") or NONE,
             figure(r.get("probe")), _error(r), age(r.get("detected"), now)]
            for r in records
        ]  # fmt: skip
        lines += table(header, rows)
    elif always:
        lines.append("  No pod taken out")
    suspect = status.get("suspectNodes") or []
    if suspect:
        lines.append(
            f"  Suspect nodes: {', '.join(suspect)} (pods of different engines answered wrong "
            "there: the node is the likely cause)"
        )
    return lines


def conditions(status: Obj, now: datetime) -> list[str]:
    rows = [
        [c.get("type", ""), c.get("status", ""), c.get("reason", ""),
         age(c.get("lastTransitionTime"), now)]
        for c in status.get("conditions") or []
    ]  # fmt: skip
    return ["CONDITIONS", *table(["TYPE", "STATUS", "REASON", "AGE"], rows)]


def render(obj: Obj, now: datetime) -> str:
    """The whole view, blocks separated by a blank line."""
    status = obj.get("status") or {}
    blocks = [
        summary(obj),
        versions(status),
        quality(status),
        wrong_answers(obj, now),
        conditions(status, now),
    ]
    return "\n\n".join("\n".join(block) for block in blocks if block) + "\n"
