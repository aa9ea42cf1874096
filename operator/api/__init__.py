"""The InferenceDeployment API: versioned pydantic models, the source of the CRD."""
