"""Engines: what executes a batch. Only modules in this package import ONNX Runtime,
TensorRT or CUDA bindings."""
