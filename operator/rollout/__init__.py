"""Shadow rollout decisions: the verdict on a candidate and what the rollout does next. Pure."""
