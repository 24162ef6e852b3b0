"""Token continuation over the engine's HTTP API: a train call that continues a rollout's earlier turn is sent as
the tokens the model sampled + the newly rendered context, whenever its history renders to the same text.

vLLM (0.32, started with `--enable-scale-out`; agl-engine does) splits a chat completion into three endpoints:
`/v1/chat/completions/render` (messages -> prompt tokens and sampling parameters), `/inference/v1/generate`
(tokens in, tokens and log-probs out) and `/v1/chat/completions/derender` (tokens -> the chat answer, tool calls
parsed). For a call whose history the proxy has seen (continuation.TokenHistory):

1. render the request; if its tokens start with the remembered turn's, it is a pure append: the call goes on as
   usual (one extra, cheap engine request);
2. otherwise compare text: when the rendered text starts with the turn's text at a token boundary (a tool call the
   agent re-serialised counts as the same text when its JSON parses equal: continuation.align), and the spliced
   tokens decode to exactly the rendered text (with the sampled spelling of such a call), generate from the spliced
   tokens and derender the answer;
3. anything else (the history changed, the engine lacks the endpoints, an engine error) goes on as usual and the
   trainer makes the rollout a separate segment: exact, never retokenized.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from prometheus_client import Counter

from services.proxy.call.capture import Capture
from services.proxy.call.token_history import (
    APPENDED,
    DIVERGED,
    FAILED,
    OUTCOMES,
    SPLICED,
    UNSUPPORTED,
    TokenHistory,
    splice,
)
from services.proxy.engines.routing import Endpoint

log = logging.getLogger(__name__)

# Engines without the endpoints answer 404 (older vLLM) or 403 (vLLM without --enable-scale-out).
_UNSUPPORTED_STATUS = frozenset({403, 404, 405, 501})
RECHECK_UNSUPPORTED_S = 300.0  # an engine without the endpoints is asked again after this (it may be restarted)


class _EngineRefused(Exception):
    """An engine request of the splice did not answer 200."""


@dataclass
class _Prepared:
    generate_request: dict[str, Any]
    prompt_ids: list[int]
    hidden: tuple[int, ...]


@dataclass
class Continued:
    """The answer to a spliced prompt, shaped as a non-streamed chat completion with `prompt_token_ids` and
    `token_ids`; `hidden` are the prompt's hidden positions (continuation.Splice), remembered with it."""

    response: dict[str, Any]
    hidden: tuple[int, ...]


def _server_root(endpoint: Endpoint) -> str:
    url = endpoint.url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class TokenContinuation:
    def __init__(self, client: httpx.AsyncClient, history: TokenHistory, outcomes: Counter) -> None:
        self._client = client
        self.history = history
        self._outcomes = {outcome: outcomes.labels(outcome) for outcome in OUTCOMES}
        self._unsupported_until: dict[str, float] = {}

    def remember(self, key: tuple[str, str], capture: Capture, prompt_hidden: tuple[int, ...] = ()) -> None:
        self.history.remember(
            key, capture.prompt_token_ids, capture.response_token_ids, capture.stop_reason, prompt_hidden
        )

    async def answer(self, key: tuple[str, str], endpoint: Endpoint, body: dict[str, Any]) -> Continued | None:
        """The engine's answer for a spliced prompt, or None when the call should go to the engine as usual."""
        if not self.history.has(key) or self._unsupported_until.get(endpoint.url, 0.0) > time.monotonic():
            return None
        try:
            prepared = await self._prepare(key, endpoint, body)
            if prepared is None:
                return None
            response = await self._generate(endpoint, body, prepared)
        except _EngineRefused as refused:
            self._count(FAILED)
            log.warning("rollout %s: token continuation at %s fell back: %s", key[0], endpoint.url, refused)
            return None
        except httpx.HTTPError as err:
            self._count(FAILED)
            log.warning("rollout %s: token continuation at %s fell back: %s: %s", key[0], endpoint.url,
                        type(err).__name__, err)  # fmt: skip
            return None
        self._count(SPLICED)
        return Continued(response, prepared.hidden)

    def _count(self, outcome: str) -> None:
        self._outcomes[outcome].inc()

    async def _post(self, url: str, payload: dict[str, Any]) -> httpx.Response:
        return await self._client.post(url, content=orjson.dumps(payload))

    async def _json(self, url: str, payload: dict[str, Any]) -> dict[str, Any]:
        reply = await self._post(url, payload)
        if reply.status_code != 200:
            raise _EngineRefused(f"{url} answered {reply.status_code}: {reply.text[:300]}")
        return reply.json()

    async def _text(self, endpoint: Endpoint, tokens: list[int], model: str) -> str:
        answer = await self._json(f"{_server_root(endpoint)}/detokenize", {"model": model, "tokens": tokens})
        return str(answer.get("prompt", ""))

    async def _prepare(self, key: tuple[str, str], endpoint: Endpoint, body: dict[str, Any]) -> _Prepared | None:
        request = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        request["return_token_offsets"] = True
        reply = await self._post(f"{endpoint.url.rstrip('/')}/chat/completions/render", request)
        if reply.status_code in _UNSUPPORTED_STATUS:
            self._unsupported_until[endpoint.url] = time.monotonic() + RECHECK_UNSUPPORTED_S
            self._count(UNSUPPORTED)
            log.info("engine %s has no render/generate endpoints (HTTP %d): calls are not continued in tokens "
                     "(vLLM >= 0.32 with --enable-scale-out has them)", endpoint.url, reply.status_code)  # fmt: skip
            return None
        if reply.status_code != 200:  # the request itself is refused: the usual path gives the agent the error
            return None
        generate = reply.json()
        rendered: list[int] = generate.get("token_ids") or []
        found = self.history.closest(key, rendered)
        if found is None:
            return None
        turn, shared = found
        if shared == len(turn.tokens):
            self._count(APPENDED)
            return None
        offsets = generate.pop("token_offsets", None) or []
        model = str(body.get("model", ""))
        own = turn.visible()
        rendered_text = await self._text(endpoint, rendered, model)
        spliced = splice(turn, rendered, rendered_text, offsets, await self._text(endpoint, own, model), shared)
        if spliced is None or await self._text(endpoint, spliced.text_ids(), model) != spliced.text:
            self._count(DIVERGED)
            return None
        generate["token_ids"] = spliced.prompt_ids
        generate["stream"] = False
        generate.pop("stream_options", None)
        params = generate.get("sampling_params") or {}
        grown = len(spliced.prompt_ids) - len(rendered)
        # A max_tokens the engine derived from the room left in the context shrinks by the tokens the splice added.
        if grown > 0 and params.get("max_tokens") and not (body.get("max_tokens") or body.get("max_completion_tokens")):
            params["max_tokens"] = max(1, int(params["max_tokens"]) - grown)
        return _Prepared(generate, spliced.prompt_ids, spliced.hidden)

    async def _generate(self, endpoint: Endpoint, body: dict[str, Any], prepared: _Prepared) -> dict[str, Any]:
        generated = await self._json(f"{_server_root(endpoint)}/inference/v1/generate", prepared.generate_request)
        chat_request = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        to_decode, only_stop = _without_stop_tokens(generated)
        derender = {
            "generate_response": to_decode,
            "chat_request": chat_request,
            "prompt_token_ids": prepared.prompt_ids,
            "prompt_tokens": len(prepared.prompt_ids),
        }
        response = await self._json(f"{endpoint.url.rstrip('/')}/chat/completions/derender", derender)
        response["prompt_token_ids"] = prepared.prompt_ids
        token_ids = {c.get("index", 0): c.get("token_ids") for c in generated.get("choices") or ()}
        for choice in response.get("choices") or ():
            choice["token_ids"] = token_ids.get(choice.get("index", 0)) or []
            if choice.get("index", 0) in only_stop:  # the turn was its stop token alone: an empty answer
                choice["message"] = dict(choice.get("message") or {}, content="", tool_calls=[])
            _cut_at_stop_string(choice, body)
        return response


