"""tools/gpu_smoke.py's decisions, on CPU: its overrides compose into verl configs without graph capture or
compiling, and its PASS/FAIL checks accept a correct run (retention keeps the last steps' rollouts; a step skipped
for no learning signal has no actor metrics) and refuse a wrong one."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import os
import pprint
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass

from services._gen.agl.v1 import model_pb2, proxy_control_pb2
from services.client import LedgerClient
from services.trainer.config import CONFIG_DIR, CONFIG_NAME
from tests.support.procs import start_ledger
from tools import gpu_checks, gpu_greedy, gpu_smoke

pytestmark = pytest.mark.trainer


def test_the_smoke_runs_overrides_turn_off_graph_capture_and_compiling(tmp_path: Path) -> None:
    args = argparse.Namespace(data_dir=tmp_path, gpu_memory_utilization=0.3, steps=2)
    items = gpu_smoke.overrides(args, "smoke", "127.0.0.1:1", "", tmp_path / "model", tmp_path / "tasks.jsonl")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=items)
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    rollout = omega_conf_to_dataclass(resolved.actor_rollout_ref.rollout)
    assert rollout.enforce_eager is True
    assert resolved.actor_rollout_ref.actor.use_torch_compile is False
    # What verl's actor engine reads (its fsdp_config interpolates the actor's key).
    assert resolved.actor_rollout_ref.actor.fsdp_config.use_torch_compile is False
    assert cfg.agl.retention.keep_steps == gpu_smoke.KEEP_STEPS


def test_the_step_check_accepts_a_step_skipped_for_no_signal_and_needs_one_update() -> None:
    updated, skipped = {"actor/pg_loss": 0.1}, {"agl/update/skipped_no_signal": 1.0}
    assert gpu_smoke.steps_trained_or_skipped({1: skipped, 2: updated}, 2)[0]
    assert not gpu_smoke.steps_trained_or_skipped({1: skipped, 2: skipped}, 2)[0]
    assert not gpu_smoke.steps_trained_or_skipped({1: updated, 2: {}}, 2)[0]


def test_the_retention_check_keeps_the_last_steps_rollouts_only() -> None:
    # Two steps of 16 rollouts with keep_steps 2: all 32 stay, which is correct.
    assert gpu_smoke.retention_kept([1] * 16 + [2] * 16, 2, 2)[0]
    assert not gpu_smoke.retention_kept([1] * 16 + [2] * 16 + [3] * 16, 3, 2)[0]
    assert gpu_smoke.retention_kept([], 2, 0)[0] and not gpu_smoke.retention_kept([2], 2, 0)[0]
    assert not gpu_smoke.retention_kept([None], 2, 2)[0]


def _step(n: int, **values: float) -> dict[str, float]:
    return {"training/global_step": float(n), **values}


def test_the_gap_check_needs_every_updated_step_under_the_limits() -> None:
    good = {"actor/pg_loss": 0.1, "agl/push/logprob_diff_mean": 0.01, "training/rollout_probs_diff_mean": 0.004}
    skipped = {"agl/update/skipped_no_signal": 1.0}
    assert gpu_checks.gaps_under({1: good, 2: skipped})[0]
    assert not gpu_checks.gaps_under({1: good, 2: {**good, "agl/push/logprob_diff_mean": 0.3}})[0]
    # verl's value for a batch with no valid token, and a step that never measured the gap.
    assert not gpu_checks.gaps_under({1: {**good, "training/rollout_probs_diff_mean": float("nan")}})[0]
    assert not gpu_checks.gaps_under({1: {"actor/pg_loss": 0.1}})[0]
    assert not gpu_checks.gaps_under({1: skipped})[0]


def test_the_drain_check_needs_every_training_step_drained() -> None:
    drained = _step(1, **{"agl/proxy/drained": 1.0, "agl/proxy/drain_s": 0.2})
    # Step 0: the weight sync at the start, which drains nothing and trains nothing.
    assert gpu_checks.drained_every_step({0: {"agl/push/seconds": 1.0}, 1: drained})[0]
    timed_out = {**drained, "agl/proxy/drained": 0.0}
    assert not gpu_checks.drained_every_step({1: drained, 2: timed_out})[0]
    assert not gpu_checks.drained_every_step({1: _step(1)})[0]
    assert not gpu_checks.drained_every_step({})[0]


def test_the_timing_table_has_a_row_per_phase_and_a_column_per_step() -> None:
    table = gpu_checks.timing_table({1: {"timing_s/gen": 1.5, "timing_s/update_actor": 2.0}, 2: {"timing_s/gen": 3}})
    lines = table.splitlines()
    assert lines[0].split() == ["PHASE", "(s)", "step", "1", "step", "2"]
    assert lines[1].split() == ["gen", "1.50", "3.00"] and lines[2].split() == ["update_actor", "2.00", "-"]


def test_the_pause_check_refuses_a_pause_left_behind() -> None:
    serving = proxy_control_pb2.ProxyControl(paused=False, generation=6)
    assert gpu_checks.not_paused(serving)[0]
    left = proxy_control_pb2.ProxyControl(paused=True, generation=5, owner="trainer:smoke", reason="step 2")
    ok, detail = gpu_checks.not_paused(left)
    assert not ok and "trainer:smoke" in detail


def test_the_served_name_check_needs_every_replica_to_serve_the_routed_name() -> None:
    right = {"object": "list", "data": [{"id": "agl-policy", "object": "model"}]}
    assert gpu_checks.served_names({"http://a/v1": right, "http://b/v1": right}, "agl-policy")[0]
    wrong = {"data": [{"id": "/models/tiny", "object": "model"}]}
    assert not gpu_checks.served_names({"http://a/v1": right, "http://b/v1": wrong}, "agl-policy")[0]
    assert not gpu_checks.served_names({"http://a/v1": "ConnectError: refused"}, "agl-policy")[0]
    assert not gpu_checks.served_names({}, "agl-policy")[0]


def test_the_resume_check_needs_the_rewind_and_each_step_once() -> None:
    def records(*steps: int, sync_at: int) -> list[dict[str, object]]:
        # Each launch's first record is its weight sync, at the step it starts from, without training/global_step.
        return [{"step": sync_at, "data": {}}, *({"step": n, "data": _step(n)} for n in steps)]

    log = "... run smoke rewound to the checkpoint of step 1: 0 rollouts of later passes deleted ..."
    first, second = records(1, sync_at=0), records(2, sync_at=1)
    assert gpu_checks.resumed(first, second, 1, 2, log)[0]
    assert not gpu_checks.resumed(first, second, 1, 2, "started afresh")[0]
    # Started from scratch instead of resuming: step 1 trained twice.
    assert not gpu_checks.resumed(first, records(1, 2, sync_at=0), 1, 2, log)[0]
    # Killed before step 1 was on record.
    assert not gpu_checks.resumed(records(sync_at=0), second, 1, 2, log)[0]


def test_a_compiled_function_matches_eager_and_a_mismatch_or_missing_device_is_refused() -> None:
    # aot_eager: torch.compile's tracing without inductor's C++ build (minutes on this machine's shared CPUs); the
    # smoke run compiles with inductor on the GPU.
    ok, detail = gpu_checks.compiled_matches_eager("cpu", backend="aot_eager")
    assert ok, detail
    # Compiled and eager draw different random numbers: the comparison must see it.
    assert not gpu_checks.compiled_matches_eager("cpu", "aot_eager", lambda x: x + torch.rand_like(x))[0]
    if not torch.cuda.is_available():
        assert gpu_checks.compiled_matches_eager("cuda") == (False, "no CUDA device is visible")
    versions = gpu_checks.toolchain()
    assert versions["torch"] == torch.__version__ and set(versions) >= {"cuda", "triton", "c compiler"}


def test_the_resume_runs_overrides_save_every_step(tmp_path: Path) -> None:
    args = argparse.Namespace(data_dir=tmp_path, gpu_memory_utilization=0.3, steps=2)
    items = gpu_smoke.overrides(args, "smoke", "127.0.0.1:1", "", tmp_path / "m", tmp_path / "t.jsonl", save=True)
    assert "trainer.save_freq=1" in items and "trainer.save_freq=-1" not in items


@pytest.mark.parametrize("first", ["record", "checkpoint"])
def test_the_watch_asks_the_replicas_once_then_kills_the_group_once_the_step_is_on_record_and_checkpointed(
    tmp_path: Path, first: str
) -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    records: list[dict[str, object]] = []
    asked: list[int] = []

    def ask() -> dict[str, object]:
        asked.append(len(records))
        return {"http://a/v1": {"data": [{"id": "agl-policy"}]}}

    def record() -> None:
        records.append({"step": 1, "data": _step(1)})

    def checkpoint() -> None:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text("1")

    watch = gpu_smoke.Watch(proc, records, ask, tmp_path, kill_after=1)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    try:
        (record if first == "record" else checkpoint)()
        time.sleep(0.5)
        # One of the two alone: the trainer goes on.
        assert proc.poll() is None and not watch.killed
        (checkpoint if first == "record" else record)()
        thread.join(timeout=10)
        assert proc.wait(timeout=10) == -signal.SIGKILL and watch.killed
        assert asked == [1] and gpu_checks.served_names(watch.models or {}, "agl-policy")[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_sleep_check_needs_a_sleep_that_freed_memory_per_step() -> None:
    # As Ray forwards vLLM's worker line to the trainer's log.
    line = (
        "(WorkerProc pid=71) INFO 12-04 13:00:01 [gpu_worker.py:327] "
        "Sleep mode freed {} GiB memory, 1.20 GiB memory is still in use."
    )
    log = "\n".join(line.format(freed) for freed in ("30.50", "30.48"))
    ok, detail = gpu_checks.slept_every_step(log, 2)
    assert ok and "freed 30.50 GiB (1.20 GiB in use)" in detail, detail
    assert not gpu_checks.slept_every_step(log, 3)[0]
    assert not gpu_checks.slept_every_step(line.format("0.00") + "\n" + line.format("30.00"), 2)[0]
    assert not gpu_checks.slept_every_step("", 0)[0]


def test_the_tool_check_needs_every_replica_to_accept_tool_choice_auto() -> None:
    accepted = (200, '{"choices": [{"message": {"content": "2"}}]}')
    refused = (400, '{"error": {"message": "\\"auto\\" tool choice requires --enable-auto-tool-choice and ..."}}')
    assert gpu_checks.auto_tools({"http://a/v1": accepted, "http://b/v1": accepted})[0]
    ok, detail = gpu_checks.auto_tools({"http://a/v1": accepted, "http://b/v1": refused})
    assert not ok and detail.startswith("http://b/v1: 400")
    assert not gpu_checks.auto_tools({"http://a/v1": (0, "ConnectError: refused")})[0]
    assert not gpu_checks.auto_tools({})[0]


class _Replica(http.server.BaseHTTPRequestHandler):
    """A replica as vLLM answers: its served name at /v1/models; tool choice "auto" refused with 400 unless started
    with a tool parser (the class attribute)."""

    served = "agl-policy"
    parser = True

    def _send(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200, {"object": "list", "data": [{"id": self.served, "object": "model"}]})

    def do_POST(self) -> None:
        call = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if call.get("tool_choice") == "auto" and not self.parser:
            self._send(400, {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}})
        else:
            self._send(200, {"choices": [{"message": {"content": "2"}}]})

    def log_message(self, *args: object) -> None:
        pass


def test_the_replicas_are_asked_through_the_ledgers_endpoints() -> None:
    good = type("Good", (_Replica,), {})
    bare = type("Bare", (_Replica,), {"served": "/models/tiny", "parser": False})
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) for handler in (good, bare)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    urls = [f"http://127.0.0.1:{server.server_address[1]}/v1" for server in servers]
    try:
        with start_ledger() as ledger:

            async def register(url: str) -> None:
                async with LedgerClient(ledger.address) as client:
                    await client.register_models([model_pb2.ModelEndpoint(model_name="agl-policy", endpoint=url)])

            asyncio.run(register(urls[0]))
            answers = asyncio.run(gpu_smoke.ask_replicas(ledger.address, "", "agl-policy"))
            assert list(answers) == [urls[0]]
            assert gpu_checks.served_names({u: a["models"] for u, a in answers.items()}, "agl-policy")[0]
            assert gpu_checks.auto_tools({u: a["tools"] for u, a in answers.items()})[0]
            # A replica started without the routed name and without a tool parser.
            asyncio.run(register(urls[1]))
            answers = asyncio.run(gpu_smoke.ask_replicas(ledger.address, "", "agl-policy"))
            assert sorted(answers) == sorted(urls)
            assert not gpu_checks.served_names({u: a["models"] for u, a in answers.items()}, "agl-policy")[0]
            ok, detail = gpu_checks.auto_tools({u: a["tools"] for u, a in answers.items()})
            assert not ok and detail.startswith(f"{urls[1]}: 400"), detail
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_the_greedy_check_accepts_equal_tokens_or_a_first_divergence_at_a_near_tie() -> None:
    assert gpu_greedy.greedy_agrees([5, 6, 7], [5, 6, 7], [1.0, 1.0, 1.0]) == (True, "3 tokens equal")
    ok, detail = gpu_greedy.greedy_agrees([5, 9, 1], [5, 6, 7], [1.0, 0.01, 1.0])
    assert ok and "token 1 (9 vs 6)" in detail and "near-tie" in detail
    assert not gpu_greedy.greedy_agrees([5, 9, 7], [5, 6, 7], [1.0, 0.5, 1.0])[0]
    assert not gpu_greedy.greedy_agrees([5, 6], [5, 6, 7], [1.0, 1.0, 1.0])[0]


def test_the_greedy_check_needs_every_replica_asked_at_the_first_weights() -> None:
    hf, margins = [5, 6, 7], [1.0, 1.0, 1.0]
    good = {"greedy": {"ids": [5, 6, 7]}, "versions": (0, 0)}
    assert gpu_greedy.replicas_agree({"http://a/v1": good}, hf, margins)[0]
    # Asked across an update (registered at 0, then 1): not the first sync's weights.
    moved = {**good, "versions": (0, 1)}
    ok, detail = gpu_greedy.replicas_agree({"http://a/v1": good, "http://b/v1": moved}, hf, margins)
    assert not ok and "http://b/v1 asked at weights versions (0, 1)" in detail
    failed = {"greedy": {"error": "HTTP 500: boom"}, "versions": (0, 0)}
    assert not gpu_greedy.replicas_agree({"http://a/v1": failed}, hf, margins)[0]
    assert not gpu_greedy.replicas_agree({"http://a/v1": {**good, "greedy": {"ids": [5, 8, 7]}}}, hf, margins)[0]
    assert not gpu_greedy.replicas_agree({}, hf, margins)[0]


def test_hugging_face_greedy_is_the_argmax_of_each_next_token(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from services.engine.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "model", hidden=64, layers=2)
    ids = gpu_greedy.prompt_ids(model_dir)
    new, margins = gpu_greedy.hf_greedy(model_dir, ids, new_tokens=6, device="cpu", dtype="float32")
    assert 1 <= len(new) <= 6 and len(margins) == len(new) and all(m >= 0 for m in margins)
    # The same tokens by hand: one forward pass per token, the argmax of the last position.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens = list(ids)
    with torch.no_grad():
        for _ in new:
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    assert tokens[len(ids) :] == new


class _GreedyReplica(_Replica):
    """A replica that continues any prompt with the same token ids, as vLLM's /v1/completions returns them."""

    asked: ClassVar[list[dict[str, object]]] = []

    def do_POST(self) -> None:
        call = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.asked.append(call)
        self._send(200, {"choices": [{"text": "12", "token_ids": [16, 17]}]})


