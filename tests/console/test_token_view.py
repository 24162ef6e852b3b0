"""Each token's fate in a real headless chromium: a multi-turn rollout in the real ledger, the trainer's record of
it built by the trainer's own code (triplet view -> rows -> advantages -> row_records), and a run whose step health
is over a limit; the run page marks the step, its metric links to the rollouts behind it, and the rollout page
shows its calls and, below them, the rows: masks, the engine's and the trainer's log-probs and the advantage as
stored."""

from __future__ import annotations

import json
import uuid
from collections import Counter

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient
from services.trainer.data import step_health as health
from services.trainer.data.adapter import DataPathSettings, build_training_batch
from services.trainer.data.aggregation import AggregationLevel
from services.trainer.data.guardrails import DEFAULT_LIMITS, Guardrails
from services.trainer.data.infra_policy import InfraSettings, select
from services.trainer.data.row_records import flags_by_rollout, row_events, row_records
from services.trainer.data.triplets import trace_from_events
from services.trainer.run import progress

from .conftest import KEY
from .test_browser import sign_in

RUNNING = rollout_pb2.ROLLOUT_STATE_RUNNING
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
VOCAB = {5: "<user>", 6: "What", 7: " is", 8: " 37*84", 9: "?", 20: "<call>", 21: "calc", 22: "</call>", 30: "<tool>",
         31: "3108", 32: "</tool>", 40: "It", 41: " is", 42: " 3108", 50: "<again>"}  # fmt: skip


def model_call(rollout_id: str, prompt: list[int], response: list[int], logprobs: list[float], messages, answer):
    event = event_pb2.Event(rollout_id=rollout_id, event_type="model_request")
    mr = event.model_request
    mr.request_json = json.dumps({"messages": messages})
    mr.response_json = json.dumps({"choices": [{"message": answer}]})
    mr.prompt_token_ids.extend(prompt)
    mr.response_token_ids.extend(response)
    mr.response_logprobs.extend(logprobs)
    mr.has_response_logprobs = True
    mr.status = event_pb2.MODEL_REQUEST_STATUS_OK
    mr.model, mr.model_version, mr.http_status = "tiny", 3, 200
    return event


def conversation(rollout_id: str, *, broken: bool) -> list[event_pb2.Event]:
    user = {"role": "user", "content": "What is 37*84?"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{\"e\": \"37*84\"}"}}]}  # fmt: skip
    tool = {"role": "tool", "tool_call_id": "c1", "content": "3108"}
    first_prompt = [5, 6, 7, 8, 9]
    second_prompt = [*first_prompt, 20, 21, 22, 30, 31, 32]
    if broken:  # the history was re-rendered: not a pure append
        second_prompt = [5, 6, 7, 8, 9, 50, 30, 31, 32]
    answer = {"role": "assistant", "content": "It is 3108"}
    value = 0.0 if broken else 1.0
    return [
        model_call(rollout_id, first_prompt, [20, 21, 22], [-0.25, -0.5, -0.125], [user], call),
        model_call(rollout_id, second_prompt, [40, 41, 42], [-1.0, -0.0625, -0.75], [user, call, tool], answer),
        event_pb2.Event(rollout_id=rollout_id, event_type="reward", reward=event_pb2.Reward(value=value)),
    ]


