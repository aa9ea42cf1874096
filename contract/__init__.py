"""What the operator and the runtime agree on, in one package both import and neither
owns: the API model base (`api_model`), the runtime's configuration that the operator
renders and `kubeinfer serve` reads (`runtime_config`), and every Prometheus series of
both planes (`metric_series`: the runtime's, which the operator queries, and the
operator's own), the cost of 1,000 inferences in Python and PromQL (`cost`: the operator's
status, the dashboard and `kubeinfer tune` share it); and, as the lowest layer the operator
and the command line share, the writing and checking of generated files
(`generated_files`). It imports neither plane."""
