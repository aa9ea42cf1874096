"""Generates the InferenceDeployment CRD from the pydantic models."""
