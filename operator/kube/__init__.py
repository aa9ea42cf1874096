"""I/O with the Kubernetes API: the client, gathering observations, applying decisions."""