def _without_stop_tokens(generated: dict[str, Any]) -> tuple[dict[str, Any], set[int]]:
    """The generate answer with each choice's final stop token (EOS, or a stop token id) left out of the tokens to
    decode: the chat endpoint leaves its text out of the answer, derender would not. Its log-prob stays, so the
    answer's log-probs still cover every generated token. Also the choices that were their stop token alone
    (derender refuses no tokens: they are decoded whole and answered empty)."""
    choices, only_stop = [], set()
    for choice in generated.get("choices") or ():
        stop = choice.get("stop_reason")
        tokens = choice.get("token_ids") or []
        ended_on_token = choice.get("finish_reason") == "stop" and (stop is None or type(stop) is int)
        if ended_on_token and tokens and (stop is None or tokens[-1] == stop):
            if len(tokens) == 1:
                only_stop.add(choice.get("index", 0))
            else:
                choice = dict(choice, token_ids=tokens[:-1])
        choices.append(choice)
    return dict(generated, choices=choices), only_stop


def _cut_at_stop_string(choice: dict[str, Any], body: dict[str, Any]) -> None:
    """A turn stopped by a stop string: the text ends before it, as the chat endpoint answers (unless the request
    asked to keep it)."""
    stop = choice.get("stop_reason")
    message = choice.get("message") or {}
    content = message.get("content")
    if isinstance(stop, str) and stop and isinstance(content, str) and not body.get("include_stop_str_in_output"):
        at = content.find(stop)
        if at >= 0:
            message["content"] = content[:at]


def stream_chunks(response: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A finished chat completion as the chunks of a stream (one delta per choice, then usage when asked), for an
    agent that asked to stream a call the proxy answered from a spliced prompt."""
    head = {"id": response.get("id"), "object": "chat.completion.chunk", "created": response.get("created"),
            "model": response.get("model")}  # fmt: skip
    chunks = []
    for position, choice in enumerate(response.get("choices") or ()):
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": message.get("role") or "assistant", "content": message.get("content")}
        if message.get("reasoning"):
            delta["reasoning"] = message["reasoning"]
        if message.get("tool_calls"):
            delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(message["tool_calls"])]
        item = {
            "index": choice.get("index", 0),
            "delta": delta,
            "logprobs": choice.get("logprobs"),
            "finish_reason": choice.get("finish_reason"),
            "stop_reason": choice.get("stop_reason"),
            "token_ids": choice.get("token_ids"),
        }
        chunk = {**head, "choices": [item]}
        if position == 0:
            chunk["prompt_token_ids"] = response.get("prompt_token_ids")
        chunks.append(chunk)
    if include_usage and response.get("usage"):
        chunks.append({**head, "choices": [], "usage": response["usage"]})
    return chunks