def test_the_greedy_ask_waits_for_replicas_at_the_first_version_and_says_their_version_around_the_call() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GreedyReplica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        with start_ledger() as ledger:

            async def register(version: int) -> None:
                async with LedgerClient(ledger.address) as client:
                    endpoint = model_pb2.ModelEndpoint(model_name="agl-policy", endpoint=url, version=version)
                    await client.register_models([endpoint])

            assert asyncio.run(gpu_smoke.ask_greedy(ledger.address, "", "agl-policy", [1, 2])) is None
            # An earlier run's endpoint at a later version: not yet this launch's first weights.
            asyncio.run(register(2))
            assert asyncio.run(gpu_smoke.ask_greedy(ledger.address, "", "agl-policy", [1, 2])) is None
            asyncio.run(register(0))
            answers = asyncio.run(gpu_smoke.ask_greedy(ledger.address, "", "agl-policy", [1, 2]))
            assert answers == {url: {"greedy": {"ids": [16, 17]}, "versions": (0, 0)}}
            asked = _GreedyReplica.asked[-1]
            assert asked["prompt"] == [1, 2] and asked["temperature"] == 0 and asked["return_token_ids"] is True
    finally:
        server.shutdown()
        server.server_close()


def test_the_wake_check_needs_the_memory_the_sleep_freed_back_after_the_wake() -> None:
    log = (
        "(WorkerProc pid=71) INFO 12-04 13:00:01 [gpu_worker.py:304] "
        "Sleep mode freed 30.00 GiB memory, 6.00 GiB memory is still in use.\n"
    )
    ok, detail = gpu_checks.woke_back(log, 35.5)
    assert ok and detail == "in use before the sleep 36.00 GiB, after it 6.00, after the wake 35.50", detail
    assert not gpu_checks.woke_back(log, 12.0)[0]  # awake again, yet most of the replica's memory not back
    assert not gpu_checks.woke_back(log, None)[0]
    assert not gpu_checks.woke_back("", 35.5)[0]
    # Here, without CUDA, nothing is measured (the smoke run measures on the GPU).
    assert gpu_checks.device_used_gib() is None


