"""Token continuation's pure core on hand-made token sequences (a toy vocabulary whose pieces are strings, so a
rendering's text and character offsets are computed here exactly as the engine's renderer reports them), and the
stream an agent gets when it asked to stream a call answered from a spliced prompt."""

from __future__ import annotations

import json
from array import array

from services.proxy.call.capture import StreamAssembler, capture_response
from services.proxy.call.continuation import stream_chunks
from services.proxy.call.rewrite import CHAT
from services.proxy.call.token_history import (
    Splice,
    TokenHistory,
    Turn,
    align,
    boundary,
    common_prefix,
    json_equal,
    splice,
)
from services.proxy.dialects import anthropic_messages, openai_responses

# Token id -> text. 1..3 are special tokens; 12 is the canonical token for "12", which the model may also sample as
# "1" "2"; 9 is a stop token ("</call>") that an answer's text leaves out.
VOCAB = {1: "<s>", 2: "<end>", 9: "</call>", 10: "1", 11: "2", 12: "12", 20: "u:", 21: "a:", 22: "hi", 23: "ok"}
KEY = ("rollout-1", "0")


def text(tokens: list[int]) -> str:
    return "".join(VOCAB[t] for t in tokens)


def offsets(tokens: list[int]) -> list[tuple[int, int]]:
    spans, at = [], 0
    for token in tokens:
        spans.append((at, at + len(VOCAB[token])))
        at += len(VOCAB[token])
    return spans


def continued(turn: Turn, rendered: list[int]) -> Splice | None:
    shared = common_prefix(turn.tokens, array("i", rendered))
    return splice(turn, rendered, text(rendered), offsets(rendered), text(turn.visible()), shared)


def test_common_prefix_of_arrays_and_lists() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5], [1]) == 0
    assert common_prefix(array("i", range(1000)), array("i", [*range(777), -1])) == 777


def test_a_sampled_split_is_kept_and_the_new_context_follows() -> None:
    prompt = [1, 20, 22, 2, 21]
    turn = Turn(array("i", [*prompt, 10, 11, 2]))  # the model wrote "1" "2" then <end> (EOS: its text is kept)
    rendered = [*prompt, 12, 2, 20, 23, 2, 21]  # the re-rendered history writes "12"
    result = continued(turn, rendered)
    assert result == Splice([*prompt, 10, 11, 2, 20, 23, 2, 21], ())
    assert text(result.text_ids()) == text(rendered)


def test_a_stop_token_left_out_of_the_text_stays_and_is_hidden() -> None:
    prompt = [1, 20, 22, 2, 21]
    turn = Turn(array("i", [*prompt, 23, 9]), hidden=(len(prompt) + 1,))  # "ok" then the stop token </call>
    rendered = [*prompt, 23, 2, 20, 22, 2, 21]  # the template closes the turn with <end>, no </call>
    result = continued(turn, rendered)
    assert result is not None
    assert result.prompt_ids == [*prompt, 23, 9, 2, 20, 22, 2, 21]
    assert result.hidden == (len(prompt) + 1,)
    assert result.text_ids() == rendered


def test_a_stop_token_the_template_writes_back_is_not_doubled() -> None:
    prompt = [1, 20, 22, 2, 21]
    turn = Turn(array("i", [*prompt, 10, 11, 9]), hidden=(len(prompt) + 2,))
    rendered = [*prompt, 12, 9, 2, 20, 23, 2, 21]  # a parsed call: the template writes </call> itself
    result = continued(turn, rendered)
    assert result == Splice([*prompt, 10, 11, 9, 2, 20, 23, 2, 21], ())


def test_a_history_whose_text_changed_is_not_spliced() -> None:
    prompt = [1, 20, 22, 2, 21]
    turn = Turn(array("i", [*prompt, 10, 11, 2]))
    assert continued(turn, [*prompt, 23, 2, 20, 22, 2, 21]) is None  # the agent rewrote its answer
    assert continued(turn, [1, 20, 23, 2, 21, 12, 2]) is None  # an earlier turn changed
    assert continued(turn, [*prompt, 10]) is None  # the history stops inside the answer


def test_a_chained_splice_keeps_earlier_hidden_tokens_hidden() -> None:
    history = TokenHistory(max_rollouts=8)
    prompt = [1, 20, 22, 2, 21]
    first = Turn(array("i", [*prompt, 23, 9]), hidden=(6,))
    rendered = [*prompt, 23, 2, 20, 22, 2, 21]
    second = continued(first, rendered)
    assert second is not None and second.hidden == (6,)
    history.remember(KEY, second.prompt_ids, [10, 11, 2], stop_token=None, prompt_hidden=second.hidden)
    later = [*rendered, 12, 2, 20, 23, 2, 21]  # the whole history re-rendered: no </call>, "12" canonical
    found = history.closest(KEY, later)
    assert found is not None
    turn, shared = found
    assert turn.hidden == (6,) and shared == 6  # the renderings part where the kept stop token is
    third = splice(turn, later, text(later), offsets(later), text(turn.visible()), shared)
    assert third is not None
    assert third.prompt_ids == [*second.prompt_ids, 10, 11, 2, 20, 23, 2, 21]
    assert third.text_ids() == [*rendered, 10, 11, 2, 20, 23, 2, 21]
    assert text(third.text_ids()) == text(later)


