"""The console's HTTP surface without a browser: what needs a session, where login may send you, headers, flags."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient
from services.console.config import parse_args
from services.trainer.run import progress
from tests.support.procs import free_port

from .conftest import KEY, wait_http


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def fetch(url: str, data: bytes | None = None, opener=None) -> tuple[int, dict[str, str], str]:
    opener = opener or urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, data=data, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


@pytest.mark.parametrize("path", ["/", "/runs", "/runs/x", "/rollouts", "/rollouts/x?tokens=1"])
def test_pages_redirect_to_login_without_a_session(console, path):
    status, headers, _ = fetch(console.url + path)
    assert status == 303
    assert headers["location"] == "/login?next=" + urllib.parse.quote(path)


def test_event_stream_and_fragments_need_a_session(console):
    assert fetch(console.url + "/events")[0] == 401
    request = urllib.request.Request(console.url + "/rollouts", headers={"X-Console-Fragment": "1"})
    assert fetch(request)[0] == 401  # type: ignore[arg-type]
    forged = urllib.request.Request(console.url + "/", headers={"Cookie": "agl_console=master.deadbeef"})
    assert fetch(forged)[0] == 303  # type: ignore[arg-type]


def test_login_sets_a_cookie_without_the_key_and_only_redirects_on_site(console):
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPCookieProcessor(jar))
    body = urllib.parse.urlencode({"key": KEY, "next": "//evil.example/x"}).encode()
    status, headers, _ = fetch(console.url + "/login", body, opener)
    assert status == 303 and headers["location"] == "/"
    cookie = next(iter(jar))
    assert KEY not in cookie.value and cookie.has_nonstandard_attr("HttpOnly")
    status, headers, html = fetch(console.url + "/", opener=opener)
    assert status == 200 and "Overview" in html
    assert "default-src 'self'" in headers["content-security-policy"]
    wrong = urllib.parse.urlencode({"key": "nope"}).encode()
    assert fetch(console.url + "/login", wrong)[0] == 401


def test_flags_bind_localhost_and_require_a_login_key(capsys):
    config = parse_args(["--key", "k"], env={})
    assert config.host == "127.0.0.1" and config.login_keys == ("k",)
    from_env = parse_args([], env={"AGL_CONSOLE_KEY": "viewer", "AGL_LEDGER_ADDR": "ledger:1"})
    assert from_env.ledger == "ledger:1" and from_env.key is None and from_env.login_keys == ("viewer",)
    with pytest.raises(SystemExit) as info:
        parse_args([], env={})
    assert info.value.code == 2
    assert "without a login key" in capsys.readouterr().err


def test_sigterm_ends_open_event_streams_and_exits(ledger, tmp_path):
    """A browser's open event stream does not keep the console alive after SIGTERM."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    env.update({"AGL_LEDGER_ADDR": ledger.address, "AGL_KEY": KEY})
    log = tmp_path / "console.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "agl-console"), "--port", str(port)], stdout=out, stderr=out, env=env
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/readyz", proc, log)
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPCookieProcessor(jar))
        fetch(url + "/login", urllib.parse.urlencode({"key": KEY}).encode(), opener)
        stream = opener.open(url + "/events", timeout=30)
        assert stream.readline() == b"retry: 1000\n"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) in (0, -signal.SIGTERM), log.read_text()  # uvicorn re-raises the signal it caught
        assert time.monotonic() - started < 2.5, log.read_text()
        assert "ERROR" not in log.read_text()
        stream.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def signed_in(console) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPCookieProcessor(jar))
    assert fetch(console.url + "/login", urllib.parse.urlencode({"key": KEY}).encode(), opener)[0] == 303
    return opener


def charted(html: str) -> list[str]:
    """The data-chart names of the run page's charts section, in page order."""
    section = html.split('id="charts"', 1)[1].split("</section>", 1)[0]
    return re.findall(r'data-chart="([^"]*)"', section)


