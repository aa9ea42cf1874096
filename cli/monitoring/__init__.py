"""The chart's monitoring, written as code: the alert rules (`alerts`) and the Grafana
dashboard (`dashboard`), both quoting the contract's series through `promql`, rendered
into `helm/kubeinfer/files/monitoring/` by `python -m kubeinfer.cli.monitoring --write`
(`render`). Above both planes: it reads the runtime's series and the operator's condition
types and reasons, and neither plane imports it. Only generation needs
`grafana-foundation-sdk` (the `dev` extra); the chart ships the rendered files."""
