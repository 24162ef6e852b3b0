"""The real command-line harnesses (Claude Code, Codex, Qwen Code at the versions examples/harnesses pins, installed
by `make harnesses`) run unmodified as command rollouts through the whole stack (the compose ledger, proxy and
controller as local processes, and the stand-in engine with vLLM's token endpoints, so that the proxy continues
calls in the sampled tokens), each by its recipe: the first call is accepted, the tool the stand-in picks goes round
trip, every answered call is in the ledger with the engine's token ids, every call that appends to an earlier one's
conversation continues its tokens (no break), the trainer makes one row per conversation, the check's reward
arrives, and the rollout's private HOME and workspace are gone, with no process of the harness left. A harness none
of whose calls is answered ends its rollout failed, without a reward, whether it says so by its exit status or hides
it behind exit 0. One stack serves the module."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.harnesses.harness_rollout import NO_ANSWER_EXIT
from services._gen.agl.v1 import event_pb2, ledger_service_pb2, model_pb2, rollout_pb2
from services.client import LedgerClient
from services.stack import local_stack
from services.trainer.data.aggregation import TRAJECTORY_BREAKS, rows_from_trace
from services.trainer.data.triplets import trace_from_events
from tests.e2e.conftest import KEY, MODEL, Stack, run_to_end
from tests.proxy.conftest import run_standin
from tests.support.procs import processes_mentioning

pytestmark = pytest.mark.timeout(240)

# recipe module -> (the CLI it runs, the API the harness speaks)
HARNESSES = {
    "claude_code": ("claude", "anthropic.messages"),
    "codex": ("codex", "openai.responses"),
    "qwen_code": ("qwen", "chat.completions"),
    "mini_swe_agent": ("mini", "chat.completions"),
}
TASK = {"question": "What is 6 * 7?", "answer": "42"}
TASK_ENV = {"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"}
# What Qwen Code 0.15.10 printed when every model call had failed, with exit status 0 (issue 42); the pinned CLIs
# exit 1 instead, so a stand-in harness plays it: it makes its call (refused like the others) and reports success.
HIDING_HARNESS = """#!{python}
import json, os, urllib.request, urllib.error
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({{"model": "m", "messages": [{{"role": "user", "content": "What is 6 * 7?"}}]}}).encode(),
    headers={{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}},
)
try:
    urllib.request.urlopen(request, timeout=30)
except urllib.error.HTTPError as err:
    print("[API Error: %d]" % err.code, flush=True)
