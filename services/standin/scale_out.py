"""vLLM's token-level endpoints, as the stand-in answers them: tokenize and detokenize (every vLLM server has them),
and the split chat path of vLLM started with `--enable-scale-out` (the stand-in's `--scale-out`):
`/v1/chat/completions/render` (messages -> prompt tokens, their character offsets and sampling parameters),
`/inference/v1/generate` (tokens in, tokens and log-probs out) and `/v1/chat/completions/derender` (tokens -> the
chat answer, tool calls parsed).

Field names and shapes follow vLLM 0.32 (`entrypoints/serve/tokenize/protocol.py`,
`entrypoints/scale_out/token_in_token_out/protocol.py`). The toy model decides its reply from the messages, which
generate's tokens do not carry: render keeps each request's messages under the request id it answers with (vLLM's
GenerateRequest carries it to generate), and a generate request with an unknown id is answered as a plain
completion of its decoded text.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from typing import Any

from . import model
from .engine import EngineError, _check_common, _int_field, _truncate
from .tokenizer import EOS_ID, ToyTokenizer, token_logprob

_KEPT_RENDERS = 1000


def too_long(max_model_len: int, prompt_tokens: int) -> EngineError:
    """vLLM's refusal of a prompt longer than the context, in its words (vllm/renderers/params.py)."""
    return EngineError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
        f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. Please reduce the "
        "length of the input prompt.",
        param="input_tokens",
    )


