# syntax=docker/dockerfile:1.7
# FlexInfer's images, one target each, all built the same way: from uv.lock, in two stages (the virtualenv of one
# package set, then a slim run stage with only that virtualenv), non-root, one process, OCI labels.
# Build from the repository root (the uv workspace), naming the target, the version and the commit:
#   docker build --target proxy -t flexinfer-proxy:0.1.0 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) --build-arg CREATED=$(date -u +%FT%TZ) .
# Targets: proxy, scheduler, actuator, lease-manager (the services) and fake-model (demos and tests: an
# OpenAI-compatible server that needs no GPU, for the Deployments of examples/kubernetes/homelab.yaml).

FROM ghcr.io/astral-sh/uv:0.13.9 AS uv

# The workspace and uv, for the build stages below: each installs exactly the packages uv.lock resolves for one
# package (flexinfer-common with only the extras that package uses; no embedded NATS or PostgreSQL, no dev tools),
# as wheels into /app/.venv, not editable.
FROM python:3.11-slim AS workspace
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv
WORKDIR /src
COPY . .

FROM workspace AS build-proxy
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable --package flexinfer-proxy

FROM workspace AS build-scheduler
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable --package flexinfer-scheduler

FROM workspace AS build-actuator
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable --package flexinfer-actuator

FROM workspace AS build-lease-manager
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable --package flexinfer-lease-manager

FROM workspace AS build-fake-model
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable --package flexinfer-fake-model

# What every run stage shares: a non-root user (uid 10001, which the charts' runAsUser matches; a home for the
# actuator's state folder), the virtualenv on PATH, the labels every image carries. No uv, no sources.
FROM python:3.11-slim AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=""
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.vendor="FlexInfer" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim"
RUN groupadd --system --gid 10001 flexinfer \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/flexinfer flexinfer
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /home/flexinfer
USER 10001:10001
# exec form below: the service is PID 1 and gets SIGTERM directly.
STOPSIGNAL SIGTERM

# The proxy: the OpenAI-compatible data plane (per-model queues, demand signals).
# SIGTERM: stop accepting, answer queued requests 503, let in-flight ones finish (10 s), exit.
FROM runtime AS proxy
COPY --from=build-proxy /app/.venv /app/.venv
LABEL org.opencontainers.image.title="flexinfer-proxy" \
      org.opencontainers.image.description="FlexInfer proxy: the OpenAI-compatible data plane (per-model queues, demand signals)"
ENV FLEXINFER_PROXY_PORT=8080
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s \
    CMD ["python", "-m", "flexinfer_common.healthcheck", "http://127.0.0.1:${FLEXINFER_PROXY_PORT}/healthz"]
ENTRYPOINT ["flexinfer-proxy"]

# The scheduler: the election and the swaps (state in PostgreSQL). It also runs the database migrations
# (docker-compose.yml and the Helm hook do):
#   python -c "from flexinfer_common.db import upgrade_database_sync; import os; upgrade_database_sync(os.environ['FLEXINFER_DATABASE_URL'])"
# SIGTERM: finish the current pass and exit (the Postgres leader lock goes with its connection; a swap in flight is
# persisted and resumed by the next leader).
FROM runtime AS scheduler
COPY --from=build-scheduler /app/.venv /app/.venv
LABEL org.opencontainers.image.title="flexinfer-scheduler" \
      org.opencontainers.image.description="FlexInfer scheduler: the election and the swaps (state in PostgreSQL); also runs the database migrations"
ENV FLEXINFER_SCHEDULER_PORT=8081
EXPOSE 8081
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s \
    CMD ["python", "-m", "flexinfer_common.healthcheck", "http://127.0.0.1:${FLEXINFER_SCHEDULER_PORT}/healthz"]
ENTRYPOINT ["python", "-m", "flexinfer_scheduler"]

# The actuator: parks and loads models (Kubernetes Deployments or local processes). The local back-end runs model
# servers inside this container: build an image FROM this one that adds them (and name their executables in
# FLEXINFER_LOCAL_COMMANDS).
# SIGTERM: stop taking commands (the local back-end also stops its model processes), exit 0.
FROM runtime AS actuator
COPY --from=build-actuator /app/.venv /app/.venv
LABEL org.opencontainers.image.title="flexinfer-actuator" \
      org.opencontainers.image.description="FlexInfer actuator: parks and loads models (Kubernetes Deployments or local processes)"
ENV FLEXINFER_ACTUATOR_PORT=8083 \
    FLEXINFER_STATE_DIR=/home/flexinfer/.flexinfer
EXPOSE 8083
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s \
    CMD ["python", "-m", "flexinfer_common.healthcheck", "http://127.0.0.1:${FLEXINFER_ACTUATOR_PORT}/healthz"]
ENTRYPOINT ["python", "-m", "flexinfer_actuator"]

# The lease manager: GPU leases for training jobs.
# SIGTERM: stop serving, close the NATS and Postgres connections, exit 0.
FROM runtime AS lease-manager
COPY --from=build-lease-manager /app/.venv /app/.venv
LABEL org.opencontainers.image.title="flexinfer-lease-manager" \
      org.opencontainers.image.description="FlexInfer lease manager: GPU leases for training jobs"
ENV FLEXINFER_LEASE_MANAGER_PORT=8082
EXPOSE 8082
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s \
    CMD ["python", "-m", "flexinfer_common.healthcheck", "http://127.0.0.1:${FLEXINFER_LEASE_MANAGER_PORT}/healthz"]
ENTRYPOINT ["python", "-m", "flexinfer_lease_manager"]

# The fake model server (listens on all of the container's addresses: it is what a Deployment's Pod serves).
FROM runtime AS fake-model
COPY --from=build-fake-model /app/.venv /app/.venv
LABEL org.opencontainers.image.title="flexinfer-fake-model" \
      org.opencontainers.image.description="FlexInfer fake model server: OpenAI-compatible, no GPU (demos and tests)"
ENV FAKE_MODEL_HOST=0.0.0.0 \
    FAKE_MODEL_PORT=8000
EXPOSE 8000
ENTRYPOINT ["flexinfer-fake-model"]
