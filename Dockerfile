# syntax=docker/dockerfile:1
#
# agentstream: one image for every service. The command picks the service:
#
#   docker run agentstream serve agent-loop  --app mypkg.agents:app
#   docker run agentstream serve tool-worker --app mypkg.agents:app --queue default
#   docker run agentstream serve delegation  --app mypkg.agents:app
#   docker run agentstream serve compaction  --app mypkg.agents:app
#
# The user's app module (the Python module that names the agents and tools) lives in /app,
# which is on PYTHONPATH. Three ways to get it there:
#   - bake it in:  docker build --build-context app=../myproject -t myimage .
#                  (the directory's contents land in /app, so /app/mypkg/agents.py is
#                  importable as mypkg.agents); extra pip packages it needs:
#                  --build-arg EXTRA_PIP_PACKAGES="httpx-foo==1.2 bar"
#   - mount it:    docker run -v "$PWD/myproject:/app:ro" ...  (docker-compose does this)
#   - extend it:   FROM agentstream  /  COPY mypkg /app/mypkg
#
# Health: /healthz on AGENTSTREAM_METRICS_PORT (default 9464), checked with Python because the
# slim image has no curl.
#
# Reproducible: the dependencies are installed from requirements.lock (exact versions and hashes,
# `pip install --require-hashes`; regenerate it with scripts/lock after changing pyproject.toml),
# agentstream itself without resolving anything (--no-deps). The base image is a Debian release
# (bookworm), so the pinned tini below exists in it. Labels (OCI image spec annotations):
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .
#
# PID 1 is tini: it forwards SIGTERM to agentstream (which drains) and reaps the children that
# tools spawn (a browser, a shell), which would otherwise stay zombies.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The user's app code. By default only a placeholder README; replaced wholesale by
# `--build-context app=<dir>` (a named build context overrides the stage of the same name).
FROM scratch AS app
COPY deploy/app/ /

# Build stage: install agentstream and its dependencies into a virtualenv that the runtime
# stage copies, so no build leftovers (pip cache, build/, egg-info) reach the final image.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/agentstream
WORKDIR /src
COPY requirements.lock ./
RUN /opt/agentstream/bin/pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY prompts ./prompts
# The `otel` extra (opentelemetry-api) carries a turn's trace context through the services; to
# record spans, add the SDK and an exporter: --build-arg EXTRA_PIP_PACKAGES="opentelemetry-sdk
# opentelemetry-exporter-otlp" (and set them up in your app module, or run under opentelemetry-instrument).
# The `mcp` extra (the official MCP SDK) lets tool workers run the tools of MCP servers.
RUN /opt/agentstream/bin/pip install --no-deps ".[otel,mcp]" \
 && /opt/agentstream/bin/pip check
# Packages the user's app needs, space-separated pip requirement specifiers (default: none).
ARG EXTRA_PIP_PACKAGES=""
RUN if [ -n "${EXTRA_PIP_PACKAGES}" ]; then /opt/agentstream/bin/pip install ${EXTRA_PIP_PACKAGES}; fi

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
# The repository the image was built from, e.g. --build-arg SOURCE=https://git.example.com/you/agentstream
ARG SOURCE=""
LABEL org.opencontainers.image.title="agentstream" \
      org.opencontainers.image.description="LLM agents as services over Redis Streams" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"

# tini as PID 1 (see the header).
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
 && rm -rf /var/lib/apt/lists/*

# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it without a passwd lookup.
ARG AGENTSTREAM_UID=10001
RUN groupadd --system --gid "${AGENTSTREAM_UID}" agentstream \
 && useradd --system --uid "${AGENTSTREAM_UID}" --gid agentstream \
            --home-dir /home/agentstream --create-home --shell /usr/sbin/nologin agentstream

COPY --from=build /opt/agentstream /opt/agentstream
COPY --from=app / /app/

# PYTHONDONTWRITEBYTECODE: the root filesystem is read-only under the Helm chart.
# AGENTSTREAM_METRICS_PORT: /metrics, /healthz and /readyz (the library's default, 0, is off).
# AGENTSTREAM_SHUTDOWN_GRACE_S: drain time on SIGTERM; keep `docker stop -t` / compose's
# stop_grace_period / Kubernetes' terminationGracePeriodSeconds a few seconds above it.
ENV PATH="/opt/agentstream/bin:${PATH}" \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    AGENTSTREAM_METRICS_PORT=9464 \
    AGENTSTREAM_SHUTDOWN_GRACE_S=30

USER ${AGENTSTREAM_UID}:${AGENTSTREAM_UID}
WORKDIR /home/agentstream
EXPOSE 9464
STOPSIGNAL SIGTERM

# urlopen raises on a refused connection, a timeout or a non-2xx status: exit 1 = unhealthy.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('AGENTSTREAM_METRICS_PORT', '9464'), timeout=4)"]

ENTRYPOINT ["tini", "--", "agentstream"]
CMD ["serve", "agent-loop", "--app", "agentstream.demo.app:app"]
