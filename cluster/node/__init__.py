"""The node agent: the one Node of a local cluster, its scheduler and its kubelet, running
pods' containers as local processes (see `agent`)."""
