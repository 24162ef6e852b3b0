"""Fixtures of the container tests: `podman` (the harness's podman, one test module at a time per machine) and
`docker_host` (podman's Docker API for compose clients, with the harness's health-check timer)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator

import pytest

from deploy import podman_harness
from deploy.podman_harness import Podman


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