def test_boundary_needs_a_token_ending_exactly_there() -> None:
    spans = offsets([1, 12, 2])  # "<s>" "12" "<end>"
    assert boundary(spans, 0, 3) == 1
    assert boundary(spans, 0, 5) == 2
    assert boundary(spans, 0, 4) is None  # inside "12"
    assert boundary(spans, 2, 5) is None  # scanning starts past it


def test_history_keeps_the_last_turns_of_the_most_recent_rollouts() -> None:
    history = TokenHistory(max_rollouts=2)
    history.remember(("a", "0"), [1, 2], [3], stop_token=None)
    history.remember(("a", "0"), [1, 2, 3, 4], [5], stop_token=5)  # continues the first: replaces it
    (turn,) = history._turns[("a", "0")]
    assert list(turn.tokens) == [1, 2, 3, 4, 5] and turn.hidden == (4,) and turn.stop_token == 5
    history.remember(("a", "0"), [1, 7], [8], stop_token=3)  # another conversation; 3 is not what stopped it
    assert [t.hidden for t in history._turns[("a", "0")]] == [(4,), ()]
    assert history.closest(("a", "0"), [1, 7, 8, 9])[1] == 3  # the turn sharing the most tokens
    history.remember(("b", "0"), [1], [2], stop_token=None)
    history.closest(("a", "0"), [1])  # a is used again: b is now the least recently used
    history.remember(("c", "0"), [1], [2], stop_token=None)
    assert history.has(("a", "0")) and history.has(("c", "0")) and not history.has(("b", "0"))
    assert len(history) == 2
    history.remember(("d", "0"), [], [2], stop_token=None)  # nothing to continue
    history.remember(("d", "0"), [1, 2**40], [2], stop_token=None)  # not token ids
    assert not history.has(("d", "0"))
    assert history.closest(("a", "0"), [2**40]) is None
    for n in range(10):
        history.remember(("a", "0"), [1, 100 + n], [2], stop_token=None)
    assert len(history._turns[("a", "0")]) == 4


SAMPLED_CALL = '<|assistant|>\n<tool_call>\n{"name": "calc", "arguments": {"script": "2 + 3", "n": 2.0}}\n</tool_call>'
AFTER = "\n<|tool|>\n5\n<|assistant|>\n"


def test_a_tool_call_re_serialised_by_the_client_is_the_same_text() -> None:
    """Compact, reordered, escaped or integral-float spellings of the sampled call align with it; the rest of the
    rendered text follows it."""
    for respelled in (
        '{"name":"calc","arguments":{"script":"2 + 3","n":2.0}}',
        '{"arguments": {"n": 2, "script": "2 + 3"}, "name": "calc"}',
        '{"name": "calc", "arguments": {"script": "2 \\u002b 3", "n": 2.0}}',
    ):
        rendered = f"<|assistant|>\n<tool_call>\n{respelled}\n</tool_call>{AFTER}"
        end = align(SAMPLED_CALL, rendered)
        assert end is not None, respelled
        assert rendered[end:] == AFTER


def test_an_edited_tool_call_or_a_changed_string_does_not_align() -> None:
    edited = SAMPLED_CALL.replace("2 + 3", "2 + 4") + AFTER
    assert align(SAMPLED_CALL, edited) is None
    typed = SAMPLED_CALL.replace("2.0", "true") + AFTER  # True == 1 in Python, not in JSON
    assert align(SAMPLED_CALL, typed) is None
    # A bracket inside a string parses on its own; the string around it still changed.
    sampled = 'a: {"name": "run", "arguments": {"code": "print([1,2])"}}'
    assert align(sampled, 'a: {"name": "run", "arguments": {"code": "print([1, 2])"}} more') is None
    assert align("a: plain text", "a: other text") is None


def test_a_long_call_after_a_long_prompt_full_of_braces_aligns() -> None:
    """Braces in prose, in tool schemas and in code inside the arguments are tried and passed over."""
    schemas = json.dumps(
        [{"name": f"t{i}", "parameters": {"properties": {"p": {"enum": ["a", "b"]}}}} for i in range(50)]
    )
    prompt = f"<|system|>\n{schemas}\n<|user|>\n{'see { this } and [1] ' * 200}\n<|assistant|>\n"
    call = {"name": "Write", "arguments": {"path": "a.py", "content": "def f(x):\n    return {'a': [x]}\n" * 100}}
    sampled = f"{prompt}<tool_call>\n{json.dumps(call, separators=(',', ':'))}\n</tool_call>"
    rendered = f"{prompt}<tool_call>\n{json.dumps(call)}\n</tool_call>{AFTER}"
    end = align(sampled, rendered)
    assert end is not None and rendered[end:] == AFTER
    call["arguments"]["content"] += "#"
    assert align(sampled, f"{prompt}<tool_call>\n{json.dumps(call)}\n</tool_call>{AFTER}") is None


