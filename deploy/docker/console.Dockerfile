# The web console (agl-console): Starlette + Jinja2 pages over the ledger's gRPC watches; no JavaScript libraries.
# Build from the repository root:  docker build -f deploy/docker/console.Dockerfile -t agl-console .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AGL_CONSOLE_PORT=8090

RUN groupadd --system --gid 10001 agl \
    && useradd --system --uid 10001 --gid agl --home-dir /nonexistent --no-create-home agl

COPY pyproject.toml README.md /tmp/src/
COPY services /tmp/src/services
RUN pip install "/tmp/src[console]" && rm -rf /tmp/src

USER 10001:10001
WORKDIR /tmp
EXPOSE 8090

HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os,sys,urllib.request as u; r=u.urlopen('http://127.0.0.1:'+os.environ.get('AGL_CONSOLE_PORT','8090')+'/healthz',timeout=4); sys.exit(0 if r.status==200 else 1)"]

ENTRYPOINT ["agl-console"]
