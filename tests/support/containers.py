"""Fixtures of the container tests: `podman` (the harness's podman, one test module at a time per machine) and
`docker_host` (podman's Docker API for compose clients, with the harness's health-check timer); the Ray job
helpers of the trainer's container tests."""

from __future__ import annotations

import fcntl
import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy import podman_harness
from deploy.podman_harness import Podman

# `ray job submit` runs this venv's Ray CLI: the release the trainer image installs (its tests check that).
RAY = Path(sys.executable).with_name("ray")


def ray_job_status(dashboard: str, submission: str) -> str:
    """A submitted job's status (SUCCEEDED, FAILED, ...) from the Ray head's job REST API."""
    with urllib.request.urlopen(f"{dashboard}/api/jobs/{submission}", timeout=30) as response:
        return json.loads(response.read())["status"]


@pytest.fixture(scope="module")
def podman() -> Iterator[Podman]:
    missing = podman_harness.missing_tools()
    if missing:
        pytest.fail(
            f"the container tests need {', '.join(missing)} (Debian: apt-get install {podman_harness.APT_PACKAGES});"
            " deselect them with -m 'not containers'"
        )
    podman = Podman()
    # One module at a time per machine: the image tags, the pod names kube play takes from deploy/k8s, the
    # Secret's name and the Ray head's host ports are shared by every checkout on it.
    with (podman.cache / "tests.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield podman


@pytest.fixture(scope="module")
def docker_host(podman: Podman) -> Iterator[str]:
    with podman_harness.docker_api(podman) as url, podman_harness.health_timer(podman):
        yield url
