"""The runtime pods' metrics as the operator reads them: shadow verdicts now, the
autoscaler and the status next.

- `source`: the `MetricsSource` protocol and `MetricsUnavailable`.
- `prometheus`, `direct`: its two implementations (I/O); `factory` chooses one.
- `queries`: the named queries, each in PromQL and in its direct-read form (pure), over
  `samples` (parsed scrapes, pure), `promql` (literals, pod regex) and `pods` (where to
  scrape, pure).
- `shadow`: `read_shadow_aggregates`, the shadow verdict's input.

Nothing is imported here, so the pure modules stay importable without the I/O ones.
"""
