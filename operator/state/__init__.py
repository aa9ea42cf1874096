"""What every decision reads, below every decider: the observed state of one
InferenceDeployment and its children (`observed`), what a pass decides (`decision`), the
names and labels they carry (`names`), and the facts read off them that several deciders
share: which engine serves and which is building (`engine_state`), which runtime pod
fails and why (`runtime_failures`), the serving pods as the autoscaler counts them
(`serving_pods`), the shadow's readings (`shadow_readings`) and the autoscaler's inputs
(`scaling_inputs`). Pure: no I/O, no kopf."""
