# kubeinfer: one image per side, each installing only what it runs (pyproject.toml's extras,
# pinned with hashes in requirements/; docs/images.md).
#
#   make images                                       # operator and runtime, with podman
#   docker build --target operator    -t ghcr.io/kubeinfer/kubeinfer-operator:0.1.0 .
#   docker build --target runtime     -t ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0 .
#   docker build --target runtime-gpu -t ghcr.io/kubeinfer/kubeinfer-runtime-gpu:0.1.0 .
#
# Each image is its base, one layer of pinned dependencies (rebuilt only when its lock
# changes) and one small layer of the project itself, so a source change rebuilds in
# seconds; the runtime images have one more, the Rust data plane's extension
# (kubeinfer_dataplane), built in a stage of its own from runtime/native alone, so only a
# change there rebuilds it. Every image runs as uid 65532 and writes nothing outside /tmp
# (HOME) and its mounts, so pods can set readOnlyRootFilesystem; bytecode is compiled at
# install time. No pip, setuptools, wheel, compiler, cargo or rustc is left in the operator
# and runtime images.

# Python 3.11 on Debian 12, by digest (docker-library/repo-info's record of the tag).
# `make images` builds on a base made from Debian's packages instead (PYTHON_BASE), where no
# image registry is reachable.
ARG PYTHON_BASE=python:3.11.16-slim-bookworm@sha256:c425d915a89a6dcd3183b1797ad9bd8878caff5a417f6371c8df93c8ea8b727f
# The base of the stages that install Debian packages with apt-get (the Rust toolchain),
# none of them copied into an image: the same base, which has apt. `make images` passes
# its Debian base's builder twin, the same packages with apt (its images' base has none).
ARG BUILD_BASE=${PYTHON_BASE}
# NVIDIA's TensorRT image: 25.01 ships TensorRT 10.8, CUDA 12.8 and Python 3.12 on Ubuntu
# 24.04 (requirements/runtime-gpu.txt is locked for that Python; cuda-bindings < 13 for that
# CUDA). Add its digest where nvcr.io is reachable: it is not from the development machines.
ARG TENSORRT_BASE=nvcr.io/nvidia/tensorrt:25.01-py3

# -- tools: a pinned pip and setuptools in a venv of their own, never copied into an image --
FROM ${PYTHON_BASE} AS tools
# The builder's pip settings (a proxy's CA, a mirror), when it has any: `make images` passes
# the host's. Unset, pip uses its defaults. (Build arguments are per stage: each stage that
# downloads declares them.)
ARG PIP_CERT
ARG PIP_INDEX_URL
COPY requirements/build.txt /requirements/
RUN python -m venv /opt/pip \
 && /opt/pip/bin/pip install --no-cache-dir --disable-pip-version-check --require-hashes \
      --no-deps -r /requirements/build.txt

# -- the project's wheel, built from outside its source folder: run inside /src, Python
# would find the project's operator/ before the standard library's operator module --------
FROM tools AS wheel
COPY . /src
WORKDIR /build
RUN /opt/pip/bin/pip wheel --no-cache-dir --disable-pip-version-check --no-deps \
      --no-build-isolation --wheel-dir /wheels /src

