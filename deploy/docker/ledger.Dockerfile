# The ledger: gRPC service owning rollouts, events and model endpoints (SQLite store on the /data volume).
# Build from the repository root:  docker build -f deploy/docker/ledger.Dockerfile -t agl-ledger .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AGL_LEDGER_HOST=0.0.0.0 \
    AGL_LEDGER_PORT=50051 \
    AGL_LEDGER_METRICS_PORT=9464 \
    AGL_LEDGER_STORE=sqlite:/data/ledger.db

RUN groupadd --system --gid 10001 agl \
    && useradd --system --uid 10001 --gid agl --home-dir /nonexistent --no-create-home agl \
    && mkdir /data && chown agl:agl /data

COPY pyproject.toml README.md /tmp/src/
COPY services /tmp/src/services
RUN pip install "/tmp/src[ledger]" && rm -rf /tmp/src

USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 50051 9464

# gRPC health checking (grpc.health.v1), with the bearer key when the ledger requires one.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os,sys,grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; k=os.environ.get('AGL_KEY'); md=[('authorization','Bearer '+k)] if k else None; ch=grpc.insecure_channel('127.0.0.1:'+os.environ.get('AGL_LEDGER_PORT','50051')); r=g.HealthStub(ch).Check(h.HealthCheckRequest(),timeout=4,metadata=md); sys.exit(0 if r.status==h.HealthCheckResponse.SERVING else 1)"]

ENTRYPOINT ["agl-ledger"]
