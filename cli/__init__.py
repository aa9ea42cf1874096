"""What uses both planes, above both: the local mode (`kubeinfer up`), which installs the
operator on a local cluster and serves through the runtime. The operator and the runtime
never import this package."""