# -- the Rust data plane (runtime/native) as the wheel of the extension kubeinfer_dataplane:
# Debian 12's Rust toolchain (rustc-web and cargo-web, 1.85: the workspace's rust-version)
# and the tools' pinned maturin. Only runtime/native is copied in, so the toolchain's layer
# is kept until the Dockerfile changes and the build's until a file of runtime/native does;
# neither stage is copied into an image, only the wheel is. The extension is abi3 (Python
# 3.11 and later): the one wheel serves the GPU image's Python 3.12 too.
FROM ${BUILD_BASE} AS rust-tools
# The pinned toolchain; where the mirror no longer has it (a point release moved
# bookworm's), the mirror's newest rustc-web and cargo-web, said in the log.
ARG RUST_DEBIAN_VERSION=1.85.0+dfsg3-1~deb12u3
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && { apt-get install -y --no-install-recommends rustc-web=${RUST_DEBIAN_VERSION} \
        cargo-web=${RUST_DEBIAN_VERSION} libstd-rust-web-dev=${RUST_DEBIAN_VERSION} \
      || { echo "rustc-web ${RUST_DEBIAN_VERSION} is gone from the mirror: its newest" \
           && apt-get install -y --no-install-recommends rustc-web cargo-web; }; } \
 && rm -rf /var/lib/apt/lists/* \
 && cargo --version && rustc --version
# The tools' venv (maturin), the same Python at the same path in both bases.
COPY --from=tools /opt/pip /opt/pip

FROM rust-tools AS dataplane
# The builder's CA bundle (a proxy that re-signs TLS), which cargo needs as pip does, when
# `make images` passes the host's; the crates Cargo.lock pins are fetched from crates.io.
ARG PIP_CERT
COPY runtime/native /native
WORKDIR /native/crates/python
# maturin from the crate's folder (nowhere near the project's operator/); the crates are
# fetched first, then built offline: every one Cargo.lock pins, at its checksum.
RUN export CARGO_HOME=/cargo ${PIP_CERT:+CARGO_HTTP_CAINFO=$PIP_CERT} \
 && cargo fetch --locked \
 && /opt/pip/bin/maturin build --release --locked --offline --out /dataplane \
 && rm -rf /native/target /cargo \
 && ls -l /dataplane

# -- the final images' common base: no installer, non-root, kubeinfer as the entry point ---
FROM ${PYTHON_BASE} AS base
# The base's own pip, setuptools and wheel, and the wheels ensurepip and Debian's venv keep.
# The user the images run as has a name: kopf (getpass) and others look the uid up.
RUN (python -m pip uninstall --yes --quiet pip setuptools wheel 2>/dev/null || true) \
 && rm -rf /usr/share/python-wheels /usr/local/lib/python3*/ensurepip/_bundled \
      /usr/lib/python3*/ensurepip/_bundled \
 && ! python -c "import pip" 2>/dev/null && ! python -c "import setuptools" 2>/dev/null \
 && echo "kubeinfer:x:65532:65532:kubeinfer:/tmp:/usr/sbin/nologin" >> /etc/passwd \
 && echo "kubeinfer:x:65532:" >> /etc/group
ENV PATH=/opt/kubeinfer/project/bin:/opt/kubeinfer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65532:65532
ENTRYPOINT ["kubeinfer"]

# -- the operator: the kopf operator, validate, render, crds ------------------------------
# Its dependencies: a venv without pip, filled by the tools' pip from the lock alone, so
# this layer is rebuilt only when the lock changes. The project goes to
# /opt/kubeinfer/project, which a .pth puts on the venv's path: a small layer of its own.
FROM tools AS operator-deps
ARG PIP_CERT
ARG PIP_INDEX_URL
COPY requirements/operator.txt /requirements/
RUN python -m venv --without-pip /opt/kubeinfer \
 && /opt/pip/bin/pip --python /opt/kubeinfer/bin/python install --no-cache-dir \
      --disable-pip-version-check --require-hashes --no-deps --only-binary :all: \
      -r /requirements/operator.txt \
 && for site in /opt/kubeinfer/lib/python3*/site-packages; do \
      echo /opt/kubeinfer/project > "$site/kubeinfer-project.pth"; done

FROM operator-deps AS operator-project
COPY --from=wheel /wheels /wheels
RUN /opt/pip/bin/pip --python /opt/kubeinfer/bin/python install --no-cache-dir \
      --disable-pip-version-check --no-deps --target /opt/kubeinfer/project /wheels/*.whl

FROM base AS operator
COPY --from=operator-deps /opt/kubeinfer /opt/kubeinfer
COPY --from=operator-project /opt/kubeinfer/project /opt/kubeinfer/project
CMD ["operator"]

# -- the CPU runtime: serve and build with ONNX Runtime, models from s3:// and gs:// ------
# (the engine build Jobs run in it too), graphs with onnxruntime-extensions operators; the
# same two layers as the operator's.
FROM tools AS runtime-deps
ARG PIP_CERT
ARG PIP_INDEX_URL
COPY requirements/runtime.txt /requirements/
RUN python -m venv --without-pip /opt/kubeinfer \
 && /opt/pip/bin/pip --python /opt/kubeinfer/bin/python install --no-cache-dir \
      --disable-pip-version-check --require-hashes --no-deps --only-binary :all: \
      -r /requirements/runtime.txt \
 && for site in /opt/kubeinfer/lib/python3*/site-packages; do \
      echo /opt/kubeinfer/project > "$site/kubeinfer-project.pth" \
      && echo /opt/kubeinfer/dataplane > "$site/kubeinfer-dataplane.pth"; done

