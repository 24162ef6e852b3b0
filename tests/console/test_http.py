"""The console's HTTP surface without a browser: what needs a session, where login may send you, headers, flags."""

from __future__ import annotations

import http.cookiejar
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from services.console.config import parse_args
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
