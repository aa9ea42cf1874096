# kubeinfer: one image for the operator, the engine build Jobs and the runtime pods
# (CPU: ONNX Runtime). For TensorRT, build with a CUDA/TensorRT base and the gpu extra:
#   docker build --build-arg BASE=nvcr.io/nvidia/tensorrt:24.08-py3 --build-arg EXTRAS=gpu .
# The image runs as a non-root user and writes nothing outside /tmp and the mounted engine
# cache, so pods can use readOnlyRootFilesystem.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ARG EXTRAS=""
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY operator ./operator
COPY runtime ./runtime
RUN python -m venv /opt/kubeinfer \
 && /opt/kubeinfer/bin/pip install --no-cache-dir --upgrade pip "setuptools>=75" \
 && /opt/kubeinfer/bin/pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}"

FROM ${BASE}
COPY --from=build /opt/kubeinfer /opt/kubeinfer
ENV PATH=/opt/kubeinfer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["kubeinfer"]
CMD ["--help"]
