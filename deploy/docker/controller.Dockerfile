# The controller: turns queued rollouts into running agents.
# Two targets, both from the repository root:
#   docker build -f deploy/docker/controller.Dockerfile -t agl-controller .                 (k8s runner; default)
#   docker build -f deploy/docker/controller.Dockerfile --target local -t agl-controller-local .
# `local` also carries the example agents and their SDK, because the local runner starts agents as
# subprocesses inside the controller's container (that is what docker-compose runs).
FROM python:3.11-slim-bookworm AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AGL_CONTROLLER_LOG_DIR=/tmp/agl-agent-logs \
    AGL_CONTROLLER_METRICS_HOST=0.0.0.0

RUN groupadd --system --gid 10001 agl \
    && useradd --system --uid 10001 --gid agl --home-dir /nonexistent --no-create-home agl

COPY pyproject.toml README.md /tmp/src/
COPY services /tmp/src/services
WORKDIR /app
# Alive while the process answers on its probe port (the metrics server, its only listener); a controller that
# died at start (its port taken) is seen at once by compose and by agl train (deploy/local_stack.py).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os,sys,urllib.request as u; r=u.urlopen('http://127.0.0.1:'+os.environ.get('AGL_CONTROLLER_METRICS_PORT','9465')+'/healthz',timeout=4); sys.exit(0 if r.status==200 else 1)"]


FROM base AS local
RUN pip install "/tmp/src[controller,examples]" && rm -rf /tmp/src
COPY examples /app/examples
# Agent classes such as examples.math_agent.agent:MathAgent import from here.
ENV PYTHONPATH=/app
USER 10001:10001
ENTRYPOINT ["agl-controller"]
CMD ["--runner", "local"]


FROM base AS controller
RUN pip install "/tmp/src[controller]" && rm -rf /tmp/src
USER 10001:10001
ENTRYPOINT ["agl-controller"]
CMD ["--runner", "k8s"]
