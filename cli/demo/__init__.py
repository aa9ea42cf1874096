"""`kubeinfer demo`: the main job end to end on a built-in model, with no cluster and no
GPU. It composes both planes, so it lives on the control plane's side of the layering."""
