"""Autoscaling decisions: the replica count the load calls for. Pure."""
