# The proxy: OpenAI-compatible recording proxy (Starlette + uvicorn), stateless, any number of replicas.
# The same image carries the vLLM-shaped stand-in engine (`agl-standin-engine`), which needs nothing more.
# Build from the repository root:  docker build -f deploy/docker/proxy.Dockerfile -t agl-proxy .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AGL_PROXY_HOST=0.0.0.0 \
    AGL_PROXY_PORT=8080

RUN groupadd --system --gid 10001 agl \
    && useradd --system --uid 10001 --gid agl --home-dir /nonexistent --no-create-home agl

COPY pyproject.toml README.md /tmp/src/
COPY services /tmp/src/services
RUN pip install "/tmp/src[proxy]" && rm -rf /tmp/src

USER 10001:10001
WORKDIR /tmp
EXPOSE 8080

HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os,sys,urllib.request as u; r=u.urlopen('http://127.0.0.1:'+os.environ.get('AGL_PROXY_PORT','8080')+'/healthz',timeout=4); sys.exit(0 if r.status==200 else 1)"]

ENTRYPOINT ["agl-proxy"]
