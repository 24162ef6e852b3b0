"""Async client for one vLLM engine's admin routes (vLLM started with VLLM_SERVER_DEV_MODE=1, as
`python -m services.engine` does): health, in-place weight reload, prefix-cache reset, weight version,
pause/resume.

Guarantee: a call either did what it says or raises EngineError naming the engine, the route, the HTTP status
and the engine's own message; nothing the engine refuses passes silently. Imports no vLLM (main venv).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Literal

import httpx

log = logging.getLogger(__name__)

PauseMode = Literal["abort", "wait", "keep"]
# vLLM's own reload; AGL's worker extension adds a checked one that rolls back a failed reload (vllm_ext.py).
AGL_RELOAD = "agl_reload_weights"
VLLM_RELOAD = "reload_weights"
# The weight label of a LoRA adapter (ModelEndpoint.weight_label): the directory it was loaded from. vLLM's
# /weight_info label is one per engine, while an engine serves several adapters, each with its own version; its
# /v1/models lists each loaded adapter with that directory as `root`, so the label can be read per adapter.
ADAPTER_LABEL = "adapter:"


class EngineError(Exception):
    """An engine call failed: `status` is the HTTP status, or None when the engine could not be reached."""

    def __init__(self, url: str, route: str, status: int | None, message: str) -> None:
        self.url = url
        self.route = route
        self.status = status
        self.message = message
        answer = f"HTTP {status}" if status is not None else "no answer"
        super().__init__(f"engine {url}: {route} -> {answer}: {message}")


@dataclass(frozen=True)
class Reload:
    weights_dir: str
    seconds: float  # round trip, as the caller waited
    method: str  # the worker method that did it (AGL_RELOAD, or VLLM_RELOAD on an engine without the extension)


def engine_root(url: str) -> str:
    """The server root of an engine given as its root or as its OpenAI base URL (`.../v1`, as registered)."""
    root = url.rstrip("/")
    return root.removesuffix("/v1")


def adapter_label(path: str | os.PathLike[str]) -> str:
    return ADAPTER_LABEL + os.fspath(path)


def served_adapter_label(models: Any, name: str) -> str:
    """The label of the adapter `name` as an engine's GET /v1/models answer lists it (`adapter:none` if absent)."""
    for card in models.get("data") or [] if isinstance(models, dict) else []:
        if isinstance(card, dict) and card.get("id") == name and card.get("parent"):  # an adapter, not a base
            return adapter_label(str(card.get("root") or ""))
    return ADAPTER_LABEL + "none"


def _same_model(a: str, b: str) -> bool:
    """Whether two names of a base model (paths or hub ids) name the same one: the same path once resolved, or the
    same last component (a hub id `org/name` and its download `.../name`; the trainer's and the engine's hosts may
    mount one model under different folders)."""

    def resolved(name: str) -> str:
        return os.path.realpath(name) if os.path.exists(name) else name.rstrip("/")

    a, b = resolved(a), resolved(b)
    return a == b or os.path.basename(a) == os.path.basename(b)


def adapter_base_mismatch(adapter_config: Any, models: Any) -> str | None:
    """Why an adapter cannot go on an engine (None: it can, or nothing tells): its PEFT config names a base model
    that none of the engine's base models (the /v1/models cards without a parent) is. vLLM checks an adapter's rank
    and modules, not its base: an adapter of another base model with the same shapes would load and serve garbage."""
    base = adapter_config.get("base_model_name_or_path") if isinstance(adapter_config, dict) else None
    cards = models.get("data") or [] if isinstance(models, dict) else []
    roots = [str(c.get("root") or c.get("id")) for c in cards if isinstance(c, dict) and not c.get("parent")]
    if not base or not roots or any(_same_model(str(base), root) for root in roots):
        return None
    return f"the adapter was trained on base model {base}, the engine serves {', '.join(roots)}"


