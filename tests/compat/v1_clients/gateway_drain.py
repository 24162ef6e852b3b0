"""v1.0's trainer pausing and draining the gateway around a weight update, then resuming it: its own methods
(`AgentLightningRayPPOTrainer._pause_and_drain_gateway` and `_resume_gateway`, through its own client).

usage: python gateway_drain.py BASE_URL KEY OUT.json   (run in .venv-agl1; the answer is written to OUT.json)
Once imported it prints `ready` and waits for a line on stdin, so the caller can put a call in flight first.
"""

from __future__ import annotations

import json
import sys
import time

import without_verl


def main() -> None:
    base_url, key, out = sys.argv[1:4]
    without_verl.install()
    from agentlightning.client import AgentLightningSyncClient
    from agentlightning.server.routes.proxy import PauseStateResponse
    from agentlightning.verl.trainer import AgentLightningRayPPOTrainer
    from omegaconf import OmegaConf

    trainer = AgentLightningRayPPOTrainer.__new__(AgentLightningRayPPOTrainer)  # only its gateway calls are run
    trainer.config = OmegaConf.create({"agentlightning": {"agl_base_url": base_url, "agl_key": key}})
    trainer._agl_client = None
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.time()
    metrics = trainer._pause_and_drain_gateway(reason="weights update")
    drained_at = time.time()
    with AgentLightningSyncClient(base_url=base_url, key=key, timeout=30) as client:
        paused = PauseStateResponse.model_validate(client.get("/proxy/state").json())
        trainer._resume_gateway()
        resumed = PauseStateResponse.model_validate(client.get("/proxy/state").json())
    answer = {
        "metrics": metrics,
        "started": started,
        "drained_at": drained_at,
        "paused_state": paused.model_dump(),
        "resumed_state": resumed.model_dump(),
    }
    with open(out, "w") as file:
        json.dump(answer, file)


if __name__ == "__main__":
    main()
