"""One misbehaving agent against eight well-behaved ones: what the well-behaved lose (issue 30, finding 1).

Starts a real ledger, a stand-in engine and one proxy on loopback. Eight well-behaved agents each loop over a
model call, a `note` event and a reward, each with its own agent token and rollout, for `--seconds`; first alone
(the baseline), then while one misbehaving agent, with its own token and rollout only, re-posts an event id it used
before with new data as fast as `--bad-loops` concurrent loops allow (each post must be refused to it with 409).
Counts, for the well-behaved agents: answers other than 200 (refused), events answered 200 but not in the ledger
afterwards, and events refused and not stored (lost). The figure that must hold is 0 refused and 0 lost.

    .venv/bin/python bench/isolation_bench.py [--seconds 10] [--agents 8] [--bad-loops 8] [--store memory]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services._gen.agl.v1 import model_pb2, rollout_pb2  # noqa: E402
from services.client import LedgerClient, agent_token  # noqa: E402
from tests.support.procs import free_port, start_ledger, start_service, wait_http_ready  # noqa: E402

KEY = "bench-key"
MODEL = "bench-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 17 + 25?"}], "max_tokens": 16}


@dataclass
class Agent:
    """A well-behaved agent's rollout and what it was answered."""

    rollout_id: str
    statuses: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)
    answered: dict[str, int] = field(default_factory=lambda: {"model_request": 0, "note": 0, "reward": 0})
    refused_messages: list[str] = field(default_factory=list)


def _headers(rollout_id: str) -> dict[str, str]:
    return {"authorization": f"Bearer {agent_token(KEY, rollout_id, 'at-1')}"}


