"""What the operator and the runtime agree on, in one package both import and neither
owns: the API model base (`api_model`), the runtime's configuration that the operator
renders and `kubeinfer serve` reads (`runtime_config`), and the runtime's metric series
that the operator queries (`metrics`); and, as the lowest layer the operator and the
command line share, the writing and checking of generated files (`generated_files`). It
imports neither plane."""
