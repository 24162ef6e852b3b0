"""The trajectory log: training calls decoded from their tokens, validation calls from their recorded text."""

from __future__ import annotations

import json

from services._gen.agl.v1 import event_pb2
from services.trainer.data.triplets import RolloutTrace, Triplet, call_text
from services.trainer.run.trajectory_log import trajectory_records


def recorded(request: dict, response: dict, **fields) -> event_pb2.ModelRequest:
    return event_pb2.ModelRequest(
        request_json=json.dumps(request), response_json=json.dumps(response), status=event_pb2.MODEL_REQUEST_STATUS_OK,
        **fields,
    )  # fmt: skip


def test_validation_calls_are_written_from_their_text() -> None:
    chat = recorded(
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]},
        {"choices": [{"message": {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{\"a\": 2}"}}
        ]}, "finish_reason": "tool_calls"}]},
        usage=event_pb2.TokenUsage(prompt_tokens=21, completion_tokens=9),
        finish_reason="tool_calls",
        model_version=4,
    )  # fmt: skip
    plain = recorded({"prompt": "2 + 3 ="}, {"choices": [{"text": " 5"}]})
    failed = event_pb2.ModelRequest(response_json='{"error": "boom"}', status=event_pb2.MODEL_REQUEST_STATUS_ERROR)
    trace = RolloutTrace("v0", "g", "d0", 1.0, call_texts=[call_text(chat), call_text(plain), call_text(failed)])
    [record] = trajectory_records(0, [trace], lambda ids: "never decoded", {"d0": {"q": 1}}, kind="validation")
    assert record["kind"] == "validation" and record["input"] == {"q": 1}
    first, second, third = record["calls"]
    assert first == {
        "prompt": "system: Be brief.\nuser: What is 2 + 3?",
        "response": 'assistant: \n[tool call calculator({"a": 2})]',
        "prompt_tokens": 21,
        "response_tokens": 9,
        "model_version": 4,
        "finish_reason": "tool_calls",
    }
    assert second["prompt"] == "2 + 3 =" and second["response"] == " 5"
    assert third["failed"] is True and third["response"] == '{"error": "boom"}'


def test_training_calls_are_decoded_and_failed_rollouts_say_why() -> None:
    trace = RolloutTrace(
        "r0", "g", "d0", 0.0, triplets=[Triplet([1, 2], [3], None, 0, 2)], succeeded=False,
        failure_reason="EXIT_CODE", error_message="agent exited with code 1 (log: /l/r0.log)",
    )  # fmt: skip
    [record] = trajectory_records(1, [trace], lambda ids: "-".join(map(str, ids)), {})
    assert record["calls"] == [
        {"prompt": "1-2", "response": "3", "prompt_tokens": 2, "response_tokens": 1, "model_version": 2}
    ]
    assert record["failure_reason"] == "EXIT_CODE" and record["error"].endswith("(log: /l/r0.log)")


def test_a_resume_forgets_the_records_of_the_steps_it_does_again(tmp_path) -> None:
    from services.trainer.run.trajectory_log import TrajectoryLog

    log = TrajectoryLog(tmp_path / "t.jsonl", decode=lambda ids: "", inputs={})
    steps = [1, 1, 2, 2, 3]
    log.path.write_text(
        "".join(json.dumps({"step": s, "rollout_id": f"r{i}"}) + "\n" for i, s in enumerate(steps)) + '{"step": 3, "ro'
    )
    # The checkpoint of step 2: step 3's records and the line a kill cut short go; nothing else moves.
    assert log.forget_after(2) == 2
    assert [json.loads(line)["rollout_id"] for line in log.path.read_text().splitlines()] == ["r0", "r1", "r2", "r3"]
    assert log.forget_after(2) == 0
    assert log.forget_after(0) == 4 and log.path.read_text() == ""
    assert TrajectoryLog(tmp_path / "none.jsonl", decode=lambda ids: "", inputs={}).forget_after(5) == 0
