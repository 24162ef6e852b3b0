# The example agents, as run by Kubernetes Jobs (see examples/calc_agent/job.yaml.j2).
# They need only the OpenAI and Anthropic SDKs and httpx. Of AGL, the image holds only agent_runner.py (the
# standard library only): it runs an agent class, and `--result-file /dev/termination-log` leaves the number
# its run() returns as the container's termination message, which the controller posts as the reward.
# Build from the repository root:  docker build -f deploy/docker/agents.Dockerfile -t agl-agents .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 agl \
    && useradd --system --uid 10001 --gid agl --home-dir /nonexistent --no-create-home agl

# The version ranges of the `examples` extra in pyproject.toml.
RUN pip install "openai>=1.60,<4" "httpx>=0.28,<1" "anthropic>=2.10,<3"

COPY examples /app/examples
COPY services/controller/core/agent_runner.py /app/agent_runner.py
USER 10001:10001
WORKDIR /app
CMD ["python", "/app/examples/calc_agent/agent.py"]
