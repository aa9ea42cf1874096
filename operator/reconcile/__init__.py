"""Reconciliation's pure core: observed state in, desired children, status and events
out. Nothing here imports kopf, the Kubernetes client or does I/O."""