def test_json_values_are_equal_by_value_not_by_python_equality() -> None:
    assert json_equal({"a": [1, 2.5], "b": None}, {"b": None, "a": [1.0, 2.5]})
    assert not json_equal(True, 1) and not json_equal([0], [False])
    assert not json_equal({"a": 1}, {"a": 1, "b": 2}) and not json_equal("1", 1)


def test_a_re_serialised_call_is_spliced_with_the_sampled_spelling() -> None:
    """The splice keeps the sampled tokens of the call; what they must decode to is the sampled spelling then the
    rendered rest."""
    vocab = {1: "<s>", 2: "u:", 3: "calc", 30: '{"x": 1}', 31: '{"x":1}', 32: "end"}

    def spans(tokens: list[int]) -> list[tuple[int, int]]:
        out, at = [], 0
        for token in tokens:
            out.append((at, at + len(vocab[token])))
            at += len(vocab[token])
        return out

    turn = Turn(array("i", [1, 2, 3, 30]))
    rendered = [1, 2, 3, 31, 32]
    rendered_text = "".join(vocab[t] for t in rendered)
    result = splice(turn, rendered, rendered_text, spans(rendered), '<s>u:calc{"x": 1}', 3)
    assert result == Splice([1, 2, 3, 30, 32], ())
    assert result.text == '<s>u:calc{"x": 1}end' == "".join(vocab[t] for t in result.text_ids())
    edited = [1, 2, 3, 30]
    vocab[33] = '{"x": 2}'
    changed = [1, 2, 3, 33, 32]
    assert splice(Turn(array("i", edited)), changed, "".join(vocab[t] for t in changed), spans(changed),
                  '<s>u:calc{"x": 1}', 3) is None  # fmt: skip


# A chat answer as derender gives it for a spliced prompt: text and a tool call, token ids and log-probs.
SPLICED_ANSWER = {
    "id": "generate-tokens-chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "agl-policy",
    "prompt_token_ids": [1, 2, 3],
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Let me compute.",
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": '{"expression": "2 * 3"}'},
                    }
                ],
            },
            "logprobs": {"content": [{"token": "x", "logprob": -0.5}, {"token": "y", "logprob": -0.25}]},
            "finish_reason": "tool_calls",
            "stop_reason": 9,
            "token_ids": [7, 9],
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


def _events(body: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]


def test_a_spliced_answer_streams_as_the_same_answer() -> None:
    """An agent that asked to stream a call answered from a spliced prompt gets the chunks of the same answer:
    assembled again they are the answer, with its token ids and log-probs."""
    chunks = stream_chunks(SPLICED_ANSWER, include_usage=True)
    assembler = StreamAssembler(CHAT)
    for chunk in chunks:
        assembler.feed(chunk)
    assert assembler.capture() == capture_response(SPLICED_ANSWER, CHAT)
    rebuilt = assembler.response()
    assert rebuilt["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Let me compute.",
        "tool_calls": SPLICED_ANSWER["choices"][0]["message"]["tool_calls"],
    }
    assert rebuilt["usage"] == SPLICED_ANSWER["usage"]
    assert stream_chunks(SPLICED_ANSWER, include_usage=False)[-1]["choices"]  # no usage chunk unless asked


def test_a_spliced_answer_streams_in_the_anthropic_and_responses_apis() -> None:
    chunks = stream_chunks(SPLICED_ANSWER, include_usage=True)
    messages_request = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "2*3?"}],
                        "stream": True}  # fmt: skip
    translator = anthropic_messages.DIALECT.stream(messages_request)
    body = b"".join(translator.feed(chunk) for chunk in chunks) + translator.finish(SPLICED_ANSWER)
    events = _events(body)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == "Let me compute."
    tools = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert any(block["type"] == "tool_use" and block["name"] == "calculator" for block in tools), tools
    responses_request = {"model": "m", "input": "2*3?", "stream": True}
    translator = openai_responses.DIALECT.stream(responses_request)
    body = b"".join(translator.feed(chunk) for chunk in chunks) + translator.finish(SPLICED_ANSWER)
    events = _events(body)
    done = [e for e in events if e["type"] == "response.completed"]
    assert done, [e["type"] for e in events]
    output = done[0]["response"]["output"]
    assert any(item["type"] == "function_call" and item["name"] == "calculator" for item in output), output
