"""The Open Inference Protocol v2 on the wire: request/response types, the tensor codec
(JSON and Triton's binary tensor extension) and the errors that carry HTTP statuses."""
