"""`agl` / `python -m services.cli`."""

from __future__ import annotations

import logging
import sys

from .app import main as run_main


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="agl: %(message)s")
    return run_main()


if __name__ == "__main__":
    sys.exit(main())
