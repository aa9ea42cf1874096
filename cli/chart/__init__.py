"""The Helm chart's generated parts: its values and their schema, from one typed model
(`values`), rendered by `render` and written or checked by `python -m kubeinfer.cli.chart`."""
