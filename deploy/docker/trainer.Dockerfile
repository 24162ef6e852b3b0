# The trainer: a verl RayPPOTrainer subclass, launched with `ray job submit` on a Ray cluster whose
# nodes run this image (the compose profile `ray` starts a head node from it).
# Build from the repository root:  docker build -f deploy/docker/trainer.Dockerfile -t agl-trainer .
# PyPI's Linux torch and vLLM wheels carry their CUDA libraries, so a slim base is enough; the GPU driver
# comes from the host (NVIDIA container toolkit). VLLM_SPEC picks the vLLM release verl's rollout uses.
FROM python:3.11-slim-bookworm

ARG VLLM_SPEC="vllm"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/agl \
    HF_HOME=/home/agl/.cache/huggingface

RUN groupadd --system --gid 10001 agl \
    && useradd --system --uid 10001 --gid agl --home-dir /home/agl --create-home agl

COPY pyproject.toml README.md /tmp/src/
COPY services /tmp/src/services
# ray[default] brings the dashboard and job server that `ray job submit` talks to.
RUN pip install "/tmp/src[trainer]" "ray[default]" "${VLLM_SPEC}" && rm -rf /tmp/src

COPY examples /app/examples
USER 10001:10001
WORKDIR /app
# 6379: GCS, 8265: dashboard and job submission, 10001: Ray client.
EXPOSE 6379 8265 10001

ENTRYPOINT ["agl-trainer"]
