"""Every `agl` subcommand, run as the installed console script against a real ledger, bad input included."""

from __future__ import annotations

import asyncio
import json
import subprocess

from services._gen.agl.v1 import event_pb2, model_pb2, rollout_pb2
from services.client import LedgerClient
from services.trainer.run import progress
from tests.support.procs import free_port

from .conftest import AGL, KEY, run_agl

SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
RUNNING = rollout_pb2.ROLLOUT_STATE_RUNNING
FAILED = rollout_pb2.ROLLOUT_STATE_FAILED


def spec(rollout_id: str, run: str, step: int = 1) -> rollout_pb2.RolloutSpec:
    labels = {"agl_run": run, "agl_step": str(step), "agl_group": "g0"}
    return rollout_pb2.RolloutSpec(
        rollout_id=rollout_id, input_json='{"question": "2+2?"}', metadata=rollout_pb2.RolloutMetadata(labels=labels)
    )


def tool_conversation(rollout_id: str) -> list[event_pb2.Event]:
    """Two model calls (the first asks for a tool, the second answers with its result) and a reward."""
    first_request = {"model": "m", "messages": [{"role": "user", "content": "What is 2+2?"}]}
    first_reply = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"x": "2+2"}'}}
                    ],
                }
            }
        ]
    }
    second_request = {
        "model": "m",
        "messages": [
            *first_request["messages"],
            first_reply["choices"][0]["message"],
            {"role": "tool", "tool_call_id": "call_1", "content": "4"},
        ],
    }
    second_reply = {"choices": [{"message": {"role": "assistant", "content": "The answer is 4."}}]}
    events = []
    for request, reply, prompt, response in (
        (first_request, first_reply, [1, 2, 3], [7, 8]),
        (second_request, second_reply, [1, 2, 3, 7, 8, 9], [11, 12, 13]),
    ):
        event = event_pb2.Event(rollout_id=rollout_id, event_type="model_request")
        mr = event.model_request
        mr.request_json = json.dumps(request)
        mr.response_json = json.dumps(reply)
        mr.prompt_token_ids.extend(prompt)
        mr.response_token_ids.extend(response)
        mr.response_logprobs.extend([-0.25] * len(response))
        mr.has_response_logprobs = True
        mr.model, mr.model_version, mr.latency_seconds, mr.http_status = "m", 3, 0.42, 200
        mr.api = "chat.completions"
        events.append(event)
    first = events[0].model_request
    first.warnings.append("tools[0] is a built-in 'web_search' tool, which the engine cannot run")
    first.requested_max_tokens, first.granted_max_tokens = 32_000, 509
    events.append(
        event_pb2.Event(rollout_id=rollout_id, event_type="reward", reward=event_pb2.Reward(value=1.0, source="judge"))
    )
    return events


async def finish(client: LedgerClient, rollout_id: str, state: int = SUCCEEDED, error: str = "") -> None:
    await client.update_status(rollout_id, RUNNING, attempt_id=f"{rollout_id}-a1")
    await client.update_status(rollout_id, state, error_message=error)


