# A CPU base image for Dockerfile.cuda on a machine without a GPU: Python, a venv on PATH and torch's CPU
# build (BASE_IMAGE must already carry torch: pip in the rentune build would pull the multi-GB CUDA one).
# `make image-cpu` builds this, then rentune on it (docs/deploy.md#trying-it-on-one-machine).
#
# PYTHON_IMAGE: any Debian-like image with python3, its venv module and ca-certificates (pip trusts the
# system's CA bundle, so an HTTPS proxy's CA added to it is trusted in the rentune build too).
# TORCH_WHEEL: a torch CPU wheel file in the build context, installed instead of torch==TORCH_VERSION from
# the CPU index (for a machine that cannot reach download.pytorch.org).
ARG PYTHON_IMAGE=python:3.12-slim
FROM ${PYTHON_IMAGE}
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_WHEEL=
ENV PATH=/opt/venv/bin:$PATH PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1
COPY . /tmp/context/
RUN set -eu; \
    python3 -m venv /opt/venv; \
    if [ -n "${TORCH_WHEEL}" ]; then pip install --no-cache-dir "/tmp/context/${TORCH_WHEEL}"; \
    else pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"; fi; \
    rm -rf /tmp/context; \
    python -c "import torch; assert not torch.version.cuda and not torch.version.hip, torch.__version__"