result = {{"type": "result", "subtype": "success", "is_error": False, "result": "", "usage": {{"output_tokens": 0}}}}
print(json.dumps([result]))
"""


def harness_spec(run: str, name: str, module: str, env: Mapping[str, str] = TASK_ENV) -> rollout_pb2.RolloutSpec:
    command = [sys.executable, "-m", f"examples.harnesses.{module}"]
    return rollout_pb2.RolloutSpec(
        rollout_id=f"{run}-{name}",
        input_json=json.dumps(TASK),
        is_train=True,
        config=rollout_pb2.RolloutConfig(
            timeout_seconds=120, local=rollout_pb2.LocalLaunchConfig(command=command, env_map=dict(env))
        ),
        metadata=rollout_pb2.RolloutMetadata(labels={"run": run, "group": name}),
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    recipes = [importlib.import_module(f"examples.harnesses.{module}").HARNESS for module in HARNESSES]
    missing = [str(h.installed_bin / h.program) for h in recipes if not (h.installed_bin / h.program).is_file()]
    assert not missing, f"{missing} not there: `make harnesses` installs the pinned CLIs"
    data_dir = tmp_path_factory.mktemp("harness-stack")
    specs = local_stack.load_compose({"AGL_KEY": KEY, "AGL_MODEL_NAME": MODEL})
    specs = {name: specs[name] for name in ("ledger", "proxy", "controller")}
    plans = local_stack.localize(specs, data_dir, {"controller": {"AGL_CONTROLLER_LOG_DIR": str(data_dir / "logs")}})
    with (
        run_standin(MODEL, args=["--scale-out"]) as engine,
        local_stack.run_stack(plans, local_stack.start_order(specs), data_dir / "logs") as running,
    ):
        ledger = running["ledger"].address(50051)

        async def register() -> None:
            async with LedgerClient(ledger, key=KEY) as client:
                await client.register_models([model_pb2.ModelEndpoint(model_name=MODEL, endpoint=f"{engine.url}/v1")])

        asyncio.run(register())
        yield Stack(ledger, f"http://{running['proxy'].address(8080)}", f"{engine.url}/v1", data_dir, running)


@pytest.fixture
def failing_engine(stack: Stack) -> Iterator[None]:
    """The stand-in refuses every generation with a 400 (as vLLM refuses a prompt longer than its context)."""
    knobs = stack.engine_url.removesuffix("/v1") + "/standin/config"
    httpx.post(knobs, json={"fail_next": 100_000, "fail_status": 400}).raise_for_status()
    try:
        yield
    finally:
        httpx.post(knobs, json={"fail_next": 0}).raise_for_status()


def calls_of(events: list[event_pb2.Event]) -> list[event_pb2.ModelRequest]:
    return [e.model_request for e in events if e.WhichOneof("payload") == "model_request"]


def tool_round_trips(calls: list[event_pb2.ModelRequest]) -> int:
    """Tool calls the engine made that a later request of the rollout answers with a tool message."""
    answered = set()
    for call in calls:
        if call.request_json:
            for message in json.loads(call.request_json).get("messages", []):
                if message.get("role") == "tool":
                    answered.add(message.get("tool_call_id"))
    made = 0
    for call in calls:
        response: dict[str, Any] = json.loads(call.response_json) if call.response_json else {}
        for choice in response.get("choices") or []:
            made += sum(1 for c in (choice.get("message") or {}).get("tool_calls") or [] if c.get("id") in answered)
    return made


def unbroken_appends(calls: list[event_pb2.ModelRequest]) -> tuple[int, list[int]]:
    """(calls whose request appends to the latest earlier answered call of its conversation, that call's messages and
    its answer, those of them whose prompt does not start with that call's prompt and sampled tokens): a conversation
    that went on must go on in its tokens. A history that leaves out the latest answer changed (mini-swe-agent drops
    an answer without a tool call, and sends its format error instead): no append."""
    answered = [c for c in calls if c.status == event_pb2.MODEL_REQUEST_STATUS_OK]
    appends, broken = 0, []
    for index, call in enumerate(answered):
        messages = json.loads(call.request_json)["messages"]
        for earlier in reversed(answered[:index]):
            before = json.loads(earlier.request_json)["messages"]
            if len(before) < len(messages) and messages[: len(before)] == before:
                if messages[len(before)].get("role") == "assistant":
                    appends += 1
                    sampled = [*earlier.prompt_token_ids, *earlier.response_token_ids]
                    if list(call.prompt_token_ids[: len(sampled)]) != sampled:
                        broken.append(index)
                break
    return appends, broken


def rows_and_breaks(entry: ledger_service_pb2.TerminalRollout, events: list[event_pb2.Event]) -> tuple[int, int]:
    """What the trainer's data path makes of the rollout: rows and trajectory breaks, without length limits."""
    counts: Counter[str] = Counter()
    trace = trace_from_events(entry.rollout.rollout_id, "g", "", events, reward_fillna_value=0.0, counts=counts)
    rows = rows_from_trace(trace, "trajectory", max_prompt_length=10**6, max_response_length=10**6, counts=counts)
    return len(rows), counts[TRAJECTORY_BREAKS]


async def test_each_harness_runs_unmodified_through_the_stack(stack: Stack) -> None:
    run = f"harness-{uuid.uuid4().hex[:8]}"
    specs = {module: harness_spec(run, module, module) for module in HARNESSES}
    started = time.monotonic()
    async with stack.client() as client:
        entries = await run_to_end(stack, client, run, list(specs.values()), timeout_s=150)
        took = time.monotonic() - started
        for module, (program, api) in HARNESSES.items():
            entry = entries[specs[module].rollout_id]
            assert entry.rollout.status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED, (module, entry.rollout.status)
            events = list(await client.list_events(entry.rollout.rollout_id))
            calls = calls_of(events)
            assert calls, module
            assert all(call.api == api for call in calls), module
            # No request shape of the harness's is refused.
            assert [c.http_status for c in calls if 400 <= c.http_status < 500] == [], module
            assert calls[0].status == event_pb2.MODEL_REQUEST_STATUS_OK, (module, calls[0].response_json[:300])
            answered = [c for c in calls if c.status == event_pb2.MODEL_REQUEST_STATUS_OK]
            for call in answered:
                assert call.prompt_token_ids and call.response_token_ids, module
                assert call.has_response_logprobs and len(call.response_logprobs) == len(call.response_token_ids)
            # Every harness offers tools; the stand-in calls one, the harness runs it and sends its result back.
            assert json.loads(calls[0].request_json)["tools"], module
            round_trips = tool_round_trips(calls)
            assert round_trips >= 1, module
            rewards = [e.reward for e in events if e.WhichOneof("payload") == "reward"]
            assert len(rewards) == 1 and rewards[0].value in (0.0, 1.0) and rewards[0].source == program, rewards
            # The tool turn appends to the conversation, and continues the tokens the engine sampled.
            appends, broken = unbroken_appends(calls)
            assert appends >= 1 and broken == [], (module, appends, broken)
            # The private HOME and workspace are gone with everything the harness started there.
            log = (stack.data_dir / "logs" / f"{entry.rollout.rollout_id}.log").read_text()
            (workspace,) = re.findall(rf"{program} in (\S+)", log)
            assert not Path(workspace).parent.exists() and processes_mentioning(str(Path(workspace).parent)) == []
            # The trainer makes one row per conversation, however the conversations' calls interleave (Codex's
            # sub-agents): a call that appends to none opens a segment (a new conversation, or one whose history
            # changed), and only such a call after the first is a break.
            rows, breaks = rows_and_breaks(entry, events)
            segments = len(answered) - appends
            assert (rows, breaks) == (segments, segments - 1), (module, rows, breaks, segments)
            print(
                f"{module}: {len(calls)} calls ({len(answered)} answered), {round_trips} tool round trip(s), "
                f"first prompt {len(calls[0].prompt_token_ids)} tokens, {appends} appending call(s) continued, "
                f"trainer rows {rows} / breaks {breaks}, reward {rewards[0].value:g} ({rewards[0].reason})"
            )
        print(f"{len(HARNESSES)} harness rollouts at once: {took:.1f}s")
        await client.delete_rollouts(list(entries))


async def test_a_harness_whose_calls_all_fail_ends_its_rollout_failed_without_a_reward(
    stack: Stack, failing_engine: None, tmp_path: Path
) -> None:
    hiding = tmp_path / "hiding-harness"
    hiding.write_text(HIDING_HARNESS.format(python=sys.executable))
    hiding.chmod(0o755)
    run = f"harness-fail-{uuid.uuid4().hex[:8]}"
    # Not mini-swe-agent: importing its litellm alone takes ~20 s on CI's cores (it ends as the others do, measured:
    # `mini-swe-agent: exited 1: litellm.BadRequestError: OpenAIException - …`, with its retries set to 1 through
    # MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT).
    specs = {module: harness_spec(run, module, module) for module in HARNESSES if module != "mini_swe_agent"}
    specs["hiding"] = harness_spec(run, "hiding", "qwen_code", {**TASK_ENV, "HARNESS_BIN": str(hiding)})
    async with stack.client() as client:
        entries = await run_to_end(stack, client, run, list(specs.values()), timeout_s=150)
        for name, rollout_spec in specs.items():
            entry = entries[rollout_spec.rollout_id]
            status = entry.rollout.status
            assert status.state == rollout_pb2.ROLLOUT_STATE_FAILED, (name, status)
            events = list(await client.list_events(entry.rollout.rollout_id))
            calls = calls_of(events)
            assert calls and all(c.http_status == 400 for c in calls), (name, [c.http_status for c in calls])
            assert [e for e in events if e.WhichOneof("payload") == "reward"] == [], name
            if name == "hiding":
                assert f"exited with code {NO_ANSWER_EXIT}" in status.error_message, status.error_message
                assert "exited 0 but the model answered none of its calls" in status.error_message
            else:
                assert "exited with code 1" in status.error_message and ": exited 1: " in status.error_message
                assert "400" in status.error_message, status.error_message  # the harness's own error, named
            print(f"{name}: {len(calls)} refused call(s); {status.error_message.split('): ', 1)[-1]}")
        await client.delete_rollouts(list(entries))
