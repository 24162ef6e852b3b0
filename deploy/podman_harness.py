"""Build the Dockerfiles and run the compose file with podman, on a machine that cannot reach Docker Hub.

What a user with Docker gets is what this builds: the same Dockerfiles, the same build commands, the same compose
file. Only two things are substituted, and only here:
- the base image `python:3.11-slim-bookworm` is a Debian bookworm root file system made by `mmdebstrap` (Python
  3.11, pip, this host's CA bundle so pip works behind an intercepting TLS proxy), imported under that name;
- the Docker daemon is `podman system service`, to which Debian's `docker-compose` client talks; podman's
  periodic health checks (a systemd timer on a normal host) are run by a thread of this harness.
podman reads its settings from a file of this harness (CONTAINERS_CONF), never from /etc: rlimits are left alone
(this sandbox refuses `setrlimit` in a container's init) and `init: true` uses Debian's catatonit.

Everything it keeps lives under data/containers/ (the base tarball is reused between runs on one machine).
Command line: `python -m deploy.podman_harness base|build [NAMES...]|sizes`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = REPO_ROOT / "data" / "containers"
BASE_IMAGE = "python:3.11-slim-bookworm"
# Names the root file system's recipe: a new name makes a new tarball and re-tags the base.
BASE_ROOTFS = "bookworm-python3-dev"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Where a sandbox keeps wheels its network cannot fetch (torch's CPU build: download.pytorch.org does not resolve
# here). When it exists, heavy builds see it read-only as pip's --find-links; the Dockerfiles stay as they are.
LOCAL_WHEELS = Path("/opt/wheels")
TOOLS = ("podman", "runc", "mmdebstrap", "docker-compose", "catatonit")
APT_PACKAGES = (
    "podman runc buildah mmdebstrap catatonit docker-compose golang-github-containernetworking-plugin-dnsname"
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Image:
    """One image a Dockerfile of deploy/docker builds; `heavy` ones (GBs of torch) stay out of the default run,
    `gpu` ones (PyPI's CUDA torch and vLLM, several GB of downloads) are built only when named."""

    name: str
    dockerfile: str
    target: str | None = None
    heavy: bool = False
    gpu: bool = False
    # `--build-arg NAME=VALUE` pairs: a variant of a Dockerfile (the trainer's CPU build).
    args: tuple[tuple[str, str], ...] = ()

    @property
    def tag(self) -> str:
        return f"{self.name}:latest"

    def build_args(self) -> list[str]:
        """`podman build` arguments: the documented `docker build` (docs/deploy/kubernetes.md) plus the Docker image
        format (keeps HEALTHCHECK)."""
        target = ["--target", self.target] if self.target else []
        build_args = [arg for name, value in self.args for arg in ("--build-arg", f"{name}={value}")]
        dockerfile = f"deploy/docker/{self.dockerfile}"
        return [
            "build", "--format", "docker", "--network", "host", "-f", dockerfile, *target, *build_args,
            "-t", self.tag, ".",
        ]  # fmt: skip


TRAINER_CPU_ARGS = (
    ("TORCH_INDEX_URL", "https://download.pytorch.org/whl/cpu"),
    ("TORCH_SPEC", "torch==2.13.0+cpu"),
    ("VLLM_SPEC", ""),
)
IMAGES = {
    image.name: image
    for image in (
        Image("agl-ledger", "ledger.Dockerfile"),
        Image("agl-proxy", "proxy.Dockerfile"),
        Image("agl-controller-local", "controller.Dockerfile", "local"),
        Image("agl-console", "console.Dockerfile"),
        Image("agl-controller", "controller.Dockerfile", "controller"),
        Image("agl-agents", "agents.Dockerfile"),
        Image("agl-engine", "engine.Dockerfile", heavy=True),
        Image("agl-trainer", "trainer.Dockerfile", heavy=True, gpu=True),
        # The trainer's CPU variant (its Dockerfile's header): CPU torch first, no vLLM.
        Image("agl-trainer-cpu", "trainer.Dockerfile", heavy=True, args=TRAINER_CPU_ARGS),
    )
}
LIGHT = tuple(name for name, image in IMAGES.items() if not image.heavy)
# `build all`: every image but the GPU ones.
ALL_CPU = tuple(name for name, image in IMAGES.items() if not image.gpu)


class HarnessError(RuntimeError):
    """A podman step failed; the message carries the command and its output."""


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


class Podman:
    """podman with this harness's containers.conf."""

    def __init__(self, cache: Path = CACHE) -> None:
        self.cache = cache
        cache.mkdir(parents=True, exist_ok=True)
        self.conf = cache / "containers.conf"
        init = shutil.which("catatonit") or "/usr/bin/catatonit"
        # runc: crun refuses this sandbox's hybrid cgroups ("cgroups in hybrid mode not supported").
        self.conf.write_text(
            f'[containers]\ndefault_ulimits = []\ninit_path = "{init}"\n\n[engine]\nruntime = "runc"\n'
        )
        self.env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["podman", *args], cwd=REPO_ROOT, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise HarnessError(f"podman {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}")
        return result

    def image_exists(self, ref: str) -> bool:
        return self.run("image", "exists", ref, check=False).returncode == 0

    def image_size(self, ref: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())

    def inspect(self, ref: str) -> dict:
        return json.loads(self.run("inspect", ref).stdout)[0]


# -- the base image -------------------------------------------------------------------------------------------


def base_tarball(cache: Path = CACHE) -> Path:
    """The Debian root file system standing in for python:3.11-slim-bookworm, made once per machine (~1 min)."""
    tarball = cache / f"{BASE_ROOTFS}.tar"
    if tarball.is_file():
        return tarball
    partial = tarball.with_suffix(".partial.tar")
    hooks = [
        # What the official image differs in and the Dockerfiles rely on: `python`/`pip` on PATH, pip allowed to
        # install into the system interpreter (the official image has no Debian-managed Python).
        'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
        'ln -sf python3 "$1"/usr/bin/python',
        'ln -sf pip3 "$1"/usr/bin/pip',
        # Debian's pip trusts the system bundle: this host's, so pip works behind an intercepting TLS proxy.
        f'cp {HOST_CA_BUNDLE} "$1"/etc/ssl/certs/ca-certificates.crt',
        'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
    ]
    # python3-dev: the official image has Python's headers (torch's inductor, compiling in the engine, needs them).
    packages = "python3,python3-venv,python3-pip,python3-dev,ca-certificates"
    argv = ["mmdebstrap", "--variant=minbase", f"--include={packages}"]
    argv += [f"--customize-hook={hook}" for hook in hooks]
    argv += ["bookworm", str(partial)]
    log.info("making the base root file system: %s", " ".join(argv))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise HarnessError(f"mmdebstrap exited {result.returncode}:\n{result.stderr[-4000:]}")
    partial.rename(tarball)
    return tarball


def ensure_base_image(podman: Podman) -> str:
    """Tags the Debian root file system as the Dockerfiles' base image, unless that name is already this one (or
    an image not made here, such as the real one pulled from a registry)."""
    if podman.image_exists(BASE_IMAGE):
        label = podman.run("image", "inspect", "--format", '{{index .Labels "agl.base"}}', BASE_IMAGE).stdout.strip()
        if label in (BASE_ROOTFS, "", "<no value>"):
            return BASE_IMAGE
    tarball = base_tarball(podman.cache)
    changes = ["ENV LANG=C.UTF-8", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    changes.append(f"LABEL agl.base={BASE_ROOTFS}")
    changes.append('CMD ["python3"]')
    args = ["import"]
    for change in changes:
        args += ["--change", change]
    podman.run(*args, str(tarball), BASE_IMAGE, timeout=300)
    return BASE_IMAGE


def build(podman: Podman, names: Sequence[str]) -> dict[str, float]:
    """Builds the images (base image first); returns seconds per image."""
    ensure_base_image(podman)
    seconds: dict[str, float] = {}
    for name in names:
        image = IMAGES[name]
        started = time.monotonic()
        log.info("building %s", image.tag)
        args = image.build_args()
        # Not for a GPU image: the local CPU torch would satisfy vLLM's torch pin and make a broken CUDA image.
        if image.heavy and not image.gpu and LOCAL_WHEELS.is_dir():
            # pip reads /etc/pip.conf in every RUN step; the image keeps neither the file nor the wheels. PyPI as an
            # extra index: what download.pytorch.org would also have served (torch's own requirements).
            conf = podman.cache / "pip-local-wheels.conf"
            # retries = 0: the unreachable index then costs one failed lookup per package, not five with back-off.
            conf.write_text(
                f"[global]\nfind-links = {LOCAL_WHEELS}\nextra-index-url = https://pypi.org/simple\nretries = 0\n"
            )
            wheels = ["--volume", f"{LOCAL_WHEELS}:{LOCAL_WHEELS}:ro", "--volume", f"{conf}:/etc/pip.conf:ro"]
            args = [args[0], *wheels, *args[1:]]
        podman.run(*args, timeout=3600 if image.heavy else 900)
        seconds[name] = time.monotonic() - started
    # The images a rebuild replaced (tagless now): each is hundreds of MB, and CI machines build every run.
    podman.run("image", "prune", "--force", timeout=300)
    return seconds


# -- the Docker API and compose -------------------------------------------------------------------------------


@contextlib.contextmanager
def docker_api(podman: Podman) -> Iterator[str]:
    """`podman system service` on a unix socket of the cache; yields the DOCKER_HOST for compose clients."""
    sock = podman.cache / f"podman-{os.getpid()}.sock"
    sock.unlink(missing_ok=True)
    url = f"unix://{sock}"
    log_file = (podman.cache / "service.log").open("w")
    proc = subprocess.Popen(
        ["podman", "system", "service", "--time=0", url], env=podman.env, stdout=log_file, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while not _answers(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise HarnessError(f"podman system service did not answer on {sock}: see {log_file.name}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_file.close()
        sock.unlink(missing_ok=True)


def _answers(sock: Path) -> bool:
    if not sock.exists():
        return False
    with socket.socket(socket.AF_UNIX) as client:
        try:
            client.connect(str(sock))
            client.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return b" 200 " in client.recv(64)
        except OSError:
            return False


@contextlib.contextmanager
def health_timer(podman: Podman) -> Iterator[None]:
    """Runs each running container's health check every `interval` of its own, as systemd's timers do for podman.

    Without it (no systemd here) a container's health stays `starting` and compose never starts what depends on
    it. Like Docker, the first check runs one interval after the container is first seen running."""
    stop = threading.Event()

    def interval_of(container: str) -> float:
        text = podman.run("inspect", "--format", "{{json .Config.Healthcheck}}", container, check=False).stdout
        check = json.loads(text or "null") if text.strip() not in ("", "<no value>") else None
        if not check or not check.get("Test") or check["Test"][0] == "NONE":
            return float("inf")
        return (check.get("Interval") or 30_000_000_000) / 1e9

    def tick() -> None:
        due: dict[str, float] = {}
        while not stop.wait(0.5):
            try:
                running = podman.run("ps", "-q", "--no-trunc", check=False, timeout=30).stdout.split()
                now = time.monotonic()
                for container in running:
                    if container not in due:
                        due[container] = now + interval_of(container)
                    elif now >= due[container]:
                        podman.run("healthcheck", "run", container, check=False, timeout=60)
                        due[container] = time.monotonic() + interval_of(container)
            except subprocess.TimeoutExpired:
                log.warning("podman took longer than its timeout in the health timer")

    thread = threading.Thread(target=tick, name="podman-health-timer", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(90)


class ComposeProject:
    """deploy/docker-compose.yaml under one project name, driven by the docker-compose client over DOCKER_HOST."""

    def __init__(
        self, podman: Podman, docker_host: str, name: str, variables: dict[str, str], profiles: Sequence[str]
    ) -> None:
        self.podman = podman
        self.name = name
        # The caller's AGL_*/COMPOSE_* settings never leak in: only the variables given here.
        env = {key: value for key, value in os.environ.items() if not key.startswith(("AGL_", "COMPOSE_", "DOCKER_"))}
        self.env = {**env, **variables, "DOCKER_HOST": docker_host, "COMPOSE_PROJECT_NAME": name}
        self.profiles = [arg for profile in profiles for arg in ("--profile", profile)]

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = ["docker-compose", "-f", str(REPO_ROOT / "deploy" / "docker-compose.yaml"), *self.profiles, *args]
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise HarnessError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr[-4000:]}\n{self.logs()}")
        return result

    def up(self) -> float:
        """`up -d --no-build` (images built first); returns the seconds until compose returned (all started)."""
        started = time.monotonic()
        self.compose("up", "-d", "--no-build")
        return time.monotonic() - started

    def down(self, volumes: bool = False) -> None:
        self.compose("down", *(["--volumes"] if volumes else []))

    def containers(self) -> dict[str, dict]:
        """This project's containers (running or not) by compose service name: State, Health."""
        label = f"label=com.docker.compose.project={self.name}"
        found = json.loads(self.podman.run("ps", "-a", "--format", "json", "--filter", label).stdout or "[]")
        result = {}
        for item in found:
            service = (item.get("Labels") or {}).get("com.docker.compose.service", item["Names"][0])
            result[service] = self.podman.inspect(item["Id"])["State"]
        return result

    def wait_healthy(self, services: Sequence[str], timeout_s: float) -> dict[str, dict]:
        """This project's container states once every one of `services` is healthy (compose returns once what
        others depend on is; a service nothing waits for may lag); HarnessError with the logs at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.containers()
            health = {name: (states.get(name) or {}).get("Health", {}).get("Status") for name in services}
            if all(status == "healthy" for status in health.values()):
                return states
            if time.monotonic() > deadline:
                raise HarnessError(f"not healthy within {timeout_s:.0f}s: {health}\n{self.logs()}")
            time.sleep(1)

    def volumes(self) -> list[str]:
        names = self.podman.run("volume", "ls", "--format", "{{.Name}}").stdout.split()
        return [name for name in names if name.startswith(f"{self.name}_")]

    def logs(self, tail: int = 40) -> str:
        label = f"label=com.docker.compose.project={self.name}"
        lines = []
        for container in self.podman.run("ps", "-a", "-q", "--filter", label, check=False).stdout.split():
            out = self.podman.run("logs", "--tail", str(tail), container, check=False)
            lines.append(f"--- {container} ---\n{out.stdout}{out.stderr}")
        return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.podman_harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("base", help=f"make the Debian base and tag it {BASE_IMAGE}")
    p = sub.add_parser(
        "build", help="build images (default: the light ones; `all` adds the CPU engine and CPU trainer)"
    )
    p.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(IMAGES)}, or all")
    sub.add_parser("sizes", help="sizes of the built images")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    missing = missing_tools()
    if missing:
        parser.error(f"not installed: {', '.join(missing)} (Debian: apt-get install {APT_PACKAGES})")
    podman = Podman()
    if args.command == "base":
        print(ensure_base_image(podman))
    elif args.command == "build":
        names = list(ALL_CPU) if "all" in args.names else (args.names or list(LIGHT))
        unknown = sorted(set(names) - set(IMAGES))
        if unknown:
            parser.error(f"no image {', '.join(unknown)}: choose from {', '.join(IMAGES)} or all")
        for name, seconds in build(podman, names).items():
            print(f"{IMAGES[name].tag}: built in {seconds:.0f} s, {podman.image_size(IMAGES[name].tag) / 1e6:.0f} MB")
    else:
        for image in IMAGES.values():
            if podman.image_exists(image.tag):
                print(f"{image.tag}: {podman.image_size(image.tag) / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
