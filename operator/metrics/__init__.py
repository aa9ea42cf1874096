"""The runtime pods' metrics as the operator reads them: for shadow verdicts, the
autoscaler and the status.

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
