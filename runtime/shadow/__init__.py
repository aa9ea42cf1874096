"""Shadow rollouts in the data plane: mirror a share of this runtime's answered requests to
a candidate engine and compare its answers with our own, request by request.

`controller` follows the mirror target file (`target`) and owns the current candidate's
`mirror` (bounded queue, workers, HTTP client) and `aggregates` (running figures and the
`kubeinfer_shadow_*` metrics); `comparison` and `sampling` are the pure decisions. The
operator reads the metrics and promotes or rolls the candidate back.
"""