async def test_run_health_links_to_the_rollouts_and_their_tokens_fate(browser, console, ledger, screenshot):
    uid = uuid.uuid4().hex[:8]
    run_id = f"tok-{uid}"
    ids = [f"{run_id}-s2-g0-r0", f"{run_id}-s2-g0-r1"]
    labels = {"agl_run": run_id, "agl_step": "2", "agl_group": f"{run_id}-s2-g0", "agl_data_id": "d0"}
    async with LedgerClient(ledger.address, KEY) as client:
        summary = {"algorithm": "grpo", "health_limits": Guardrails(DEFAULT_LIMITS).describe()}
        await progress.start_run(client, run_id, {"model": "tiny"}, summary)
        specs = [
            rollout_pb2.RolloutSpec(rollout_id=i, input_json='{"q": "37*84"}', is_train=True,
                                    metadata=rollout_pb2.RolloutMetadata(labels=labels))
            for i in ids
        ]  # fmt: skip
        await client.create_rollouts(specs)
        for rid, broken in zip(ids, (False, True), strict=True):
            await client.update_status(rid, RUNNING, attempt_id="a1")
            await client.append_events(conversation(rid, broken=broken))
            await client.update_status(rid, SUCCEEDED)

        # The trainer's side, with its own code over the ledger's triplet view.
        traces = []
        for rid in ids:
            events = await client.list_events(rid, view=event_pb2.EVENT_VIEW_TRIPLET)
            traces.append(trace_from_events(rid, labels["agl_group"], "d0", events, reward_fillna_value=0.0,
                                            counts=Counter(), attempt_id="a1"))  # fmt: skip
        selection = select(traces, InfraSettings(), group_size=2)
        counts: Counter[str] = Counter()
        settings = DataPathSettings(level=AggregationLevel.TRAJECTORY, max_prompt_length=64, max_response_length=64)
        prepared = build_training_batch(selection.kept, settings, counts=counts)
        step_health = health.trace_health(traces, InfraSettings().reasons)
        step_health.update(prepared.health)
        recomputed = {(ids[0], 0): [-0.25, -0.5, -0.125, 0.0, 0.0, 0.0, -1.0, -0.0625, -0.75], (ids[1], 0): [-0.5] * 3}
        records = row_records(
            2, traces, {t.rollout_id for t in selection.kept}, selection.left_out, prepared.rows,
            prepared.advantages, {(ids[0], 0), (ids[1], 0), (ids[1], 1)}, recomputed,
            flags_by_rollout({n: step_health.rollouts(n) for n in health.NAMES}), lambda t: [VOCAB[i] for i in t],
        )  # fmt: skip
        await client.append_events(row_events(2, records, {rid: "a1" for rid in ids}), allow_terminal=True)
        metrics = {**step_health.metrics(), "agl/reward/mean": 0.5}
        await progress.report_step(client, run_id, 1, {"agl/health/trajectory_breaks": 0.0, "agl/reward/mean": 0.4})
        await progress.report_step(client, run_id, 2, metrics)

    # One break in two continued calls: 0.5 is over the warning limit 0.05, not over the stop limit 0.5.
    assert metrics["agl/health/trajectory_breaks"] == 0.5
    sign_in(browser, console, path=f"/runs/{run_id}")
    header = browser.find_element(By.CSS_SELECTOR, '#health th[data-step="2"]')
    assert header.get_attribute("data-level") == "warn" and "over-warn" in header.get_attribute("class")
    assert browser.find_element(By.CSS_SELECTOR, '#health th[data-step="1"]').get_attribute("data-level") == ""
    cell = browser.find_element(
        By.CSS_SELECTOR, '#health tr[data-metric="agl/health/trajectory_breaks"] td[data-step="2"]'
    )
    assert cell.get_attribute("data-level") == "warn" and cell.text == "0.5"
    screenshot("run-health")
    cell.find_element(By.TAG_NAME, "a").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "health-rollouts"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "agl/health/trajectory_breaks at step 2"
    listed = browser.find_elements(By.CSS_SELECTOR, "#health-rollouts td:first-child a")
    assert [a.text for a in listed] == [ids[1]]  # only the broken one counts in it
    screenshot("health-rollouts")
    listed[0].click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "training"))
    broken = browser.find_element(By.CSS_SELECTOR, '.training[data-step="2"]')
    rows = broken.find_elements(By.CSS_SELECTOR, ".row")
    assert [r.get_attribute("data-segment") for r in rows] == ["0", "1"]
    assert "break: the prompt continued no earlier row" in rows[1].text and "segment 2 of 2" in rows[1].text
    assert "trajectory_breaks" in broken.find_element(By.CSS_SELECTOR, ".call-head").text
    # Its first segment's recomputed log-probs differ from the engine's by up to 0.375 (-0.5 vs -0.125).
    assert rows[0].find_element(By.CSS_SELECTOR, ".row-gap").text == "0.375"
    assert not rows[1].find_elements(By.CSS_SELECTOR, ".row-gap")  # none kept for it
    advantage = float(broken.find_element(By.CSS_SELECTOR, ".t-advantage").text)
    assert advantage == round(prepared.advantages[ids[1]], 4) < 0  # scored 0 against its sibling's 1

    # The multi-turn rollout: its two calls (with the tool call) above, one row below: the call, the tool result as
    # context (mask 0), the answer; both log-probs per token as stored.
    browser.get(f"{console.url}/rollouts/{ids[0]}")
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "training"))
    transcript = browser.find_element(By.ID, "transcript").text
    assert "What is 37*84?" in transcript and "calc" in transcript and "It is 3108" in transcript
    assert "agl_training_rows" not in transcript
    [row] = browser.find_elements(By.CSS_SELECTOR, '.training[data-step="2"] .row')
    assert "segment 1 of 1" in row.text and "turns 1-2" in row.text and "trained" in row.text
    tokens = row.find_elements(By.CSS_SELECTOR, ".tok")
    attributes = ("data-mask", "data-engine-lp", "data-trainer-lp")
    shown = [(t.get_attribute("textContent"), *(t.get_attribute(a) for a in attributes)) for t in tokens]
    assert shown == [
        ("<call>", "1", "-0.25", "-0.25"),
        ("calc", "1", "-0.5", "-0.5"),
        ("</call>", "1", "-0.125", "-0.125"),
        ("<tool>", "0", "0", "0"),
        ("3108", "0", "0", "0"),
        ("</tool>", "0", "0", "0"),
        ("It", "1", "-1", "-1"),
        (" is", "1", "-0.0625", "-0.0625"),
        (" 3108", "1", "-0.75", "-0.75"),
    ]
    # The recomputation given above equals the engine's on every sampled token.
    assert row.find_element(By.CSS_SELECTOR, ".row-gap").text == "0"
    assert [t.get_attribute("class") for t in tokens[2:5]] == ["tok gen", "tok ctx", "tok ctx"]
    assert float(browser.find_element(By.CSS_SELECTOR, ".t-advantage").text) == round(prepared.advantages[ids[0]], 4)
    assert browser.find_element(By.CSS_SELECTOR, ".t-reward").text == "1"
    screenshot("token-view")
