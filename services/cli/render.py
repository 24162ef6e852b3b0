"""Pure text rendering for `agl`: tables, times, states and a rollout's conversation (no I/O, no gRPC)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import json_format, timestamp_pb2
from google.protobuf.message import Message

from services._gen.agl.v1 import event_pb2, rollout_pb2, run_pb2
from services.printable import printable, terminal_text

# Calls a rollout's role map sent away from its own policy (services/role_map.py): recorded, not trained by the run.
_OTHER_ROLES = {
    event_pb2.MODEL_REQUEST_ROLE_OTHER_POLICY: "another policy's call",
    event_pb2.MODEL_REQUEST_ROLE_FROZEN: "a frozen role's call",
}

ROLLOUT_STATES = {"queuing": 1, "running": 2, "succeeded": 3, "failed": 4}
RUN_STATES = {"running": 1, "succeeded": 2, "failed": 3}


def rollout_state(value: int) -> str:
    return rollout_pb2.RolloutState.Name(value).removeprefix("ROLLOUT_STATE_").lower()


def run_state(value: int) -> str:
    return run_pb2.RunState.Name(value).removeprefix("RUN_STATE_").lower()


def when(ts: timestamp_pb2.Timestamp) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    moment = datetime.datetime.fromtimestamp(ts.seconds, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def seconds_between(start: timestamp_pb2.Timestamp, end: timestamp_pb2.Timestamp) -> float | None:
    if not start.seconds or not end.seconds:
        return None
    return (end.seconds - start.seconds) + (end.nanos - start.nanos) / 1e9


def number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = [list(map(str, row)) for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def as_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def single_line(text: str, limit: int = 80) -> str:
    text = printable(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- conversations ---------------------------------------------------------------------------------------------


def _content(content: Any) -> str:
    """OpenAI message content: a string or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False)


def _message_lines(message: dict[str, Any]) -> list[str]:
    role = printable(str(message.get("role", "?")))
    if role == "tool":
        role = f"tool[{printable(str(message.get('tool_call_id', '')))}]"
    text = _content(message.get("content")).splitlines() or [""]
    lines = [f"  {role}: {line}" if i == 0 else f"    {line}" for i, line in enumerate(text)]
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        called = f"{call.get('id', '')}: {fn.get('name', '?')}({fn.get('arguments', '')})"
        lines.append(f"    -> tool call {printable(called)}")
    return lines


