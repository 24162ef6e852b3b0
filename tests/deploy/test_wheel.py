"""AGL installed from its wheel, outside any checkout: the wheel is built from the checkout's files, installed in a
fresh venv, and `agl` is run from a user's folder with PYTHONPATH unset. `agl try` starts its own stack (ledger,
proxy, controller, stand-in engine) from the compose file the wheel carries, and the user's agent runs against it.

The venv gets AGL's dependencies from this test's own venv through a .pth file (the wheel itself is installed with
--no-deps): resolving and downloading them would take minutes and a network. A .pth file adds only that folder to
the path; the .pth files inside it (this venv's editable install of the checkout) are not run, so `services` can
only come from the wheel, which the agent checks by recording where its `services` was imported from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
# What the build reads: the package, its metadata, and the deploy/ files setup.py copies into it.
SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "services", "deploy"]
pytestmark = pytest.mark.timeout(240)

AGENT = """
import os

import services
from openai import OpenAI


class Adds:
    def run(self):
        with open(os.environ["WHEEL_TEST_SERVICES_FROM"], "a") as out:
            out.write(services.__file__ + "\\n")
        client = OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=0)
        answer = client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": os.environ["TASK_QUESTION"]}], max_tokens=16
        ).choices[0].message.content or ""
        return 1.0 if os.environ["TASK_ANSWER"] in answer else 0.0
"""


@dataclass
class Installed:
    venv: Path
    wheel: Path

    @property
    def site_packages(self) -> Path:
        return Path(sysconfig.get_path("purelib", vars={"base": str(self.venv), "platbase": str(self.venv)}))


def run(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    source.mkdir()
    for name in SOURCES:
        origin = CHECKOUT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, source / name)
    dist = root / "dist"
    # The PEP 517 hook pip and `python -m build` call, without their isolated build venv (setuptools is here).
    hook = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    build = run([sys.executable, "-c", hook, str(dist)], cwd=source, timeout=180)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheel = dist / build.stdout.strip().splitlines()[-1]
    venv = root / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)]
    added = run(pip, cwd=root, timeout=180)
    assert added.returncode == 0, added.stdout[-3000:] + added.stderr[-3000:]
    result = Installed(venv, wheel)
    (result.site_packages / "agl-test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    yield result


def user_env(**extra: str) -> dict[str, str]:
    """The user's shell: no PYTHONPATH, no AGL settings."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH" and not key.startswith("AGL_")}
    return {**env, **extra}


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    """The user's folder: their agent (one module) and their tasks, and no AGL code."""
    (tmp_path / "adder.py").write_text(AGENT)
    tasks = [{"question": f"What is {a} + 4?", "answer": str(a + 4)} for a in range(3)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return tmp_path


def test_the_wheel_carries_the_compose_file_and_its_dockerfiles_as_deploy_has_them(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        packaged = {name for name in names if name.startswith("services/stack/deploy/")}
        wanted = {
            "deploy/docker-compose.yaml",
            *(str(p.relative_to(CHECKOUT)) for p in CHECKOUT.glob("deploy/docker/*.Dockerfile")),
        }
        assert packaged == {f"services/stack/{name}" for name in wanted}
        for name in wanted:
            assert wheel.read(f"services/stack/{name}") == (CHECKOUT / name).read_bytes(), name
        assert (
            "services/trainer/hydra-conf/agl_trainer.yaml" in names
            and "services/console/templates/base.html.j2" in names
        )
        assert not any(name.startswith(("deploy/", "tests/", "tools/")) for name in names)


def test_the_installed_agl_runs_from_another_folder(installed: Installed, user_folder: Path) -> None:
    bin_dir = installed.venv / "bin"
    where = run(
        [str(bin_dir / "python"), "-c", "import services; print(services.__file__)"], cwd=user_folder, env=user_env()
    )
    assert where.returncode == 0 and Path(where.stdout.strip()).is_relative_to(installed.site_packages), where
    helped = run([str(bin_dir / "agl"), "train", "--help"], cwd=user_folder, env=user_env())
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: agl train") and "--agent-class" in helped.stdout


def test_agl_try_starts_its_own_stack_from_the_wheel(installed: Installed, user_folder: Path) -> None:
    record = user_folder / "services-from.txt"
    env = user_env(WHEEL_TEST_SERVICES_FROM=str(record))
    argv = [str(installed.venv / "bin" / "agl"), "try", "--agent-class", "adder:Adds", "--data", "tasks.jsonl",
            "--env-map", "TASK_QUESTION=input.question", "--env-map", "TASK_ANSWER=input.answer",
            "--tasks", "2"]  # fmt: skip
    tried = run(argv, cwd=user_folder, env=env, timeout=180)
    assert tried.returncode == 0, tried.stdout + tried.stderr
    assert "starting ledger, proxy, controller, standin" in tried.stdout
    assert tried.stdout.count("succeeded, reward 1, 1 model call(s)") == 2, tried.stdout
    assert tried.stdout.splitlines()[-1].startswith("agl try: ok"), tried.stdout
    # The agents ran in the controller the stack started, on the wheel's code.
    imported = record.read_text().split()
    assert len(imported) == 2 and all(Path(path).is_relative_to(installed.site_packages) for path in imported)


def test_the_installed_engine_names_the_setting_for_its_interpreter(installed: Installed, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    engine = run(
        [str(installed.venv / "bin" / "agl-engine"), "--model-dir", str(tmp_path)], cwd=tmp_path, env=user_env()
    )
    assert engine.returncode == 2
    assert "no vLLM in" in engine.stderr and "set AGL_ENGINE_PYTHON" in engine.stderr, engine.stderr
    # An interpreter without AGL in it is refused before vLLM would start and fail to import AGL's extension.
    bare = tmp_path / "bare"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(bare)], cwd=tmp_path).returncode == 0
    env = user_env(AGL_ENGINE_PYTHON=str(bare / "bin" / "python"))
    refused = run([str(installed.venv / "bin" / "agl-engine"), "--model-dir", str(tmp_path)], cwd=tmp_path, env=env)
    assert refused.returncode == 2 and "cannot import AGL's services.engine" in refused.stderr, refused.stderr