def _token_ids(value: Any, name: str, nonempty: bool) -> list[int]:
    if (
        not isinstance(value, list)
        or (nonempty and not value)
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        raise EngineError(400, f"`{name}` must be a list of non-negative token ids.", param=name)
    return value


class ScaleOut:
    def __init__(self, served_model: str, tokenizer: ToyTokenizer, max_model_len: int) -> None:
        self.model = served_model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        # request id -> (messages, tools, tool_choice, knobs) of a rendered request, for its generate call.
        self._rendered: OrderedDict[str, tuple[list[Any], Any, Any, dict[str, Any]]] = OrderedDict()

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /tokenize: a chat request (messages, tools) rendered, or a plain prompt, as token ids."""
        _check_common({"model": body.get("model")} if body.get("model") is not None else {}, self.model)
        if "messages" in body:
            messages = body["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise EngineError(400, "`messages` must be a list of message objects.", param="messages")
            generation = body.get("add_generation_prompt", True)
            tokens = self.tokenizer.encode(model.render_chat(messages, body.get("tools"), bool(generation)))
        elif isinstance(body.get("prompt"), str):
            tokens = self.tokenizer.encode(body["prompt"])
        else:
            raise EngineError(400, "Either `messages` or `prompt` must be given.", param="messages")
        return {"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens, "token_strs": None}

    def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"prompt": self.tokenizer.decode(_token_ids(body.get("tokens"), "tokens", nonempty=False))}

    def render(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/chat/completions/render: the GenerateRequest that generate takes for this chat request."""
        _check_common(body, self.model)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise EngineError(400, "`messages` must be a non-empty list of message objects.", param="messages")
        tokens = self.tokenizer.encode(model.render_chat(messages, body.get("tools")))
        if len(tokens) > self.max_model_len:
            raise too_long(self.max_model_len, len(tokens))
        max_tokens = _int_field(body, "max_completion_tokens", 0)
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens", 0)
        top = _int_field(body, "top_logprobs", 0) or 0
        params: dict[str, Any] = {
            "max_tokens": max_tokens if max_tokens is not None else self.max_model_len - len(tokens),
            "temperature": body.get("temperature", 1.0),
            "logprobs": top if body.get("logprobs") else None,
            "stop": body.get("stop") or [],
        }
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        knobs = body.get("standin") if isinstance(body.get("standin"), dict) else {}
        self._rendered[request_id] = (messages, body.get("tools"), body.get("tool_choice", "auto"), knobs)
        while len(self._rendered) > _KEPT_RENDERS:
            self._rendered.popitem(last=False)
        rendered: dict[str, Any] = {"request_id": request_id, "token_ids": tokens, "sampling_params": params}
        rendered.update(model=self.model, stream=False)
        if body.get("return_token_offsets"):
            rendered["token_offsets"] = self.tokenizer.offsets(tokens)
        return rendered

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /inference/v1/generate: the reply's tokens (a finished answer ends with EOS) and their log-probs."""
        prompt = _token_ids(body.get("token_ids"), "token_ids", nonempty=True)
        params = body.get("sampling_params") if isinstance(body.get("sampling_params"), dict) else {}
        request_id = str(body.get("request_id") or uuid.uuid4().hex)
        context = self._rendered.get(request_id)
        if context is None:
            raw = model.completion_reply(self.tokenizer.decode(prompt))
        else:
            messages, tools, tool_choice, knobs = context
            raw = model.chat_reply(messages, tools, tool_choice, knobs=knobs).raw
        max_tokens = params.get("max_tokens")
        pieces, cut = _truncate(self.tokenizer.split(raw), max_tokens, params.get("stop"))
        tokens = [self.tokenizer.token_id(piece) for piece in pieces]
        if cut is None:
            tokens.append(EOS_ID)
        stop = None
        if cut == "stop":  # a stop string: vLLM names it (a stop token would be its id)
            text = "".join(self.tokenizer.split(raw))
            stops = params.get("stop") or []
            stop = next((s for s in ([stops] if isinstance(stops, str) else stops) if s and s in text), None)
        choice: dict[str, Any] = {"index": 0, "finish_reason": cut or "stop", "stop_reason": stop, "token_ids": tokens}
        if params.get("logprobs") is not None:
            content = [
                {"token_id": token, "logprob": token_logprob(token, k), "rank": 1, "top_logprobs": []}
                for k, token in enumerate(tokens)
            ]
            choice["logprobs"] = {"content": content}
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(tokens)}
        usage["total_tokens"] = len(prompt) + len(tokens)
        return {"request_id": request_id, "model": self.model, "created": int(time.time()), "output_mode": "tokens",
                "choices": [choice], "prompt_token_ids": prompt, "usage": usage}  # fmt: skip

    def derender(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/chat/completions/derender: a generate answer as the chat completion the chat endpoint gives."""
        generated = body.get("generate_response")
        if not isinstance(generated, dict) or not isinstance(generated.get("choices"), list):
            raise EngineError(400, "`generate_response` must be a generate answer.", param="generate_response")
        request = body.get("chat_request") if isinstance(body.get("chat_request"), dict) else {}
        choices, completion = [], 0
        for choice in generated["choices"]:
            tokens = _token_ids(choice.get("token_ids"), "token_ids", nonempty=False)
            completion += len(tokens)
            text = self.tokenizer.decode(tokens)
            content, calls = model.parse_tool_calls(text) if request.get("tools") else (text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning": None}
            message["tool_calls"] = [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
            entries = (choice.get("logprobs") or {}).get("content")
            logprobs = None
            if isinstance(entries, list):
                logprobs = {"content": [self._logprob(entry) for entry in entries]}
            choices.append({
                "index": choice.get("index", 0),
                "message": message,
                "logprobs": logprobs,
                "finish_reason": "tool_calls" if calls else choice.get("finish_reason"),
                "stop_reason": choice.get("stop_reason"),
            })  # fmt: skip
        prompt = int(body.get("prompt_tokens") or 0)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return {"id": f"chatcmpl-{generated.get('request_id', '')}", "object": "chat.completion",
                "created": int(time.time()), "model": self.model, "choices": choices, "usage": usage}  # fmt: skip

    def _logprob(self, entry: dict[str, Any]) -> dict[str, Any]:
        token = int(entry.get("token_id", 0))
        piece = "" if token == EOS_ID else self.tokenizer.decode_piece(token)
        return {"token": piece, "logprob": entry.get("logprob"), "bytes": list(piece.encode()), "top_logprobs": []}
