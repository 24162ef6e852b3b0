"""Starlette app of the stand-in engine: vLLM's OpenAI routes plus a few test knobs under /standin.

Besides vLLM's chat and completions routes it serves vLLM's /tokenize and /detokenize, and with --scale-out the
split chat path (render, generate, derender) that the proxy's token continuation uses (scale_out.py).

Knobs: POST /standin/config {"delay_ms", "chunk_delay_ms", "fail_next", "fail_status"} changes behaviour at run
time; GET /standin/requests lists the bodies received (newest last) with stream outcomes; DELETE clears them.
A request may carry `"standin": {"status": 400, "message": "...", "delay_ms": N, "chunk_delay_ms": N}` to get
that error or timing for itself only (vLLM ignores unknown fields, and the proxy passes them through), or
`"standin": {"ignore_stream": true}` to get a whole JSON answer to a stream request, as a server without
streaming support would give.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .config import StandinConfig
from .engine import EngineError, Generation, full_body, generate_chat, generate_completion, stream_chunks
from .scale_out import ScaleOut
from .tokenizer import ToyTokenizer

log = logging.getLogger(__name__)
_KEPT_REQUESTS = 2000


@dataclass
class Knobs:
    delay_ms: float
    chunk_delay_ms: float
    fail_next: int
    fail_status: int


@dataclass
class Stats:
    requests: int = 0
    failed: int = 0
    streams_completed: int = 0
    streams_aborted: int = 0


class Standin:
    def __init__(self, config: StandinConfig) -> None:
        self.model = config.model
        self.mistake_rate = config.mistake_rate
        self.max_model_len = config.max_model_len
        self.tokenizer = ToyTokenizer()
        self.knobs = Knobs(config.delay_ms, config.chunk_delay_ms, config.fail_first, config.fail_status)
        self.stats = Stats()
        self.received: deque[dict[str, Any]] = deque(maxlen=_KEPT_REQUESTS)
        self.weight_version = config.weight_version
        # Adapter name -> the path it was loaded from (vLLM's LoRA modules; a call naming one is answered as it).
        self.adapters = dict(m.split("=", 1) for m in config.lora_modules.split(",") if m)
        self.scale_out = ScaleOut(config.model, self.tokenizer, config.max_model_len)

    async def _body(self, request: Request) -> dict[str, Any]:
        """The request's JSON object, kept with the requests received; EngineError (400) for anything else."""
        try:
            body = json.loads(await request.body())
        except ValueError as err:
            raise EngineError(400, f"Invalid JSON body: {err}") from err
        if not isinstance(body, dict):
            raise EngineError(400, "The request body must be a JSON object.")
        self.received.append({"path": request.url.path, "body": body})
        return body

    async def tokens(self, request: Request, answer: Callable[[dict[str, Any]], dict[str, Any]]) -> Response:
        """One of the token-level endpoints (scale_out.py), its body kept with the generation requests."""
        try:
            body = await self._body(request)
            return JSONResponse(answer(body))
        except EngineError as err:
            return self._error(err)

    async def generate(self, request: Request, api: str) -> Response:
        self.stats.requests += 1
        try:
            body = await self._body(request)
        except EngineError as err:
            return self._error(err)
        knobs = body.get("standin") if isinstance(body.get("standin"), dict) else {}
        if knobs.get("status"):
            return self._error(EngineError(int(knobs["status"]), knobs.get("message", "Requested failure.")))
        if self.knobs.fail_next > 0:
            self.knobs.fail_next -= 1
            return self._error(EngineError(self.knobs.fail_status, "Engine temporarily failing.", "ServiceUnavailable"))
        served = body.get("model") if body.get("model") in self.adapters else self.model
        try:
            if api == "chat":
                gen = generate_chat(body, served, self.tokenizer, self.mistake_rate, self.max_model_len)
            else:
                gen = generate_completion(body, served, self.tokenizer, self.mistake_rate, self.max_model_len)
        except EngineError as err:
            return self._error(err)
        delay = float(knobs.get("delay_ms", self.knobs.delay_ms))
        if body.get("stream") and not knobs.get("ignore_stream"):
            chunk_delay = float(knobs.get("chunk_delay_ms", self.knobs.chunk_delay_ms))
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                self._stream(gen, include_usage, delay, chunk_delay), media_type="text/event-stream"
            )
        if delay > 0:
            await asyncio.sleep(delay / 1000)
        return JSONResponse(full_body(gen, self.tokenizer))

    async def _stream(
        self, gen: Generation, include_usage: bool, delay: float, chunk_delay: float
    ) -> AsyncIterator[bytes]:
        completed = False
        try:
            if delay > 0:
                await asyncio.sleep(delay / 1000)
            for k, chunk in enumerate(stream_chunks(gen, self.tokenizer, include_usage)):
                if k and chunk_delay > 0:
                    await asyncio.sleep(chunk_delay / 1000)
                yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            completed = True
        finally:
            if completed:
                self.stats.streams_completed += 1
            else:
                self.stats.streams_aborted += 1

    def _error(self, err: EngineError) -> Response:
        self.stats.failed += 1
        return JSONResponse(err.body(), status_code=err.status)


