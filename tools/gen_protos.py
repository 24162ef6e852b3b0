"""Regenerate the Python code for protos/agl/v1 into services/_gen/agl/v1 (run: make protos)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT = ROOT / "services" / "_gen"


def main() -> int:
    target = OUT / "agl"
    if target.exists():
        shutil.rmtree(target)
    OUT.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={OUT}",
            f"--pyi_out={OUT}",
            f"--grpc_python_out={OUT}",
            *protos,
        ]
    )
    if rc != 0:
        return rc
    # Generated modules import each other as top-level "agl.v1"; make that package-relative so the
    # generated package lives inside services/ without claiming a top-level name.
    for path in sorted(target.rglob("*.py*")):
        text = path.read_text()
        text = re.sub(r"^from agl\.v1 import ", "from . import ", text, flags=re.M)
        path.write_text(text)
    for pkg in (target, target / "v1"):
        (pkg / "__init__.py").write_text('"""Generated from protos/ by tools/gen_protos.py; do not edit."""\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