async def _running(address: str, count: int, tag: str) -> list[str]:
    ids = [f"iso-{tag}-{i}-{time.time_ns()}" for i in range(count)]
    async with LedgerClient(address, KEY) as client:
        await client.create_rollouts([rollout_pb2.RolloutSpec(rollout_id=r, input_json="{}") for r in ids])
        for rid in ids:
            await client.update_status(rid, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")
    return ids


async def _behave(proxy: str, agent: Agent, stop: asyncio.Event) -> None:
    base = f"{proxy}/proxy/rollout/{agent.rollout_id}/attempt/at-1/mode/train/openai/v1/chat/completions"
    events = f"{proxy}/api/rollouts/{agent.rollout_id}/attempt/at-1/events"
    headers = _headers(agent.rollout_id)
    async with httpx.AsyncClient(timeout=60) as http:
        for k in itertools.count():
            if stop.is_set():
                return
            posts = (
                ("model_request", base, CHAT),
                ("note", events, {"event_type": "note", "event_id": f"note-{k}", "data": {"k": k}}),
                ("reward", events, {"event_type": "reward", "event_id": f"reward-{k}", "data": {"value": 1.0}}),
            )
            for kind, url, body in posts:
                reply = await http.post(url, json=body, headers=headers)
                agent.statuses[(kind, reply.status_code)] += 1
                if reply.status_code == 200:
                    agent.answered[kind] += 1
                elif len(agent.refused_messages) < 3:
                    agent.refused_messages.append(reply.text[:300])


async def _misbehave(proxy: str, rollout_id: str, stop: asyncio.Event, counter: itertools.count[int]) -> int:
    url = f"{proxy}/api/rollouts/{rollout_id}/attempt/at-1/events"
    headers = _headers(rollout_id)
    refused = 0
    async with httpx.AsyncClient(timeout=60) as http:
        while not stop.is_set():
            body = {"event_type": "note", "event_id": "reused", "data": {"n": next(counter)}}
            reply = await http.post(url, json=body, headers=headers)
            if reply.status_code == 409:
                refused += 1
            else:
                print(f"  the misbehaving agent was answered {reply.status_code}: {reply.text[:200]}")
    return refused


async def _phase(name: str, args: argparse.Namespace, proxy: str, ledger: str, with_bad: bool) -> None:
    good_ids = await _running(ledger, args.agents, name)
    agents = [Agent(rid) for rid in good_ids]
    stop = asyncio.Event()
    bad_tasks: list[asyncio.Task[int]] = []
    bad_id = ""
    if with_bad:
        (bad_id,) = await _running(ledger, 1, f"{name}-bad")
        first = {"event_type": "note", "event_id": "reused", "data": {"n": 0}}
        async with httpx.AsyncClient() as http:
            await http.post(f"{proxy}/api/rollouts/{bad_id}/attempt/at-1/events", json=first, headers=_headers(bad_id))
        counter = itertools.count(1)
        bad_tasks = [asyncio.create_task(_misbehave(proxy, bad_id, stop, counter)) for _ in range(args.bad_loops)]
    started = time.perf_counter()
    good_tasks = [asyncio.create_task(_behave(proxy, agent, stop)) for agent in agents]
    await asyncio.sleep(args.seconds)
    stop.set()
    await asyncio.gather(*good_tasks)
    bad_refused = sum(await asyncio.gather(*bad_tasks))
    wall = time.perf_counter() - started

    posted = refused = not_stored = lost = 0
    refused_by_kind: collections.Counter[str] = collections.Counter()
    async with LedgerClient(ledger, KEY) as client:
        for agent in agents:
            stored = collections.Counter(e.event_type for e in await client.list_events(agent.rollout_id))
            for kind, answered in agent.answered.items():
                tried = sum(n for (k, _), n in agent.statuses.items() if k == kind)
                posted += tried
                refused += tried - answered
                refused_by_kind[kind] += tried - answered
                not_stored += max(answered - stored[kind], 0)
                lost += max(tried - stored[kind], 0)
        bad_stored = len(await client.list_events(bad_id)) if bad_id else 0
    print(f"{name}: {args.agents} well-behaved agents, {wall:.1f} s")
    print(f"  their posts (model calls, notes, rewards): {posted}, {posted / wall:.0f}/s")
    by_kind = ", ".join(f"{kind} {n}" for kind, n in refused_by_kind.items())
    print(f"  refused (not 200): {refused} ({by_kind}); answered 200 but not stored: {not_stored}; lost: {lost}")
    for agent in agents:
        for message in agent.refused_messages[:1]:
            print(f"    e.g. {agent.rollout_id}: {message}")
    if with_bad:
        print(
            f"  misbehaving agent: {bad_refused} conflicting re-posts refused to it with 409 "
            f"({bad_refused / wall:.0f}/s), {bad_stored} of its events stored (the first only)"
        )


async def bench(args: argparse.Namespace) -> None:
    standin_port, proxy_port = free_port(), free_port()
    python = sys.executable
    store = "memory" if args.store == "memory" else f"sqlite:{args.store}"
    standin_argv = [python, "-m", "services.standin", "--host", "127.0.0.1", "--port", str(standin_port)]
    standin_argv += ["--model", MODEL]
    with (
        start_ledger(key=KEY, store=store) as ledger,
        start_service(
            standin_argv, name="standin", ready=lambda _: wait_http_ready(f"http://127.0.0.1:{standin_port}/health")
        ),
    ):
        async with LedgerClient(ledger.address, KEY) as client:
            endpoint = f"http://127.0.0.1:{standin_port}/v1"
            await client.register_models([model_pb2.ModelEndpoint(model_name=MODEL, endpoint=endpoint, version=1)])
        proxy_argv = [python, "-m", "services.proxy", "--host", "127.0.0.1", "--port", str(proxy_port)]
        proxy_argv += ["--ledger", ledger.address, "--model-name", MODEL, "--log-level", "warning"]
        with start_service(
            proxy_argv,
            name="proxy",
            env={"AGL_KEY": KEY},
            ready=lambda _: wait_http_ready(f"http://127.0.0.1:{proxy_port}/healthz"),
        ):
            proxy = f"http://127.0.0.1:{proxy_port}"
            await _phase("baseline", args, proxy, ledger.address, with_bad=False)
            await _phase("attack", args, proxy, ledger.address, with_bad=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--agents", type=int, default=8, help="well-behaved agents")
    parser.add_argument("--bad-loops", type=int, default=8, help="concurrent posting loops of the misbehaving agent")
    parser.add_argument("--store", default="memory", help="memory, or a path for a SQLite ledger")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
