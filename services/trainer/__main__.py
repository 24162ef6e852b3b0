"""agl-trainer / python -m services.trainer: Hydra config (verl's ppo_trainer + agl:) -> Ray job."""

from __future__ import annotations

import logging

import hydra

# Registers the resolver agl_trainer.yaml's search path uses; imports no verl, torch or transformers (the
# driver never does: runner.py).
from services.trainer.config import CONFIG_DIR as _CONFIG_DIR

# An absolute path: Hydra turns a relative one into a module name, and "hydra-conf" is not importable on purpose.
CONFIG_DIR = str(_CONFIG_DIR)


@hydra.main(config_path=CONFIG_DIR, config_name="agl_trainer", version_base=None)
def main(config) -> None:  # type: ignore[no-untyped-def]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from services.trainer.run import fate

    fate.mark()  # before Ray is imported (run/fate.py); the watchdog starts only for a cluster of the driver's own
    from services.trainer.config import ConfigError
    from services.trainer.data.guardrails import HealthStop
    from services.trainer.runner import run

    try:
        run(config)
    except ConfigError as err:  # a setting the user must change: one line, no traceback
        raise SystemExit(f"agl-trainer: {err}") from None
    except HealthStop as err:  # raised in the Ray task runner: Ray's error is a HealthStop too, its cause the line
        raise SystemExit(f"agl-trainer: health stop: {getattr(err, 'cause', None) or err}") from None


if __name__ == "__main__":
    main()