def create_app(config: StandinConfig) -> Starlette:
    standin = Standin(config)

    async def chat(request: Request) -> Response:
        return await standin.generate(request, "chat")

    async def completions(request: Request) -> Response:
        return await standin.generate(request, "completions")

    async def models(request: Request) -> Response:
        card = {"id": standin.model, "object": "model", "created": int(time.time()), "owned_by": "vllm"}
        card.update(root=standin.model, parent=None, max_model_len=standin.max_model_len)
        adapters = [
            {**card, "id": name, "root": path, "parent": standin.model} for name, path in standin.adapters.items()
        ]
        return JSONResponse({"object": "list", "data": [card, *adapters]})

    async def load_lora_adapter(request: Request) -> Response:
        body = await request.json()
        if not isinstance(body, dict) or not body.get("lora_name") or not body.get("lora_path"):
            return JSONResponse({"error": "expected lora_name and lora_path"}, status_code=400)
        standin.adapters[str(body["lora_name"])] = str(body["lora_path"])
        return Response(f"Success: LoRA adapter '{body['lora_name']}' added successfully.", status_code=200)

    def token_route(path: str, answer: Callable[[dict[str, Any]], dict[str, Any]]) -> Route:
        async def endpoint(request: Request) -> Response:
            return await standin.tokens(request, answer)

        return Route(path, endpoint, methods=["POST"])

    # vLLM's split chat path: on only with --scale-out (vLLM: with --enable-scale-out; without, it answers 404).
    scale_out = [
        token_route("/v1/chat/completions/render", standin.scale_out.render),
        token_route("/inference/v1/generate", standin.scale_out.generate),
        token_route("/v1/chat/completions/derender", standin.scale_out.derender),
    ]

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def config_route(request: Request) -> Response:
        if request.method == "POST":
            for name, value in (await request.json()).items():
                if not hasattr(standin.knobs, name):
                    return JSONResponse({"error": f"unknown knob {name}"}, status_code=400)
                setattr(standin.knobs, name, type(getattr(standin.knobs, name))(value))
        return JSONResponse(asdict(standin.knobs))

    async def requests_route(request: Request) -> Response:
        if request.method == "DELETE":
            standin.received.clear()
            standin.stats = Stats()
        return JSONResponse({**asdict(standin.stats), "received": list(standin.received)})

    async def weight_info(request: Request) -> Response:
        return JSONResponse({"weight_version": standin.weight_version})

    async def update_weight_version(request: Request) -> Response:
        try:
            label = (await request.json())["new_version"]
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": "expected a JSON body with new_version"}, status_code=400)
        standin.weight_version = str(label)
        return Response(status_code=200)

    # The weight label, as vLLM's dev mode serves it: on only when a first label was given.
    labels = [
        Route("/weight_info", weight_info, methods=["GET"]),
        Route("/update_weight_version", update_weight_version, methods=["POST"]),
    ]
    routes = [
        *(labels if config.weight_version else []),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        token_route("/tokenize", standin.scale_out.tokenize),
        token_route("/detokenize", standin.scale_out.detokenize),
        *(scale_out if config.scale_out else []),
        # vLLM's runtime adapter route: on only with --lora-modules (vLLM: with --enable-lora).
        *([Route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"])] if config.lora_modules else []),
        Route("/health", health, methods=["GET"]),
        Route("/standin/config", config_route, methods=["GET", "POST"]),
        Route("/standin/requests", requests_route, methods=["GET", "DELETE"]),
    ]
    app = Starlette(routes=routes)
    app.state.standin = standin
    return app