def _loads(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _reply(response: Any, api: str) -> dict[str, Any] | None:
    if not isinstance(response, dict) or not response.get("choices"):
        return None
    choice = response["choices"][0]
    if api == "completions" or "text" in choice:
        return {"role": "assistant", "content": choice.get("text", "")}
    message = choice.get("message")
    return message if isinstance(message, dict) else None


def conversation(rollout: rollout_pb2.Rollout, events: Sequence[event_pb2.Event], tokens: bool = False) -> str:
    """The rollout as readable text: header, input, each model call (new messages only), rewards, others. What the
    agent or the model wrote is escaped (printable): one-line fields stay on their line, and nothing acts on the
    terminal."""
    status = rollout.status
    lines = [f"rollout {rollout.rollout_id}  {rollout_state(status.state)}  attempt {status.attempt_id or '-'}"]
    duration = seconds_between(status.start_time, status.end_time)
    lines.append(
        f"created {when(status.create_time)}  started {when(status.start_time)}  ended {when(status.end_time)}"
        + (f"  ({duration:.2f}s)" if duration is not None else "")
    )
    if rollout.metadata.labels:
        lines.append("labels " + printable(" ".join(f"{k}={v}" for k, v in sorted(rollout.metadata.labels.items()))))
    if status.error_message:
        lines.append(f"error: {printable(status.error_message)}")
    lines.append(f"input: {printable(rollout.input_json)}")
    shown = 0  # messages of the conversation printed so far (requests' messages plus replies)
    calls = 0
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "model_request":
            calls += 1
            mr = event.model_request
            usage = mr.usage
            prompt_n = usage.prompt_tokens or len(mr.prompt_token_ids)
            response_n = usage.completion_tokens or len(mr.response_token_ids)
            lines.append(
                f"-- call {calls}: {printable(mr.model) or '?'} v{mr.model_version}  {prompt_n} prompt + {response_n} "
                f"response tokens  {mr.latency_seconds:.2f}s  http {mr.http_status}"
                + (f"  retries {mr.retry_count}" if mr.retry_count else "")
                + (f"  finish {printable(mr.finish_reason)}" if mr.finish_reason else "")
                + (
                    f"  {_OTHER_ROLES[mr.role]} (asked for {printable(mr.requested_model) or 'no model'}; not trained)"
                    if mr.role in _OTHER_ROLES
                    else ""
                )
                + (
                    f"  max_tokens {mr.requested_max_tokens} asked, {mr.granted_max_tokens} granted"
                    if mr.requested_max_tokens
                    else ""
                )
            )
            lines += [f"  warning: {printable(warning)}" for warning in mr.warnings]
            request = _loads(mr.request_json) or {}
            messages = request.get("messages") if isinstance(request, dict) else None
            if isinstance(messages, list):
                start = shown if 0 < shown <= len(messages) else 0
                for message in messages[start:]:
                    if isinstance(message, dict):
                        lines += _message_lines(message)
                shown = len(messages)
            elif isinstance(request, dict) and "prompt" in request:
                lines.append(f"  prompt: {_content(request['prompt'])}")
            reply = _reply(_loads(mr.response_json), mr.api)
            if reply is not None:
                lines += _message_lines(reply)
                shown += 1
            elif mr.response_json:
                lines.append(f"  response: {single_line(mr.response_json, 200)}")
            if tokens:
                lines.append(f"  prompt_token_ids: {list(mr.prompt_token_ids)}")
                lines.append(f"  response_token_ids: {list(mr.response_token_ids)}")
                logprobs = [round(x, 4) for x in mr.response_logprobs] if mr.has_response_logprobs else None
                lines.append(f"  response_logprobs: {logprobs}")
        elif kind == "reward":
            reward = event.reward
            extra = ", ".join(x for x in (reward.source, reward.reason, reward.message) if x)
            lines.append(f"-- reward {number(reward.value)}" + (f" ({printable(extra)})" if extra else ""))
        else:
            body = event.data_json if kind == "data_json" else ""
            lines.append(f"-- {printable(event.event_type)}: {single_line(body, 200)}")
    if not events:
        lines.append("(no events)")
    return terminal_text("\n".join(lines))


def reward_of(events: Iterable[event_pb2.Event]) -> float | None:
    value = None
    for event in events:
        if event.WhichOneof("payload") == "reward":
            value = event.reward.value
    return value


# -- step health -----------------------------------------------------------------------------------------------

HEALTH_PREFIX = "agl/health/"


def health_limits(config_json: str) -> dict[str, tuple[float | None, float | None]]:
    """The (warn, stop) limits by metric name the trainer recorded in the run's config summary ("health_limits")."""
    config = _loads(config_json)
    raw = config.get("health_limits") if isinstance(config, dict) else None
    limits: dict[str, tuple[float | None, float | None]] = {}
    for name, levels in (raw or {}).items() if isinstance(raw, dict) else ():
        if isinstance(levels, dict):
            limits[name] = (levels.get("warn"), levels.get("stop"))
    return limits


def over_limit(value: float, limit: tuple[float | None, float | None] | None) -> str:
    """ "stop" or "warn" when the value is above that limit (the trainer's rule: strictly above), else ""."""
    if limit is None:
        return ""
    warn, stop = limit
    if stop is not None and value > stop:
        return "stop"
    if warn is not None and value > warn:
        return "warn"
    return ""


def health_table(steps: Sequence[run_pb2.RunStep], limits: dict[str, tuple[float | None, float | None]]) -> str:
    """One line per health metric, one column per step; `!` marks a value over its warning limit, `!!` over its
    stop limit; then the steps over a limit, one line each."""
    names: dict[str, None] = {}
    for step in steps:
        names.update(dict.fromkeys(n for n in sorted(step.metrics) if n.startswith(HEALTH_PREFIX)))
    if not names:
        return "(no health metrics reported: a trainer older than the step health)"
    marks = {"stop": "!!", "warn": "!", "": ""}
    rows = []
    flagged: list[str] = []
    for name in names:
        limit = limits.get(name)
        shown = "/".join("-" if x is None else number(x) for x in limit) if limit else "-"
        cells = []
        for step in steps:
            if name not in step.metrics:
                cells.append("-")
                continue
            value = step.metrics[name]
            level = over_limit(value, limit)
            cells.append(number(value) + marks[level])
            if level and limit is not None:
                bound = limit[1] if level == "stop" else limit[0]
                flagged.append(f"step {step.step}: {name}={number(value)} over the {level} limit {number(bound or 0)}")
        rows.append((name.removeprefix(HEALTH_PREFIX), shown, *cells))
    lines = [table(("METRIC", "WARN/STOP", *(f"step {s.step}" for s in steps)), rows)]
    lines.append("(! over the warning limit, !! over the stop limit)")
    lines += flagged
    return "\n".join(lines)
