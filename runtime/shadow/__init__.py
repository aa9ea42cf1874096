"""Mirroring in the data plane: a share of this runtime's answered requests goes to a
shadow candidate (to judge it) and to a quality watch's reference (to judge this runtime's
own reduced-precision engine), and each answer is compared with our own, request by
request.

`controller` follows the mirror target file (`target`) and owns one `mirror` (bounded
queue, workers, HTTP client) and one `aggregates` (running figures and the
`kubeinfer_shadow_*` metrics, labelled by `role`) per role; `quality` adds the watch's
slices and exemplars. `comparison` (with `divergence`), `sampling`, `slices` and
`exemplars` are the pure decisions. The operator reads the metrics, promotes or rolls a
candidate back, and reports a quality drift.
"""
