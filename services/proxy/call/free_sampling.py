"""Train calls sample from the policy itself: constraints on the output are left out of the engine's request.

Guarantee: in train mode the engine is never asked to constrain what it samples (a required or named tool call,
`strict` tool arguments, a JSON answer, a grammar, a regex, a token mask), so the log-probs it returns are those of
the model the trainer recomputes (the PPO ratio's old policy), and a forced token never enters a row with
log-prob 0. The other exact choice, to constrain and train on the constrained distribution, would need the trainer
to apply the same grammar mask token by token when it recomputes log-probs; no trainer does, so every constrained
call would train off-policy without a sign (a health stop on the log-prob gap, or worse, none).

Sampling free, the answer may miss the asked shape: it is returned to the agent as it is, in its API's shape (a
text answer where a tool call was required, arguments that do not fit the schema, text that is not JSON), and the
call's tool-call counts (tool_calls.py: unparsed calls, invalid arguments) say how often. Agents that ask for a
constraint already handle a model that fails it (the Agents SDK and pydantic-ai retry or raise a parse error).
Each constraint left out is named in the call's warnings. Validation calls keep every constraint (nothing is
trained on them). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

# vLLM's request fields that constrain sampling: its structured-output fields (old and new spellings) and its
# token masks. `min_tokens` is one: the engine masks the end-of-sequence and stop tokens until it is reached.
_CONSTRAINT_FIELDS = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structural_tag",
    "allowed_token_ids",
    "bad_words",
    "logits_processors",
    "min_tokens",
)
# Options of the fields above, meaningless without them.
_CONSTRAINT_OPTIONS = ("guided_decoding_backend", "guided_whitespace_pattern")

_WHY = "train calls sample from the whole policy (docs/reference/agent-apis.md, on-policy training)"


def _tool_name(tool: dict[str, Any]) -> str:
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else "?"


def _forces_a_call(choice: Any) -> bool:
    """A required or named tool_choice (chat's "required", {"type": "function", ...}); "auto" and "none" leave the
    model free (with "none" vLLM leaves tool calls unparsed; nothing is masked)."""
    return choice == "required" or isinstance(choice, dict)


def free_sampling(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the engine's request with every output constraint left out, one warning per kind left out). `body` is a
    chat completions or completions request; it is left as it is (a new dict when anything changed)."""
    out = body
    warnings: list[str] = []

    def copy() -> dict[str, Any]:
        nonlocal out
        if out is body:
            out = dict(body)
        return out

    tools = body.get("tools")
    if isinstance(tools, list):
        strict = [
            k
            for k, tool in enumerate(tools)
            if isinstance(tool, dict) and isinstance(tool.get("function"), dict) and "strict" in tool["function"]
        ]
        if strict:
            new_tools = list(tools)
            for k in strict:
                function = dict(tools[k]["function"])
                del function["strict"]
                new_tools[k] = {**tools[k], "function": function}
            copy()["tools"] = new_tools
            names = ", ".join(_tool_name(tools[k]) for k in strict if tools[k]["function"]["strict"])
            if names:
                warnings.append(
                    f"`strict` on tools {names} was not sent to the engine: {_WHY}; the arguments are checked after "
                    "(the call's tool-call counts)."
                )
    choice = body.get("tool_choice")
    if _forces_a_call(choice):
        copy()["tool_choice"] = "auto"
        what = "required" if choice == "required" else f"the named tool {_named(choice)}"
        warnings.append(
            f"`tool_choice` ({what}) was sent to the engine as auto: {_WHY}; an answer without the call is returned "
            "as it is."
        )
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        del copy()["response_format"]
        warnings.append(
            f"`response_format` ({response_format.get('type')}) was not sent to the engine: {_WHY}; the answer is "
            "returned as the model wrote it."
        )
    present = [name for name in _CONSTRAINT_FIELDS if body.get(name) is not None]
    for name in (*present, *_CONSTRAINT_OPTIONS):
        if name in body:
            del copy()[name]
    if present:
        fields = ", ".join(f"`{name}`" for name in present)
        verb = "were" if len(present) > 1 else "was"
        warnings.append(f"{fields} {verb} not sent to the engine: {_WHY}.")
    return out, warnings


def _named(choice: Any) -> str:
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else choice.get("name")
    return repr(name) if isinstance(name, str) else "(unnamed)"
