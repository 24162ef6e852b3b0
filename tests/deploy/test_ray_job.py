"""The documented `ray job submit` commands ship the task files: packaged by Ray's own working_dir code.

Ray's working_dir packaging honours .gitignore, which excludes /data/; the commands set
RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1 and .rayignore repeats the rest of .gitignore. The package is built here
by `ray._private.runtime_env.working_dir.upload_working_dir_if_needed` (what `ray job submit` calls) with
Ray's own `create_package` as the upload step, over a tree carrying the repository's two ignore files.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from zipfile import ZipFile

import pytest

from tests.deploy.conftest import REPO_ROOT

DOCS = [REPO_ROOT / "docs" / "training" / "ray.md", REPO_ROOT / "services" / "trainer" / "README.md"]
IGNORE_GITIGNORE = "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"
# A shell line that runs `ray job submit`, optionally after VAR=value assignments.
COMMAND = re.compile(r"^\s*([A-Z_][A-Z0-9_]*=\S*\s+)*ray job submit\b")
# Paths that exist in a working checkout and must never be uploaded.
NEVER_SHIPPED = [
    ".venv/lib/python3.11/site-packages/torch/__init__.py",
    ".venv-engine/bin/python",
    "services/__pycache__/x.cpython-311.pyc",
    "outputs/2026-11-30/06-00-00/.hydra/config.yaml",
    ".git/HEAD",
    "agl.egg-info/PKG-INFO",
]


def _submit_commands(doc: Path) -> list[list[str]]:
    """Every `ray job submit` command of a document, continuation lines joined, as argv (env prefix first)."""
    lines = doc.read_text().splitlines()
    commands = []
    for i, line in enumerate(lines):
        if not COMMAND.match(line):
            continue
        parts = [line.rstrip()]
        while parts[-1].endswith("\\"):
            parts[-1] = parts[-1][:-1]
            i += 1
            parts.append(lines[i].rstrip())
        commands.append(shlex.split(" ".join(parts)))
    return commands


def _package(tree: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The files Ray would upload as the job's working_dir for this command line."""
    from ray._private.runtime_env.packaging import create_package
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    env = {}
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    assert argv[:3] == ["ray", "job", "submit"], argv
    options = argv[: argv.index("--")] if "--" in argv else argv
    runtime_env = (
        json.loads(options[options.index("--runtime-env-json") + 1]) if "--runtime-env-json" in options else {}
    )
    if "--working-dir" in options:
        runtime_env["working_dir"] = options[options.index("--working-dir") + 1]
    # As ray's job SDK decides it (dashboard_sdk.SubmissionClient._upload_working_dir_if_needed).
    include_gitignore = env.get(IGNORE_GITIGNORE, "0") != "1"
    monkeypatch.chdir(tree)
    out = tree.parent / f"package-{len(list(tree.parent.glob('package-*')))}.zip"

    def upload(working_dir: str, excludes: list[str] | None = None, is_file: bool = False) -> None:
        create_package(working_dir, out, include_gitignore=include_gitignore, excludes=excludes)

    upload_working_dir_if_needed(runtime_env, include_gitignore=include_gitignore, upload_fn=upload)
    with ZipFile(out) as package:
        return set(package.namelist())


def _data_files(argv: list[str]) -> list[str]:
    files = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in ("data.train_files", "data.val_files") and value not in ("", "null"):
            files.extend(v.strip() for v in value.strip("[]").split(","))
    return files


def _tree(tmp_path: Path, data_files: list[str]) -> Path:
    tree = tmp_path / "checkout"
    for name in (".gitignore", ".rayignore"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / name, tree / name)
    for rel in [*data_files, "data/models/tiny/config.json", "services/trainer/__main__.py", *NEVER_SHIPPED]:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("x\n")
    return tree


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_documented_submit_ships_the_data_files_and_not_the_venvs(
    doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = _submit_commands(doc)
    assert commands, f"{doc.name} documents no `ray job submit` command"
    for argv in commands:
        assert "--working-dir" in argv, argv
        data_files = _data_files(argv)
        tree = _tree(tmp_path, data_files)
        shipped = _package(tree, list(argv), monkeypatch)
        for rel in [*data_files, "data/models/tiny/config.json", "services/trainer/__main__.py"]:
            assert rel in shipped, f"{doc.relative_to(REPO_ROOT)}: `{' '.join(argv[:6])} ...` would not ship {rel}"
        assert not shipped & set(NEVER_SHIPPED), sorted(shipped & set(NEVER_SHIPPED))
        shutil.rmtree(tree)


def test_without_the_setting_ray_leaves_data_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure the documented commands avoid: Ray applies .gitignore and /data/ stays behind."""
    tree = _tree(tmp_path, ["data/math_train.jsonl"])
    shipped = _package(tree, ["ray", "job", "submit", "--working-dir", ".", "--", "agl-trainer"], monkeypatch)
    assert "services/trainer/__main__.py" in shipped and "data/math_train.jsonl" not in shipped


def test_rayignore_repeats_every_gitignore_entry_but_data() -> None:
    def entries(name: str) -> set[str]:
        lines = (REPO_ROOT / name).read_text().splitlines()
        return {line.strip() for line in lines if line.strip() and not line.startswith("#")}

    assert entries(".gitignore") - {"/data/"} <= entries(".rayignore")
    assert "/data/" not in entries(".rayignore")