def _message(response: httpx.Response) -> str:
    """The engine's own words: OpenAI-shaped `error.message`, vLLM's `{"error": str}`, FastAPI's `detail`, or text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:2000] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if error:
            return str(error)
        if body.get("detail"):
            return str(body["detail"])
    return str(body)[:2000]


def lacks_method(message: str, method: str) -> bool:
    """Whether a refused collective_rpc says the workers have no such method: vLLM's multiprocess executor answers
    "has no attribute", its one-process executor (vLLM's default on one GPU, AGL's CPU engine) "is not implemented"."""
    return f"has no attribute '{method}'" in message or f"Method '{method}' is not implemented" in message


class EngineControl:
    """One engine's admin routes. Use as `async with EngineControl(url) as engine: ...`."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 60.0) -> None:
        self.url = engine_root(url)
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # No keep-alive: vLLM's server closes the connection after a route raises (a refused reload), and a
        # pooled connection closed under us would turn the next call into a transport error. Admin calls are
        # a few per training step; a fresh loopback connection each costs well under a millisecond.
        limits = httpx.Limits(max_keepalive_connections=0)
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout_s, limits=limits)
        self._reload_method = AGL_RELOAD

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> EngineControl:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self, method: str, route: str, *, json: Any = None, params: dict[str, Any] | None = None, what: str = ""
    ) -> httpx.Response:
        label = f"{method} {route}" + (f" ({what})" if what else "")
        try:
            response = await self._http.request(method, route, json=json, params=params)
        except httpx.HTTPError as err:
            raise EngineError(self.url, label, None, f"{type(err).__name__}: {err}") from err
        if response.status_code != 200:
            raise EngineError(self.url, label, response.status_code, _message(response))
        return response

    async def health(self) -> bool:
        """True when GET /health answers 200 (the engine core is alive)."""
        try:
            response = await self._http.get("/health")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def wait_ready(self, timeout_s: float = 180.0, interval_s: float = 0.5) -> None:
        """Waits until /health answers 200; EngineError with the last failure after timeout_s."""
        deadline = time.monotonic() + timeout_s
        last = "not tried"
        while True:
            try:
                await self._call("GET", "/health")
                return
            except EngineError as err:
                last = f"{'HTTP ' + str(err.status) if err.status else 'no answer'}: {err.message}"
            if time.monotonic() >= deadline:
                raise EngineError(self.url, "GET /health", None, f"not ready after {timeout_s:g}s (last: {last})")
            await asyncio.sleep(interval_s)

    async def collective_rpc(
        self, method: str, kwargs: dict[str, str] | None = None, timeout_s: float | None = None
    ) -> list[Any]:
        """Calls `method` on every worker (vLLM passes only string arguments); returns one result per worker."""
        body: dict[str, Any] = {"method": method, "kwargs": kwargs or {}}
        if timeout_s is not None:
            body["timeout"] = timeout_s
        what = ", ".join([method, *(f"{k}={v}" for k, v in (kwargs or {}).items())])
        response = await self._call("POST", "/collective_rpc", json=body, what=what)
        if not response.content:
            return []
        return list(response.json().get("results") or [])

    async def reload_weights(self, weights_dir: str | os.PathLike[str]) -> Reload:
        """Loads the safetensors in weights_dir (a path on the engine's host) into the running model in place.

        On an engine with AGL's worker extension the reload is checked first and rolled back if it fails, so a
        refusal leaves the old weights serving; an engine without it gets vLLM's own reload_weights.
        """
        weights_dir = os.fspath(weights_dir)
        started = time.perf_counter()
        try:
            await self.collective_rpc(self._reload_method, {"weights_dir": weights_dir})
        except EngineError as err:
            if self._reload_method != AGL_RELOAD or not lacks_method(err.message, AGL_RELOAD):
                raise
            log.warning("engine %s has no AGL worker extension: using vLLM's reload_weights", self.url)
            self._reload_method = VLLM_RELOAD
        if self._reload_method == VLLM_RELOAD:
            await self.collective_rpc(VLLM_RELOAD, {"weights_path": weights_dir})
        seconds = time.perf_counter() - started
        log.info("engine %s reloaded weights from %s in %.3fs", self.url, weights_dir, seconds)
        return Reload(weights_dir=weights_dir, seconds=seconds, method=self._reload_method)

    async def push_weights(self, weights_dir: str | os.PathLike[str], version: str | int | None = None) -> Reload:
        """One weight update as the trainer does it: reload, drop the prefix cache (KV computed with the old
        weights), then label the weights with `version` if given. Pause the engine or drain the proxies around
        it; a refusal at any step raises EngineError and the later steps are not taken."""
        reload = await self.reload_weights(weights_dir)
        await self.reset_prefix_cache()
        if version is not None:
            await self.set_weight_version(version)
        return reload

    async def load_adapter(self, name: str, adapter_dir: str | os.PathLike[str]) -> Reload:
        """Loads the PEFT adapter in adapter_dir (a path on the engine's host) under `name`, replacing the adapter
        of that name if one is loaded (the engine started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING,
        as `python -m services.engine --lora-rank R` does), then drops the prefix cache. vLLM checks the adapter
        (its rank against --max-lora-rank, its modules against the model) before it evicts the old one, so a
        refused adapter leaves the previous one serving."""
        path = os.fspath(adapter_dir)
        started = time.perf_counter()
        await self._check_adapter_base(path)
        body = {"lora_name": name, "lora_path": path, "load_inplace": True}
        try:
            await self._call("POST", "/v1/load_lora_adapter", json=body, what=f"{name} from {path}")
        except EngineError as err:
            if err.message in ("Not Found", "Method Not Allowed"):  # no such route: no runtime LoRA updates
                raise EngineError(
                    self.url, "POST /v1/load_lora_adapter", err.status,
                    "the engine does not load LoRA adapters at runtime: start it with `--lora-rank R` "
                    "(vLLM's --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)",
                ) from err  # fmt: skip
            raise
        await self.reset_prefix_cache()
        seconds = time.perf_counter() - started
        log.info("engine %s loaded adapter %s from %s in %.3fs", self.url, name, path, seconds)
        return Reload(weights_dir=path, seconds=seconds, method="load_lora_adapter")

    async def _check_adapter_base(self, path: str) -> None:
        """Refuses (EngineError, nothing loaded) an adapter whose config names another base model than the engine's;
        an adapter directory this process cannot read (the engine's host only) is left to the engine."""
        try:
            with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as handle:
                config = json.load(handle)
        except (OSError, ValueError):
            return
        mismatch = adapter_base_mismatch(config, (await self._call("GET", "/v1/models")).json())
        if mismatch is not None:
            raise EngineError(self.url, "POST /v1/load_lora_adapter", 400, f"{path}: {mismatch}; not loaded")

    async def served_adapter(self, name: str) -> str:
        """The label of the adapter the engine serves under `name` (served_adapter_label)."""
        response = await self._call("GET", "/v1/models")
        return served_adapter_label(response.json(), name)

    async def reset_prefix_cache(self, attempts: int = 20, interval_s: float = 0.05) -> None:
        """Drops cached prefixes (computed with old weights). vLLM refuses while running requests hold blocks:
        retried, then EngineError."""
        for _ in range(attempts):
            response = await self._call("POST", "/reset_prefix_cache")
            if response.json().get("success", True):
                return
            await asyncio.sleep(interval_s)
        raise EngineError(
            self.url, "POST /reset_prefix_cache", 200, f"refused {attempts} times (blocks held by running requests)"
        )

    async def set_weight_version(self, version: str | int) -> None:
        """Labels the served weights (vLLM's /update_weight_version); read back with weight_version()."""
        await self._call("POST", "/update_weight_version", json={"new_version": str(version)})

    async def weight_version(self) -> str:
        response = await self._call("GET", "/weight_info")
        return str(response.json()["weight_version"])

    async def pause(self, mode: PauseMode = "wait") -> None:
        """Stops taking new generation work: `wait` lets running requests finish, `abort` ends them,
        `keep` freezes them until resume."""
        await self._call("POST", "/pause", params={"mode": mode})

    async def resume(self) -> None:
        await self._call("POST", "/resume")

    async def is_paused(self) -> bool:
        response = await self._call("GET", "/is_paused")
        return bool(response.json()["is_paused"])