# The Rust data plane's wheel, in /opt/kubeinfer/dataplane (on the venv's path by its .pth):
# a layer of its own, below the project's, rebuilt only when runtime/native changes.
FROM runtime-deps AS runtime-dataplane
COPY --from=dataplane /dataplane /dataplane
RUN /opt/pip/bin/pip --python /opt/kubeinfer/bin/python install --no-cache-dir \
      --disable-pip-version-check --no-deps --target /opt/kubeinfer/dataplane /dataplane/*.whl

FROM runtime-deps AS runtime-project
COPY --from=wheel /wheels /wheels
RUN /opt/pip/bin/pip --python /opt/kubeinfer/bin/python install --no-cache-dir \
      --disable-pip-version-check --no-deps --target /opt/kubeinfer/project /wheels/*.whl

FROM base AS runtime
COPY --from=runtime-deps /opt/kubeinfer /opt/kubeinfer
COPY --from=runtime-dataplane /opt/kubeinfer/dataplane /opt/kubeinfer/dataplane
COPY --from=runtime-project /opt/kubeinfer/project /opt/kubeinfer/project
# HTTP (v2 API, health, /metrics) and the conventional gRPC port (Triton's clients use
# 8001; the runtime listens there when its config sets grpcPort).
EXPOSE 8000 8001
CMD ["serve", "--help"]

# -- the GPU runtime: TensorRT from NVIDIA's image (unverified: no registry, no GPU here) --
# The venv sees the image's TensorRT through --system-site-packages; pycuda has no wheel
# and is built here against the image's CUDA, with the image's compiler.
FROM ${TENSORRT_BASE} AS gpu-tools
ARG PIP_CERT
ARG PIP_INDEX_URL
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY requirements/build.txt /requirements/
RUN python3 -m venv /opt/pip \
 && /opt/pip/bin/pip install --no-cache-dir --disable-pip-version-check --require-hashes \
      --no-deps -r /requirements/build.txt

FROM gpu-tools AS runtime-gpu-deps
ARG PIP_CERT
ARG PIP_INDEX_URL
COPY requirements/runtime-gpu.txt /requirements/
RUN python3 -m venv --without-pip --system-site-packages /opt/kubeinfer \
 && /opt/pip/bin/pip --python /opt/kubeinfer/bin/python install --no-cache-dir \
      --disable-pip-version-check --require-hashes --no-deps --only-binary :all: \
      --no-binary pycuda -r /requirements/runtime-gpu.txt \
 && for site in /opt/kubeinfer/lib/python3*/site-packages; do \
      echo /opt/kubeinfer/project > "$site/kubeinfer-project.pth" \
      && echo /opt/kubeinfer/dataplane > "$site/kubeinfer-dataplane.pth"; done

# The same Rust wheel (abi3, built on glibc 2.36; the base's is 2.39).
FROM runtime-gpu-deps AS runtime-gpu-dataplane
COPY --from=dataplane /dataplane /dataplane
RUN /opt/pip/bin/pip --python /opt/kubeinfer/bin/python install --no-cache-dir \
      --disable-pip-version-check --no-deps --target /opt/kubeinfer/dataplane /dataplane/*.whl

FROM runtime-gpu-deps AS runtime-gpu-project
COPY --from=wheel /wheels /wheels
RUN /opt/pip/bin/pip --python /opt/kubeinfer/bin/python install --no-cache-dir \
      --disable-pip-version-check --no-deps --target /opt/kubeinfer/project /wheels/*.whl

# NVIDIA's image keeps its own compilers and CUDA toolkit; its pip goes.
FROM ${TENSORRT_BASE} AS runtime-gpu
RUN (python3 -m pip uninstall --yes --quiet --break-system-packages pip setuptools wheel \
      2>/dev/null || true) \
 && ! python3 -c "import pip" 2>/dev/null \
 && echo "kubeinfer:x:65532:65532:kubeinfer:/tmp:/usr/sbin/nologin" >> /etc/passwd \
 && echo "kubeinfer:x:65532:" >> /etc/group
COPY --from=runtime-gpu-deps /opt/kubeinfer /opt/kubeinfer
COPY --from=runtime-gpu-dataplane /opt/kubeinfer/dataplane /opt/kubeinfer/dataplane
COPY --from=runtime-gpu-project /opt/kubeinfer/project /opt/kubeinfer/project
ENV PATH=/opt/kubeinfer/project/bin:/opt/kubeinfer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65532:65532
EXPOSE 8000 8001
ENTRYPOINT ["kubeinfer"]
CMD ["serve", "--help"]
