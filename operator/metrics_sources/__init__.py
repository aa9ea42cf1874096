"""The runtime pods' metrics as the operator reads them, for shadow verdicts, the
autoscaler and the status: where from (Prometheus, or the pods' own /metrics) and what.
The operator's own /metrics (what it exports about itself) are another package's.

- `source`: the `MetricsSource` protocol and `MetricsUnavailable`.
- `prometheus`, `direct`: its two implementations (I/O); `factory` chooses one.
- `queries`: the named queries, each in PromQL and in its direct-read form (pure), over
  `samples` (parsed scrapes, pure), `promql` (literals, pod regex) and `pods` (where to
  scrape, pure).
- `shadow`: `read_shadow_aggregates`, the shadow verdict's input.
- `scaling`: `read_scaling_signals`, the autoscaler's input (with the object's PromQL
  overrides).

Nothing is imported here, so the pure modules stay importable without the I/O ones.
"""
