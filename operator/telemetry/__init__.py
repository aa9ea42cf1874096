"""The operator's own telemetry, apart from the runtime metrics it reads
(`metrics_sources`): the counters of its activity (`activity`: passes, requests, reads)
and the /metrics endpoint that exports them with what each object's last pass wrote
(`exporter`)."""