async def test_run_page_charts_the_held_out_reward_first_then_the_users_metrics_and_a_chosen_one(ledger, console):
    run_id = f"html-{uuid.uuid4().hex[:8]}"
    async with LedgerClient(ledger.address, KEY) as client:
        await progress.start_run(client, run_id, {"model": "tiny"}, {"algorithm": "grpo"})
        metrics = {
            "agl/reward/mean": 0.25,
            "val/agl/async/consumed_age/max": 0.0,
            "val/agl/calls/failed": 0.0,
            "val/agl/calls/per_rollout": 1.0,
            "val/agl/health/failed_calls": 0.0,
            "val/agl/reward_mean": 0.44,
            "val/exact_match": 0.5,
            "my/answer_length": 12.0,
        }
        await progress.report_step(client, run_id, 1, metrics)
    opener = signed_in(console)
    status, _, html = fetch(f"{console.url}/runs/{run_id}", opener=opener)
    assert status == 200
    names = charted(html)
    assert names[:4] == ["reward: agl/reward/mean", "val/agl/reward_mean", "val/exact_match", "my/answer_length"], names
    assert not any(name.startswith(("val/agl/async", "val/agl/calls", "val/agl/health")) for name in names)
    assert 'data-step="1" data-value="0.44"' in html.split('data-chart="val/agl/reward_mean"', 1)[1].split("</svg>")[0]
    # A metric picked with ?chart= is charted instead; one the run does not have is ignored.
    query = urllib.parse.urlencode([("chart", "val/agl/calls/per_rollout"), ("chart", "no/such")])
    status, _, html = fetch(f"{console.url}/runs/{run_id}?{query}", opener=opener)
    assert status == 200 and charted(html)[:2] == ["reward: agl/reward/mean", "val/agl/calls/per_rollout"]
    assert "val/agl/reward_mean" not in charted(html)
    assert '<option value="val/agl/calls/per_rollout" selected>' in html


async def test_the_groups_show_the_advantage_the_trainer_used(ledger, console):
    """One advantage on every page: the trainer's (here normalised by the group's deviation), not reward - mean."""
    uid = uuid.uuid4().hex[:8]
    run_id = f"adv-{uid}"
    async with LedgerClient(ledger.address, KEY) as client:
        await progress.start_run(client, run_id, {"model": "tiny"}, {"algorithm": "grpo"})
        labels = {"agl_run": run_id, "agl_step": "2", "agl_group": "g0"}
        specs = [
            rollout_pb2.RolloutSpec(
                rollout_id=f"{uid}-r{i}", input_json="{}", metadata=rollout_pb2.RolloutMetadata(labels=labels)
            )
            for i in range(3)
        ]
        await client.create_rollouts(specs)
        for i, (value, advantage) in enumerate(((1.0, 0.7071), (0.0, -0.7071), (1.0, None))):
            rollout_id = f"{uid}-r{i}"
            await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="a1")
            events = [event_pb2.Event(rollout_id=rollout_id, reward=event_pb2.Reward(value=value))]
            if advantage is not None:
                record = {"step": 2, "reward": value, "advantage": advantage, "kept": True, "left_out": "", "rows": []}
                events.append(
                    event_pb2.Event(rollout_id=rollout_id, event_type="agl_training_rows", data_json=json.dumps(record))
                )
            await client.append_events(events)
            await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_SUCCEEDED)
    opener = signed_in(console)
    _, _, html = fetch(f"{console.url}/runs/{run_id}", opener=opener)
    table = html.split('id="groups"', 1)[1].split("</table>", 1)[0]
    cells = {
        rollout: re.findall(r"<td>([^<]*)</td>", row)[-2:]
        for rollout, row in re.findall(r'href="/rollouts/([^"]+)">.*?</td>(.*?)</tr>', table, re.S)
    }
    assert cells == {f"{uid}-r0": ["1", "0.7071"], f"{uid}-r1": ["0", "-0.7071"], f"{uid}-r2": ["1", "-"]}, cells
