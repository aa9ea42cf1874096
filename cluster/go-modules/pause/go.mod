// Builds the pod sandbox's `pause` process (main.go): ours, since no image registry is
// reachable to pull registry.k8s.io/pause, and Kubernetes' own is C.
module kubeinfer.io/hack/pause

go 1.26.0
