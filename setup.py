"""The wheel carries the compose file and the Dockerfiles it builds from (services/stack starts a local stack from
them): copied from deploy/ into services/stack/deploy/ at build time, so deploy/ stays their one source. Everything
else about the package is in pyproject.toml.

A tree without deploy/ (an image's build context: it copies only services/) builds without them; an installed
`agl train` then says the compose file is missing (services/stack/compose_file.py).
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# Relative to the checkout, and relative to the packaged folder alike (the compose file's build contexts are `..`).
STACK_FILES = ["deploy/docker-compose.yaml", "deploy/docker/*.Dockerfile"]
PACKAGED_UNDER = Path("services", "stack")


class BuildWithStackFiles(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install reads the checkout's deploy/ itself
        for pattern in STACK_FILES:
            for source in sorted(HERE.glob(pattern)):
                target = Path(self.build_lib, PACKAGED_UNDER, source.relative_to(HERE))
                self.mkpath(str(target.parent))
                self.copy_file(str(source), str(target))


setup(cmdclass={"build_py": BuildWithStackFiles})