async def test_rollouts_list_filters_pages_and_json(ledger, uid):
    run = f"run-{uid}"
    async with LedgerClient(ledger.address, KEY) as client:
        await client.create_rollouts([spec(f"{uid}-{i}", run) for i in range(5)])
        await client.create_rollouts([spec(f"{uid}-other", f"other-{uid}")])
        await finish(client, f"{uid}-1", FAILED, "agent exited with code 3")
    result = run_agl("rollouts", "--run", run, ledger=ledger.address)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].split() == ["ROLLOUT", "STATE", "RUN", "STEP", "CREATED", "ERROR"]
    assert [line.split()[0] for line in lines[1:]] == [f"{uid}-{i}" for i in range(5)]
    assert "agent exited with code 3" in result.out
    failed = run_agl("rollouts", "--run", run, "--state", "failed", "--json", ledger=ledger.address)
    assert failed.code == 0
    assert [r["rollout_id"] for r in json.loads(failed.out)["rollouts"]] == [f"{uid}-1"]
    page = run_agl("rollouts", "--run", run, "--page-size", "2", "--json", ledger=ledger.address)
    first = json.loads(page.out)
    assert len(first["rollouts"]) == 2 and first["next_page_token"]
    rest = run_agl(
        "rollouts", "--run", run, "--page-size", "2", "--page-token", first["next_page_token"], ledger=ledger.address
    )
    assert [line.split()[0] for line in rest.out.splitlines()[1:]] == [f"{uid}-2", f"{uid}-3"]
    assert "more: --page-token" in rest.err
    everything = run_agl("rollouts", "--label", f"agl_run={run}", "--page-size", "2", "--all", ledger=ledger.address)
    assert len(everything.out.splitlines()) == 6 and "more:" not in everything.err


async def test_rollout_shows_the_conversation_tool_calls_and_reward(ledger, uid):
    rollout_id = f"{uid}-conv"
    async with LedgerClient(ledger.address, KEY) as client:
        await client.create_rollouts([spec(rollout_id, f"run-{uid}")])
        await client.update_status(rollout_id, RUNNING, attempt_id="a1")
        await client.append_events(tool_conversation(rollout_id))
        await client.update_status(rollout_id, SUCCEEDED)
    result = run_agl("rollout", rollout_id, ledger=ledger.address)
    assert result.code == 0, result.err
    text = result.out
    assert f"rollout {rollout_id}  succeeded  attempt a1" in text
    assert "user: What is 2+2?" in text
    assert '-> tool call call_1: calc({"x": "2+2"})' in text
    assert "tool[call_1]: 4" in text
    assert "assistant: The answer is 4." in text
    assert "-- call 2: m v3  6 prompt + 3 response tokens  0.42s  http 200\n" in text
    assert "http 200  max_tokens 32000 asked, 509 granted\n  warning: tools[0] is a built-in 'web_search'" in text
    assert "-- reward 1 (judge)" in text
    assert text.count("user: What is 2+2?") == 1  # the second call shows only its new messages
    assert "prompt_token_ids" not in text
    tokens = run_agl("rollout", rollout_id, "--tokens", ledger=ledger.address)
    assert "response_token_ids: [11, 12, 13]" in tokens.out and "response_logprobs: [-0.25, -0.25, -0.25]" in tokens.out
    as_json = json.loads(run_agl("rollout", rollout_id, "--json", ledger=ledger.address).out)
    assert as_json["rollout"]["rollout_id"] == rollout_id and len(as_json["events"]) == 3


async def test_unknown_ids_exit_2_naming_them(ledger, uid):
    for args in (("rollout", f"missing-{uid}"), ("run", f"missing-{uid}")):
        result = run_agl(*args, ledger=ledger.address)
        assert result.code == 2
        assert f"missing-{uid}" in result.err and "not found" in result.err
        assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err
    bad = run_agl("rollouts", "--label", "no-equals-sign", ledger=ledger.address)
    assert bad.code == 2 and "KEY=VALUE" in bad.err
    usage = run_agl("rollouts", "--state", "sleeping", ledger=ledger.address)
    assert usage.code == 2 and "invalid choice" in usage.err


def test_ledger_down_is_one_line_exit_3():
    address = f"127.0.0.1:{free_port()}"
    result = run_agl("rollouts", ledger=address)
    assert result.code == 3
    assert result.err.strip() == (
        f"agl: cannot reach the ledger at {address} (unavailable); is it running? set --ledger or AGL_LEDGER_ADDR"
    )
    assert result.out == ""


