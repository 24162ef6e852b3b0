"""The images built from deploy/docker and the compose stack run for real, with podman (deploy/podman_harness.py).

The light images (ledger, proxy, controller in both targets, console, agents) are built from the Dockerfiles as
a user builds them; `docker-compose` brings the compose file up (profiles `standin` and `console`, auth on)
against podman's Docker API; every service goes healthy and answers on the host's loopback; the unmodified math
agent runs 16 rollouts inside the controller's container through the proxy's container to the stand-in's, and
they succeed with rewards and the engine's token ids; the ledger's SQLite outlives `down`/`up` on its named
volume; `down --volumes` leaves nothing. The trainer's CPU image has its own tests (test_trainer_image.py); the
CPU engine image is built by hand (`python -m deploy.podman_harness build agl-engine`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deploy import kube_play, podman_harness
from deploy.podman_harness import ComposeProject, Podman
from services._gen.agl.v1 import model_pb2, rollout_pb2
from services.client import LedgerClient
from services.stack import compose_file
from services.standin import model as standin_model
from services.standin.tokenizer import ToyTokenizer, token_logprob
from tests.deploy.conftest import DOCKER
from tests.support.procs import free_port

# Building the images is part of the first test's setup: minutes, not the suite's default 300 s per test.
pytestmark = [pytest.mark.containers, pytest.mark.timeout(1800)]

KEY = "compose-test-key"
MODEL = "agl-policy"
MATH_AGENT = "examples.math_agent.agent:MathAgent"
TASK_ENV = {"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"}
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
BUILT = podman_harness.LIGHT
HEALTHY_SERVICES = ("ledger", "proxy", "standin", "console")


@dataclass
class Stack:
    project: ComposeProject
    ledger: str
    proxy_url: str
    console_url: str
    up_seconds: float

    def client(self) -> LedgerClient:
        return LedgerClient(self.ledger, key=KEY)


@pytest.fixture(scope="module")
def built(podman: Podman) -> dict[str, float]:
    return podman_harness.build(podman, BUILT)


@pytest.fixture(scope="module")
def stack(podman: Podman, built: dict[str, float], docker_host: str) -> Iterator[Stack]:
    ledger_port, proxy_port, console_port = free_port(), free_port(), free_port()
    variables = {
        "AGL_KEY": KEY,
        "AGL_MODEL_NAME": MODEL,
        # Published on the host's loopback only.
        "AGL_LEDGER_PUBLISH_PORT": f"127.0.0.1:{ledger_port}",
        "AGL_PROXY_PUBLISH_PORT": f"127.0.0.1:{proxy_port}",
        "AGL_CONSOLE_PUBLISH_PORT": str(console_port),
    }
    project = ComposeProject(podman, docker_host, f"agltest{os.getpid()}", variables, ["standin", "console"])
    try:
        up_seconds = project.up()
        stack = Stack(
            project,
            f"127.0.0.1:{ledger_port}",
            f"http://127.0.0.1:{proxy_port}",
            f"http://127.0.0.1:{console_port}",
            up_seconds,
        )
        _wait_healthy(stack)
        yield stack
    finally:
        project.down(volumes=True)


def _wait_healthy(stack: Stack, timeout_s: float = 90) -> dict[str, dict]:
    try:
        return stack.project.wait_healthy(HEALTHY_SERVICES, timeout_s)
    except podman_harness.HarnessError as err:
        pytest.fail(str(err))


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def _spec(run: str, name: str, task: dict[str, str]) -> rollout_pb2.RolloutSpec:
    return rollout_pb2.RolloutSpec(
        rollout_id=f"{run}-{name}",
        input_json=json.dumps(task),
        is_train=True,
        config=rollout_pb2.RolloutConfig(
            timeout_seconds=120, local=rollout_pb2.LocalLaunchConfig(agent_class=MATH_AGENT, env_map=TASK_ENV)
        ),
        metadata=rollout_pb2.RolloutMetadata(labels={"run": run, "group": task["id"]}),
    )


async def _run_to_end(stack: Stack, client: LedgerClient, run: str, specs: list[Any], timeout_s: float = 240) -> dict:
    await client.create_rollouts(specs)
    wanted = {spec.rollout_id for spec in specs}
    entries: dict[str, Any] = {}

    async def consume() -> None:
        async for entry in client.watch_terminal(labels={"run": run}, include_events=True):
            entries[entry.rollout.rollout_id] = entry
            if wanted <= entries.keys():
                return

    try:
        await asyncio.wait_for(consume(), timeout_s)
    except asyncio.TimeoutError:
        pytest.fail(f"{len(entries)} of {len(wanted)} rollouts ended within {timeout_s}s\n{stack.project.logs()}")
    return entries


def _engine_output(request: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    """What the stand-in engine answers to this request, recomputed here from its tokenizer and toy model."""
    tokenizer = ToyTokenizer()
    messages, tools = request["messages"], request.get("tools")
    prompt = tokenizer.encode(standin_model.render_chat(messages, tools))
    reply = standin_model.chat_reply(messages, tools, request.get("tool_choice", "auto"))
    response = tokenizer.encode(reply.raw)
    return prompt, response, [token_logprob(token, position) for position, token in enumerate(response)]


# -- images ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILT)
def test_image_is_built_from_its_dockerfile_runs_as_non_root_and_keeps_its_health_check(
    podman: Podman, built: dict[str, float], name: str
) -> None:
    image = podman_harness.IMAGES[name]
    inspected = podman.inspect(image.tag)
    config = inspected["Config"]
    wanted = compose_file.parse_dockerfile(DOCKER / image.dockerfile, image.target)
    assert config["User"] == "10001:10001"
    assert (config.get("Entrypoint") or []) == wanted.entrypoint
    assert (config.get("Cmd") or []) == wanted.cmd
    # Built in Docker's format: an OCI image would have dropped HEALTHCHECK.
    assert inspected["ManifestType"] == "application/vnd.docker.distribution.manifest.v2+json"
    healthcheck = (inspected.get("Healthcheck") or {}).get("Test") or []
    assert healthcheck == (["CMD", *wanted.healthcheck] if wanted.healthcheck else [])
    assert podman.image_size(image.tag) > 0


def test_the_agents_image_leaves_a_returned_reward_as_the_termination_message(
    podman: Podman, built: dict[str, float], tmp_path: Path
) -> None:
    # The kubelet creates the termination message file and bind-mounts it; an empty file mounted there is the same.
    message = tmp_path / "termination-log"
    message.write_text("")
    message.chmod(0o666)
    agents = Path(__file__).resolve().parents[1] / "controller" / "agents"
    for agent, expected in (("ReturnsReward", '{"value": 0.75}'), ("ReturnsText", "")):
        message.write_text("")
        podman.run(
            "run", "--rm", "--read-only", "-v", f"{agents}:/app/testagents:ro",
            "-v", f"{message}:/dev/termination-log", podman_harness.IMAGES["agl-agents"].tag,
            "python", "/app/agent_runner.py", "--result-file", "/dev/termination-log", f"testagents.returning:{agent}",
        )  # fmt: skip
        assert message.read_text() == expected, agent  # a text run() returned is no reward: nothing written


def test_images_are_built_on_the_base_the_dockerfiles_name(podman: Podman, built: dict[str, float]) -> None:
    base_layers = podman.inspect(podman_harness.BASE_IMAGE)["RootFS"]["Layers"]
    for name in BUILT:
        layers = podman.inspect(podman_harness.IMAGES[name].tag)["RootFS"]["Layers"]
        assert layers[: len(base_layers)] == base_layers, name
    # The interpreter the Dockerfiles' `pip install` and entrypoints use: Python 3.11, like python:3.11-slim.
    script = "import sys, services.ledger; print(sys.version_info[:2])"
    result = podman.run("run", "--rm", "--entrypoint", "python", "agl-ledger:latest", "-c", script)
    assert result.stdout.strip() == "(3, 11)"


# -- Kubernetes manifests under podman kube play --------------------------------------------------------------


def _ledger_health(address: str, key: str) -> int:
    channel = grpc.insecure_channel(address)
    try:
        request = health_pb2.HealthCheckRequest()
        answer = health_pb2_grpc.HealthStub(channel).Check(
            request, metadata=[("authorization", f"Bearer {key}")], timeout=5
        )
        return answer.status
    finally:
        channel.close()


def test_kube_play_runs_the_ledger_and_proxy_pods_of_deploy_k8s(
    podman: Podman, built: dict[str, float], tmp_path: Path
) -> None:
    ports = {50051: free_port(), 9464: free_port(), 8080: free_port()}
    manifest = tmp_path / "agl.yaml"
    manifest.write_text(yaml.safe_dump_all(kube_play.render(ports)))
    secret_name, content = kube_play.secret_content()
    (tmp_path / "secret.json").write_bytes(content)
    key = kube_play.secret_value("key")
    network = f"aglkube{os.getpid()}"
    podman.run("secret", "rm", secret_name, check=False)
    podman.run("secret", "create", secret_name, str(tmp_path / "secret.json"))
    podman.run("network", "create", network)
    try:
        podman.run("kube", "play", "--network", network, str(manifest), timeout=180)
        ledger, proxy = f"127.0.0.1:{ports[50051]}", f"http://127.0.0.1:{ports[8080]}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if _ledger_health(ledger, key) == health_pb2.HealthCheckResponse.SERVING and _get(f"{proxy}/healthz"):
                    break
            except (grpc.RpcError, OSError):
                pass
            if time.monotonic() > deadline:
                logs = podman.run("pod", "logs", "agl-ledger", check=False).stdout[-3000:]
                pytest.fail(f"ledger and proxy pods did not answer within 60 s\n{logs}")
            time.sleep(1)

        # The proxy pod found the ledger pod by its Service's name and follows its model registry, with the
        # Secret's key: an endpoint registered over the ledger's published port shows up in the proxy's health.
        async def register() -> None:
            async with LedgerClient(ledger, key=key) as client:
                await client.register_models([model_pb2.ModelEndpoint(model_name=MODEL, endpoint="http://e:1/v1")])

        asyncio.run(register())
        deadline = time.monotonic() + 30
        while json.loads(_get(f"{proxy}/status")[1])["endpoints"] != ["http://e:1/v1"]:
            assert time.monotonic() < deadline, _get(f"{proxy}/status")[1]
            time.sleep(0.5)
        assert json.loads(_get(f"{proxy}/status")[1])["replica_id"] == "agl-proxy-pod-0"
        # Published on the host's loopback only (podman 4.3 would take 0.0.0.0 for a bare containerPort).
        published = podman.run("ps", "--filter", "pod=agl-ledger", "--format", "{{.Ports}}").stdout
        assert f"127.0.0.1:{ports[50051]}->50051/tcp" in published and "0.0.0.0" not in published
    finally:
        podman.run("kube", "play", "--down", str(manifest), check=False, timeout=180)
        podman.run("volume", "rm", "--force", "agl-ledger-data", check=False)
        podman.run("network", "rm", network, check=False)
        podman.run("secret", "rm", secret_name, check=False)


# -- the compose stack ----------------------------------------------------------------------------------------


def test_every_service_goes_healthy_and_answers_on_loopback(stack: Stack) -> None:
    states = _wait_healthy(stack)
    assert states["controller"]["Running"], states["controller"]
    # The one-shot registered the stand-in with the ledger and ended.
    assert states["register-standin"]["Status"] == "exited" and states["register-standin"]["ExitCode"] == 0

    channel = grpc.insecure_channel(stack.ledger)
    try:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), metadata=[("authorization", f"Bearer {KEY}")], timeout=10
        )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()
    assert _get(f"{stack.proxy_url}/healthz")[0] == 200
    assert _get(f"{stack.console_url}/healthz")[0] == 200

    async def models() -> list[tuple[str, str]]:
        async with stack.client() as client:
            return [(e.model_name, e.endpoint) for e in await client.list_models()]

    assert asyncio.run(models()) == [(MODEL, "http://standin:8000/v1")]


def test_sixteen_math_rollouts_succeed_through_the_containers_with_the_engines_tokens(stack: Stack) -> None:
    run = f"compose-{uuid.uuid4().hex[:8]}"
    tasks = [{"id": f"t{i}", "question": f"What is {i * 7} + {i + 3}?", "answer": str(i * 8 + 3)} for i in range(8)]
    specs = [_spec(run, f"{task['id']}-{k}", task) for task in tasks for k in range(2)]

    async def scenario() -> None:
        async with stack.client() as client:
            entries = await _run_to_end(stack, client, run, specs)
            assert len(entries) == 16
            for rollout_id, entry in entries.items():
                assert entry.rollout.status.state == SUCCEEDED, (rollout_id, entry.rollout.status.error_message)
                assert [e.reward.value for e in entry.events if e.event_type == "reward"] == [1.0]
                (event,) = await client.list_events(rollout_id, event_type="model_request")
                call = event.model_request
                request, response = json.loads(call.request_json), json.loads(call.response_json)
                prompt, output, logprobs = _engine_output(request)
                (triplet,) = [e.model_request for e in entry.events if e.event_type == "model_request"]
                assert list(triplet.prompt_token_ids) == prompt
                assert list(triplet.response_token_ids) == output == response["choices"][0]["token_ids"]
                assert list(triplet.response_logprobs) == logprobs
                question = json.loads(entry.rollout.input_json)["question"]
                assert request["messages"][-1] == {"role": "user", "content": question}

    asyncio.run(scenario())


def test_ledger_data_survives_down_and_up_on_its_named_volume(stack: Stack) -> None:
    run = f"persist-{uuid.uuid4().hex[:8]}"
    spec = _spec(run, "only", {"id": "p", "question": "What is 40 + 2?", "answer": "42"})

    async def create() -> None:
        async with stack.client() as client:
            (entry,) = (await _run_to_end(stack, client, run, [spec])).values()
            assert entry.rollout.status.state == SUCCEEDED

    asyncio.run(create())
    stack.project.down()
    assert stack.project.containers() == {}
    assert f"{stack.project.name}_ledger-data" in stack.project.volumes()
    stack.project.up()
    _wait_healthy(stack)

    async def read() -> None:
        async with stack.client() as client:
            rollout = await client.get_rollout(spec.rollout_id)
            assert rollout.status.state == SUCCEEDED
            rewards = await client.list_events(spec.rollout_id, event_type="reward")
            assert [e.reward.value for e in rewards] == [1.0]

    asyncio.run(read())


def test_down_with_volumes_leaves_nothing(stack: Stack) -> None:
    stack.project.down(volumes=True)
    assert stack.project.containers() == {}
    assert stack.project.volumes() == []
