"""Engines: what executes a batch. Only modules in this package import ONNX Runtime,
TensorRT or CUDA bindings.

Serving alone uses two of them (`.importlinter`'s building-does-not-serve): `gpu_memory`,
each GPU's memory read through NVML for the runtime's gauges, and `buffer_fit`, whether
the execution slots' buffers (`base.slot_buffer_bytes`) fit in the memory the process may
use, asked before they are allocated."""