def _server_args_as_verl_prints_them(parser: str, name: str) -> str:
    """verl's vLLMHttpServer pprints `vllm serve`'s arguments; Ray forwards each line with the actor's prefix."""
    args = ["serve", "/home/agl/models/tiny", "--dtype", "bfloat16", "--served-model-name", name]
    args += ["--enable-auto-tool-choice", "--tool-call-parser", parser, "--enable-sleep-mode", "--enforce-eager"]
    return "\n".join(f"(vLLMHttpServer pid=88) {line}" for line in pprint.pformat(args).splitlines())


def test_the_tool_parser_check_reads_the_arguments_verl_started_each_server_with() -> None:
    assert OmegaConf.load(Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml").agl.tool_calls.parser == gpu_smoke.TOOL_PARSER
    log = "\n".join(["start", _server_args_as_verl_prints_them("hermes", "agl-policy"), "step 1"])
    assert gpu_checks.logged_flag(log, "tool-call-parser") == ["hermes"]
    ok, detail = gpu_checks.tool_parser_logged(log + "\n" + log, "hermes", "agl-policy")  # two launches
    assert ok and "['hermes', 'hermes']" in detail, detail
    assert not gpu_checks.tool_parser_logged(
        _server_args_as_verl_prints_them("llama3_json", "agl-policy"), "hermes", "agl-policy"
    )[0]
    assert not gpu_checks.tool_parser_logged(_server_args_as_verl_prints_them("hermes", "/m"), "hermes", "agl-policy")[
        0
    ]
    assert not gpu_checks.tool_parser_logged("no server started", "hermes", "agl-policy")[0]
