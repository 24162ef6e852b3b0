"""Fixtures for the console tests: a real ledger, the installed `agl-console` against it, and Debian's chromium
driven headless through its chromedriver. Screenshots go to $AGL_TEST_ARTIFACTS/console (default
.pytest_cache/artifacts/console) and are kept after the run."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.support.procs import REPO_ROOT, ServiceProcess, free_port, start_ledger

KEY = "console-master-key"
VIEWER_KEY = "console-viewer-key"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("AGL_TEST_ARTIFACTS", REPO_ROOT / ".pytest_cache" / "artifacts")) / "console"


@dataclass
class Console:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    directory = tmp_path_factory.mktemp("console-ledger")
    with start_ledger(store=f"sqlite:{directory / 'ledger.db'}", key=KEY, log_dir=directory) as proc:
        yield proc


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"agl-console exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"agl-console not ready at {url}:\n{log.read_text()}")


@contextlib.contextmanager
def run_console(ledger: ServiceProcess, log: Path, args: Sequence[str] = ()) -> Iterator[Console]:
    """The installed console script, started the way a user does (flags and AGL_* environment)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    env.update({"AGL_LEDGER_ADDR": ledger.address, "AGL_KEY": KEY, "AGL_CONSOLE_KEY": VIEWER_KEY})
    argv = [str(Path(sys.executable).parent / "agl-console"), "--port", str(port), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/readyz", proc, log)
        yield Console(url, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def console(ledger: ServiceProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    with run_console(ledger, tmp_path_factory.mktemp("console") / "console.log") as started:
        yield started


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def screenshot(browser: webdriver.Chrome, request: pytest.FixtureRequest):
    """screenshot("name") saves the browser's view as a kept test artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def take(name: str) -> Path:
        path = ARTIFACTS / f"{request.node.name}-{name}.png"
        assert browser.save_screenshot(str(path)), f"screenshot {path} failed"
        return path

    return take
