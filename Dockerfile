# kubeinfer: one image per side, each installing only what it runs (pyproject.toml's extras).
#
#   docker build --target operator    -t kubeinfer-operator .     # the kopf operator (+ validate, render, crds)
#   docker build --target runtime     -t kubeinfer-runtime .      # serve and build on CPU (ONNX Runtime)
#   docker build --target runtime-gpu -t kubeinfer-runtime-gpu .  # serve and build with TensorRT
#
# The runtime images also run the engine build Jobs. Every image runs as a non-root user
# (65532) and writes nothing outside /tmp (HOME) and the mounted engine cache, so pods can
# use readOnlyRootFilesystem; bytecode is compiled at install time.
# Unverified on the development machines: they have no Docker engine.

ARG PYTHON_BASE=python:3.11-slim
# NVIDIA's TensorRT image, pinned: 25.01 ships TensorRT 10.8, CUDA 12.8 and Python 3.12
# (Ubuntu 24.04); the gpu extra accepts TensorRT 10.x and finds the image's own.
ARG TENSORRT_BASE=nvcr.io/nvidia/tensorrt:25.01-py3

# -- the wheel, built once for all targets ----------------------------------------------
FROM ${PYTHON_BASE} AS wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY operator ./operator
COPY runtime ./runtime
COPY cluster ./cluster
COPY cli ./cli
COPY examples ./examples
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# -- the operator ------------------------------------------------------------------------
FROM ${PYTHON_BASE} AS operator-install
COPY --from=wheel /wheels /wheels
RUN python -m venv /opt/kubeinfer \
 && /opt/kubeinfer/bin/pip install --no-cache-dir "$(ls /wheels/kubeinfer-*.whl)[operator]"

FROM ${PYTHON_BASE} AS operator
COPY --from=operator-install /opt/kubeinfer /opt/kubeinfer
ENV PATH=/opt/kubeinfer/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65532:65532
ENTRYPOINT ["kubeinfer"]
CMD ["operator"]

# -- the CPU runtime ---------------------------------------------------------------------
FROM ${PYTHON_BASE} AS runtime-install
COPY --from=wheel /wheels /wheels
RUN python -m venv /opt/kubeinfer \
 && /opt/kubeinfer/bin/pip install --no-cache-dir "$(ls /wheels/kubeinfer-*.whl)[runtime]"

FROM ${PYTHON_BASE} AS runtime
COPY --from=runtime-install /opt/kubeinfer /opt/kubeinfer
ENV PATH=/opt/kubeinfer/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["kubeinfer"]
CMD ["serve", "--help"]

# -- the GPU runtime: TensorRT from NVIDIA's image, pycuda built against its CUDA ----------
FROM ${TENSORRT_BASE} AS runtime-gpu
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY --from=wheel /wheels /wheels
# --system-site-packages: the image's TensorRT (its Python bindings) satisfies the extra.
RUN python3 -m venv --system-site-packages /opt/kubeinfer \
 && /opt/kubeinfer/bin/pip install --no-cache-dir "$(ls /wheels/kubeinfer-*.whl)[gpu]" \
 && rm -rf /wheels
ENV PATH=/opt/kubeinfer/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["kubeinfer"]
CMD ["serve", "--help"]
