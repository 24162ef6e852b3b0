"""Pure core: agent environment, env_map, launch targets, outcome mapping, token bucket, config."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from services.client import agent_token
from services.controller.config import load_config
from services.controller.core.agent_env import NO_KEY, agent_env, parse_input, resolve_env_map
from services.controller.core.outcome import (
    EXIT_CODE,
    JOB_FAILED,
    SIGNAL,
    TIMEOUT,
    ConfigError,
    exit_outcome,
    timed_out,
)
from services.controller.k8s.job_status import describe_pods, job_outcome, with_detail
from services.controller.k8s.rate_limit import TokenBucket
from services.controller.local.launch_target import RUNNER_MODULE, local_argv, split_agent_class
from services.controller.local.local_runner import file_stem, last_line


def test_agent_env_follows_the_contract() -> None:
    env = agent_env("http://proxy:8080/", "ro-1", "at-1", True, "master")
    assert env == {
        "AGL_OPENAI_BASE_URL": "http://proxy:8080/proxy/rollout/ro-1/attempt/at-1/mode/train/openai/v1",
        "AGL_EVENT_URL": "http://proxy:8080/api/rollouts/ro-1/attempt/at-1/events",
        "AGL_KEY": agent_token("master", "ro-1", "at-1"),
    }
    assert "master" not in env["AGL_KEY"]
    val = agent_env("http://proxy:8080", "ro-1", "at-1", False, None)
    assert "/mode/val/" in val["AGL_OPENAI_BASE_URL"]
    assert val["AGL_KEY"] == NO_KEY


def test_env_map_resolves_paths() -> None:
    context = {"input": {"question": "q?", "items": [{"t": 1}, "two"], "n": 3, "flag": False, "none": None}}
    env = resolve_env_map(
        {
            "Q": "input.question",
            "FIRST": "input.items.0",
            "SECOND": "input.items.1",
            "NESTED": "input.items.0.t",
            "N": "input.n",
            "FLAG": "input.flag",
            "NONE": "input.none",
            "ALL": "input",
        },
        context,
    )
    assert env["Q"] == "q?"
    assert env["FIRST"] == '{"t": 1}'
    assert env["SECOND"] == "two"
    assert env["NESTED"] == "1"
    assert env["N"] == "3"
    assert env["FLAG"] == "false"
    assert env["NONE"] == "null"
    assert env["ALL"].startswith('{"question": "q?"')


@pytest.mark.parametrize("path", ["input.missing", "input.items.5", "input.question.x", "input.items.x"])
def test_env_map_missing_path_names_the_path(path: str) -> None:
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        resolve_env_map({"V": path}, {"input": {"question": "q", "items": [1]}})


def test_env_map_cannot_set_agent_variables() -> None:
    with pytest.raises(ConfigError, match="AGL_KEY"):
        resolve_env_map({"AGL_KEY": "input.q"}, {"input": {"q": "x"}})


def test_parse_input() -> None:
    assert parse_input("") is None
    assert parse_input('{"a": 1}') == {"a": 1}
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_input("{oops")


def test_launch_targets() -> None:
    assert split_agent_class("pkg.mod:Agent") == ("pkg.mod", "Agent")
    assert split_agent_class("pkg.mod.Agent") == ("pkg.mod", "Agent")
    assert split_agent_class("mod:Outer.Inner") == ("mod", "Outer.Inner")
    for bad in ["Agent", "pkg mod:A", "pkg.mod:", ":A", "1mod:A", ""]:
        with pytest.raises(ConfigError):
            split_agent_class(bad)
    assert local_argv(["sh", "-c", "true"], "ignored.mod:A", "py") == ["sh", "-c", "true"]
    assert local_argv([], "pkg.mod.Agent", "/py") == ["/py", "-m", RUNNER_MODULE, "pkg.mod:Agent"]
    with pytest.raises(ConfigError, match="no local launch target"):
        local_argv([], "", "py")


def test_exit_mapping() -> None:
    assert exit_outcome(0).succeeded
    failed = exit_outcome(3, "(log: x)")
    assert (failed.succeeded, failed.kind, failed.reason) == (False, EXIT_CODE, "agent exited with code 3 (log: x)")
    killed = exit_outcome(-signal.SIGKILL)
    assert killed.kind == SIGNAL
    assert "SIGKILL" in killed.reason
    assert timed_out(30.0).reason == "timed out after 30 s"
    assert timed_out(2.5).kind == TIMEOUT


def _job(conditions: list[dict], deadline: int = 7) -> dict:
    return {
        "metadata": {"name": "agl-x"},
        "spec": {"activeDeadlineSeconds": deadline},
        "status": {"conditions": conditions},
    }


def test_job_status_mapping() -> None:
    assert job_outcome({"metadata": {"name": "x"}, "status": {"active": 1}}) is None
    assert job_outcome(_job([{"type": "SuccessCriteriaMet", "status": "True"}])) is None
    assert job_outcome(_job([{"type": "Complete", "status": "True"}])).succeeded  # type: ignore[union-attr]
    assert job_outcome(_job([{"type": "Failed", "status": "False"}])) is None
    failed = job_outcome(_job([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}]))
    assert failed is not None
    assert (failed.kind, failed.reason) == (JOB_FAILED, "Job agl-x failed: BackoffLimitExceeded: m")
    deadline = job_outcome(_job([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}], deadline=7))
    assert deadline is not None
    assert deadline.kind == TIMEOUT
    assert deadline.reason.startswith("timed out after 7 s")


def test_pod_details() -> None:
    pods = [
        {
            "metadata": {"name": "p"},
            "status": {
                "containerStatuses": [{"name": "agent", "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]
            },
        }
    ]
    detail = describe_pods(pods)
    assert detail == "container agent exited with code 3 (Error)"
    outcome = with_detail(exit_outcome(1), detail, "line\nboom\n")
    assert outcome.reason.endswith("container agent exited with code 3 (Error); log tail: line\nboom")


async def test_token_bucket_paces_after_the_burst() -> None:
    now = [0.0]
    bucket = TokenBucket(rate_per_s=2.0, capacity=3, clock=lambda: now[0])
    assert [bucket.try_take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.try_take() == pytest.approx(0.5)
    now[0] += 0.5
    assert bucket.try_take() == 0.0
    now[0] += 100
    assert [bucket.try_take() for _ in range(4)] == [0.0, 0.0, 0.0, pytest.approx(0.5)]
    unlimited = TokenBucket(rate_per_s=0.0, capacity=1)
    await asyncio.wait_for(asyncio.gather(*(unlimited.take() for _ in range(100))), timeout=5)


def test_config_flags_and_env_defaults() -> None:
    env = {"AGL_PROXY_URL": "http://proxy:1", "AGL_KEY": "secret", "AGL_CONTROLLER_MAX_CONCURRENCY": "4", "HOME": "/h"}
    # --agent-ca inherit: the base environment exactly as given (the CA choice is tested in test_agent_ca.py).
    argv = ["--ledger", "l:1", "--controller-id", "c1", "--label-selector", "run=r1, pool = a", "--agent-ca", "inherit"]
    config = load_config(argv, env)
    assert dict(config.label_selector) == {"run": "r1", "pool": "a"}
    assert (config.ledger, config.proxy_url, config.agent_url) == ("l:1", "http://proxy:1", "http://proxy:1")
    assert (config.max_concurrency, config.key, config.runner) == (4, "secret", "local")
    assert dict(config.agent_base_env) == {"HOME": "/h"}
    assert "secret" not in repr(config)
    config = load_config(["--agent-url", "http://a:2", "--runner", "k8s", "--max-concurrency", "2"], env)
    assert (config.agent_url, config.runner, config.max_concurrency) == ("http://a:2", "k8s", 2)
    with pytest.raises(SystemExit):
        load_config(["--max-concurrency", "0"], {})
    with pytest.raises(SystemExit):
        load_config(["--label-selector", "novalue"], {})


def test_lease_ttl_flag_env_default_and_bounds() -> None:
    assert load_config([], {}).lease_ttl_s == 30.0
    assert load_config([], {"AGL_CONTROLLER_LEASE_TTL": "7.5"}).lease_ttl_s == 7.5
    assert load_config(["--lease-ttl", "2"], {"AGL_CONTROLLER_LEASE_TTL": "7.5"}).lease_ttl_s == 2.0
    for bad in ("0", "-1", "4000", "nan"):
        with pytest.raises(SystemExit):
            load_config(["--lease-ttl", bad], {})


def test_agent_runner_runs_sync_and_async_agents() -> None:
    import subprocess

    for spec in ["tests.controller.agents.simple:SyncAgent", "tests.controller.agents.simple.AsyncAgent"]:
        done = subprocess.run(
            [sys.executable, "-m", RUNNER_MODULE, spec], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1] + " ran"
    failing = subprocess.run(
        [sys.executable, "-m", RUNNER_MODULE, "tests.controller.agents.simple:FailingAgent"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failing.returncode == 1
    assert "RuntimeError: agent failed on purpose" in failing.stderr
    missing = subprocess.run(
        [sys.executable, "-m", RUNNER_MODULE, "tests.controller.agents.simple:Nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2
    assert "cannot load agent class" in missing.stderr


def test_agent_runner_alone_writes_a_returned_reward_in_place(tmp_path: Path) -> None:
    """The file by itself (as the agents image carries it), in an interpreter without site-packages: only the
    standard library is importable. An existing result path (Kubernetes' bind-mounted termination message) is
    written in place, not replaced."""
    import shutil
    import subprocess

    from services.controller.core import agent_runner
    from services.controller.k8s.job_status import returned_in_pods

    runner = Path(shutil.copy(agent_runner.__file__, tmp_path / "agent_runner.py"))
    (tmp_path / "returning_agent.py").write_text("class Agent:\n    def run(self):\n        return 3\n")
    message = tmp_path / "termination-log"
    message.write_text("")
    inode = message.stat().st_ino
    argv = [sys.executable, "-E", "-S", str(runner), "--result-file", str(message), "returning_agent:Agent"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert message.stat().st_ino == inode
    pod = {"status": {"phase": "Succeeded", "containerStatuses": [
        {"name": "agent", "state": {"terminated": {"exitCode": 0, "message": message.read_text()}}}
    ]}}  # fmt: skip
    assert returned_in_pods([pod]) == 3.0
    failed = {"status": dict(pod["status"], phase="Failed")}
    assert returned_in_pods([failed]) is None
    assert not list(tmp_path.glob("*.partial"))


def test_log_file_helpers(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("=== agl rollout r attempt a: true\n")
    assert last_line(log) == ""
    log.write_text("=== agl rollout r attempt a: cmd\nfirst\nlast words\n\n")
    assert last_line(log) == "last words"
    assert last_line(tmp_path / "missing.log") == ""
    assert file_stem("ro-1") == "ro-1"
    odd = [file_stem(rid) for rid in ("../x y", "../x z", ".hidden", "a/b")]
    assert len(set(odd)) == len(odd)
    assert all("/" not in stem and not stem.startswith(".") for stem in odd)
