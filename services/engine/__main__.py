"""agl-engine (python -m services.engine) --model-dir DIR [--port 8011] ... [-- VLLM_ARGS]: exec vLLM's CPU server."""

from __future__ import annotations

import logging
import os
import shlex
import sys

from .config import parse_config
from .launch import LaunchError, build_launch

log = logging.getLogger("services.engine")


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        launch = build_launch(config, os.environ)
    except LaunchError as err:
        sys.stderr.write(f"agl-engine: error: {err}\n")
        return 2
    log.info("exec %s", shlex.join(launch.argv))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(launch.argv[0], list(launch.argv), dict(launch.env))
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