def test_runs_from_a_folder_without_a_stored_ledger_is_one_line(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    result = run_agl("runs", ledger=address)
    assert result.code == 3 and result.err.strip().endswith(
        "; a finished agl train or make demo run: --from its folder"
    )
    result = run_agl("runs", "--from", str(tmp_path), ledger=address)
    assert result.code == 2
    assert (
        result.err == f"agl: --from {tmp_path}: no stored ledger there ({tmp_path}/stack/ledger-data/ledger.db "
        "and its key file, as agl train and make demo leave in their run folder)\n"
    )
    result = run_agl("--ledger", address, "run", "r1", "--from", str(tmp_path), ledger=address)
    assert result.code == 2 and "--from serves the run's own stored ledger with its key" in result.err


def test_wrong_or_missing_key_says_so_exit_4(ledger):
    for key in ("wrong-key", None):
        result = run_agl("models", ledger=ledger.address, key=key)
        assert result.code == 4, result.err
        assert "refused the key" in result.err and "AGL_KEY" in result.err
        assert "wrong-key" not in result.err  # the key itself is never printed
        assert "Traceback" not in result.err


async def test_watch_shows_rollouts_as_they_finish(ledger, uid):
    run = f"run-{uid}"
    async with LedgerClient(ledger.address, KEY) as client:
        await client.create_rollouts([spec(f"{uid}-before", run), spec(f"{uid}-live", run)])
        await finish(client, f"{uid}-before")  # finished before the watch: not shown without --after
        env = {"AGL_LEDGER_ADDR": ledger.address, "AGL_KEY": KEY, "PATH": "/usr/bin:/bin"}
        argv = [str(AGL), "watch", "--run", run, "--limit", "1"]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
            try:
                assert proc.stderr is not None and proc.stdout is not None
                banner = await asyncio.to_thread(proc.stderr.readline)
                assert banner.startswith("watching terminal rollouts after cursor")
                await client.update_status(f"{uid}-live", RUNNING, attempt_id="a1")
                reward = event_pb2.Event(rollout_id=f"{uid}-live", reward=event_pb2.Reward(value=0.5))
                await client.append_events([reward])
                await client.update_status(f"{uid}-live", SUCCEEDED)
                line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
                assert f"{uid}-live  succeeded  reward 0.5" in line
                assert await asyncio.to_thread(proc.wait, 20) == 0
            finally:
                proc.kill()
    replay = run_agl("watch", "--run", run, "--after", "0", "--limit", "2", "--json", ledger=ledger.address)
    assert replay.code == 0
    items = [json.loads(line) for line in replay.out.splitlines()]
    assert [i["rollout"]["rollout_id"] for i in items] == [f"{uid}-before", f"{uid}-live"]
    assert items[1]["reward"] == 0.5 and items[0]["cursor"] < items[1]["cursor"]


async def test_runs_and_run_show_steps_and_metrics(ledger, uid):
    run_id = f"run-{uid}"
    async with LedgerClient(ledger.address, KEY) as client:
        await progress.start_run(client, run_id, {"who": uid}, {"algorithm": "grpo"})
        for step in (1, 2, 3):
            metrics = {"critic/score/mean": step / 4, "val/agl/reward_mean": step / 10, "timing_s/gen": 2.0}
            await progress.report_step(client, run_id, step, metrics)
    runs = run_agl("runs", "--label", f"who={uid}", ledger=ledger.address)
    assert runs.code == 0
    assert runs.out.splitlines()[1].split()[:4] == [run_id, "running", "3", "3"]
    table = run_agl("run", run_id, ledger=ledger.address)
    assert table.code == 0, table.err
    lines = table.out.splitlines()
    header = next(line for line in lines if line.startswith("STEP"))
    assert header.split() == ["STEP", "TIME", "critic/score/mean", "val/agl/reward_mean", "timing_s/gen"]
    rows = [line.split() for line in lines[lines.index(header) + 1 :]]
    assert [(r[0], r[3], r[4], r[5]) for r in rows] == [
        ("1", "0.25", "0.1", "2"),
        ("2", "0.5", "0.2", "2"),
        ("3", "0.75", "0.3", "2"),
    ]
    picked = run_agl("run", run_id, "--metric", "val/agl/reward_mean", "--last", "1", "--json", ledger=ledger.address)
    data = json.loads(picked.out)
    assert data["run"]["run_id"] == run_id and [s["step"] for s in data["steps"]] == ["3"]
    assert data["steps"][0]["metrics"] == {"val/agl/reward_mean": 0.3}
    as_json = json.loads(run_agl("runs", "--label", f"who={uid}", "--json", ledger=ledger.address).out)
    assert [r["run_id"] for r in as_json["runs"]] == [run_id]


async def test_models(ledger, uid):
    async with LedgerClient(ledger.address, KEY) as client:
        await client.register_models(
            [model_pb2.ModelEndpoint(model_name=f"m-{uid}", endpoint="http://e1/v1", version=7)]
        )
    result = run_agl("models", "--model", f"m-{uid}", ledger=ledger.address)
    assert result.code == 0
    assert result.out.splitlines()[1].split()[:3] == [f"m-{uid}", "http://e1/v1", "7"]
    data = json.loads(run_agl("models", "--model", f"m-{uid}", "--json", ledger=ledger.address).out)
    assert data["endpoints"][0]["version"] == "7"


async def test_enqueue_creates_rollouts_with_the_config_flags(ledger, uid, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "1+1"}\n\n{"question": "2+2"}\n')
    args = ("enqueue", str(tasks), "--agent-class", "agents.math:Agent", "--timeout", "30")
    args += ("--env-map", "QUESTION=input.question", "--label", f"batch={uid}", "--id-prefix", f"b-{uid}")
    result = run_agl(*args, ledger=ledger.address)
    assert result.code == 0, result.err
    assert result.out.split() == [f"b-{uid}-1", f"b-{uid}-2"]
    assert "enqueued 2 rollouts" in result.err
    again = run_agl(*args, "--json", ledger=ledger.address)  # same ids: nothing created twice
    assert json.loads(again.out) == {"rollout_ids": [f"b-{uid}-1", f"b-{uid}-2"]}
    async with LedgerClient(ledger.address, KEY) as client:
        rollouts = await client.list_rollouts(labels={"batch": uid})
    assert [r.rollout_id for r in rollouts] == [f"b-{uid}-1", f"b-{uid}-2"]
    first = rollouts[0]
    assert first.config.local.agent_class == "agents.math:Agent" and first.config.timeout_seconds == 30
    assert dict(first.config.local.env_map) == {"QUESTION": "input.question"} and not first.is_train
    assert first.status.state == rollout_pb2.ROLLOUT_STATE_QUEUING and json.loads(first.input_json) == {
        "question": "1+1"
    }
    from_stdin = run_agl("enqueue", "-", "--command", "python agent.py --fast", ledger=ledger.address, stdin='"hi"\n')
    assert from_stdin.code == 0
    async with LedgerClient(ledger.address, KEY) as client:
        made = await client.get_rollout(from_stdin.out.strip())
    assert list(made.config.local.command) == ["python", "agent.py", "--fast"]

    tasks.write_text('{"question": "1+1"}\n{broken\n')
    broken = run_agl("enqueue", str(tasks), "--agent-class", "a:B", ledger=ledger.address)
    assert broken.code == 2 and f"{tasks}:2: not valid JSON" in broken.err
    nothing = run_agl("enqueue", str(tasks), ledger=ledger.address)
    assert nothing.code == 2 and "--agent-class, --command or --k8s-template" in nothing.err
    missing = run_agl("enqueue", str(tmp_path / "nope.jsonl"), "--agent-class", "a:B", ledger=ledger.address)
    assert missing.code == 2 and "cannot read" in missing.err


async def test_proxy_pause_resume_state_and_drain(ledger, uid):
    paused = run_agl("proxy", "pause", "--reason", "weights", "--retry-after", "7", ledger=ledger.address)
    assert paused.code == 0 and paused.out.startswith("proxies paused") and "reason: weights" in paused.out
    state = json.loads(run_agl("proxy", "state", "--json", ledger=ledger.address).out)
    assert state["control"]["paused"] and state["control"]["retry_after_seconds"] == 7
    resumed = run_agl("proxy", "resume", ledger=ledger.address)
    assert resumed.code == 0 and resumed.out.startswith("proxies serving")
    async with LedgerClient(ledger.address, KEY) as client:
        control = await client.get_proxy_control()
        # A replica with a call in flight: the drain waits, then times out (exit 5) and leaves the proxies paused.
        await client.report_proxy_replica(f"p-{uid}", 1, control.generation, ttl_seconds=60)
        stuck = await asyncio.to_thread(run_agl, "proxy", "drain", "--wait", "0.5", ledger=ledger.address)
        assert stuck.code == 5 and "not drained after 0.5s" in stuck.err
        assert (await client.get_proxy_control()).paused
        waiting = asyncio.create_task(
            asyncio.to_thread(run_agl, "proxy", "drain", "--wait", "30", ledger=ledger.address)
        )
        await asyncio.sleep(1.0)
        assert not waiting.done()
        generation = (await client.get_proxy_control()).generation
        await client.report_proxy_replica(f"p-{uid}", 0, generation, ttl_seconds=60)
        drained = await asyncio.wait_for(waiting, 30)
        assert drained.code == 0, drained.err
        assert "drained: 1 replicas paused with nothing in flight" in drained.err
        assert f"p-{uid}" in drained.out
        await client.report_proxy_replica(f"p-{uid}", 0, generation, leaving=True)
        await client.set_proxy_pause(False)
        # One model's drain: a call of another model in flight does not hold it; the proxy-wide state stays serving.
        ahead = (await client.get_proxy_control()).generation + 1  # the generation the model's pause will have
        await client.report_proxy_replica(f"m-{uid}", 1, ahead, ttl_seconds=60, model_in_flight={"b": 1})
        one = await asyncio.to_thread(run_agl, "proxy", "drain", "--model", "a", "--wait", "10", ledger=ledger.address)
        assert one.code == 0 and "model a paused" in one.out and one.out.startswith("proxies serving"), one.err
        resumed = run_agl("proxy", "resume", "--model", "a", "--json", ledger=ledger.address)
        assert not json.loads(resumed.out)["control"].get("model_pauses")
        await client.report_proxy_replica(f"m-{uid}", 0, generation, leaving=True)


async def test_models_register_and_rm(ledger, uid):
    name = f"reg-{uid}"
    added = run_agl("models", "register", name, "http://10.0.0.5:8000/v1/", "--version", "3", ledger=ledger.address)
    assert added.code == 0, added.err
    assert added.out.strip() == f"registered {name} -> http://10.0.0.5:8000/v1 (version 3)"
    run_agl("models", "register", name, "http://10.0.0.6:8000/v1", ledger=ledger.address)
    async with LedgerClient(ledger.address, KEY) as client:
        stored = sorted((e.endpoint, e.version) for e in await client.list_models(name))
    assert stored == [("http://10.0.0.5:8000/v1", 3), ("http://10.0.0.6:8000/v1", 0)]
    bad = run_agl("models", "register", name, "10.0.0.5:8000", ledger=ledger.address)
    assert bad.code == 2 and "not an engine base URL" in bad.err
    one = run_agl("models", "rm", name, "http://10.0.0.6:8000/v1", ledger=ledger.address)
    assert one.code == 0 and "removed 1 endpoint(s)" in one.out
    async with LedgerClient(ledger.address, KEY) as client:
        assert [e.endpoint for e in await client.list_models(name)] == ["http://10.0.0.5:8000/v1"]
    assert run_agl("models", "rm", name, ledger=ledger.address).code == 0
    gone = run_agl("models", "rm", name, ledger=ledger.address)
    assert gone.code == 2 and f"no endpoint of {name} is registered" in gone.err
