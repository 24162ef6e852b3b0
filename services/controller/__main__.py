"""agl-controller: wiring only (config, logging, metrics server, runner, signal handling)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from services.client import LedgerClient

from .config import ControllerConfig, load_config
from .core.controller import Controller
from .core.metrics import ControllerMetrics
from .core.probes import start_probe_server
from .core.readiness import Readiness, follow_ledger, key_refused_at_start, probe_client
from .core.runner import Runner
from .local import agent_sandbox
from .local.sandbox import Policy

log = logging.getLogger("services.controller")


def agent_policy(config: ControllerConfig) -> Policy | None:
    """The policy local agents run under, None when they run uncontained (--agent-sandbox off, or auto on a host
    that cannot: then one warning says why). Raises agent_sandbox.SandboxUnavailable."""
    if config.runner != "local":
        return None
    hidden = [config.log_dir, *([config.key_file] if config.key_file else []), *config.agent_hide]
    wanted = agent_sandbox.build_policy(hidden, config.agent_user)
    policy, reason = agent_sandbox.resolve(config.agent_sandbox, wanted, config.python)
    if reason:
        log.warning(
            "local agents are NOT contained (%s): they can see the controller's and other agents' processes and "
            "files; --agent-sandbox on makes this an error, off silences it (see SECURITY.md)",
            reason,
        )
    elif policy is not None:
        user = "the controller's uid" if policy.uid is None else f"uid {policy.uid} gid {policy.gid}"
        log.info("local agents are contained (own PID and mount namespaces, no capabilities, %s; hidden: %s)",
                 user, ", ".join(policy.hide))  # fmt: skip
    return policy


def build_runner(config: ControllerConfig, metrics: ControllerMetrics, sandbox: Policy | None = None) -> Runner:
    if config.runner == "k8s":
        from .k8s.k8s_api import KubeJobs, load_api_client
        from .k8s.k8s_runner import K8sRunner
        from .k8s.rate_limit import TokenBucket
        from .k8s.template_lanes import TemplateRenderer

        rate = config.max_jobs_per_minute / 60.0
        return K8sRunner(
            KubeJobs(load_api_client(config.kubeconfig), config.namespace),
            agent_url=config.agent_url,
            key=config.key,
            controller_id=config.controller_id,
            default_timeout_s=config.default_timeout_s,
            ttl_seconds_after_finished=config.job_ttl_s,
            bucket=TokenBucket(rate, min(float(config.job_burst), max(config.max_jobs_per_minute, 1.0))),
            reconcile_interval_s=config.reconcile_interval_s,
            renderer=TemplateRenderer(
                config.template_workers,
                timeout_s=config.template_timeout_s,
                quick_limit_s=config.template_quick_limit_s,
                memory_bytes=config.template_memory_bytes,
                max_output_bytes=config.template_max_bytes,
            ),
        )
    from .local.local_runner import LocalRunner

    return LocalRunner(
        agent_url=config.agent_url,
        key=config.key,
        log_dir=Path(config.log_dir).resolve(),
        base_env=config.agent_base_env,
        default_timeout_s=config.default_timeout_s,
        kill_grace_s=config.kill_grace_s,
        python=config.python,
        workdir=Path(config.workdir) if config.workdir else None,
        metrics=metrics,
        agent_launch=config.agent_launch,
        launcher_preload=config.launcher_preload,
        launcher_learn=config.launcher_learn,
        launcher_warm_clients=config.launcher_warm_clients,
        launcher_idle_s=config.launcher_idle_s,
        sandbox=sandbox,
    )


async def serve(config: ControllerConfig, sandbox: Policy | None = None) -> None:
    metrics = ControllerMetrics()
    readiness = Readiness(config.ledger)
    probes = None
    if config.metrics_port:
        probes = start_probe_server(config.metrics_host, config.metrics_port, metrics.registry, readiness)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    ledger = LedgerClient(config.ledger, key=config.key)
    controller = Controller(
        ledger,
        build_runner(config, metrics, sandbox),
        controller_id=config.controller_id,
        max_concurrency=config.max_concurrency,
        metrics=metrics,
        label_selector=config.label_selector,
        # Agents get the kill grace, their reports a moment more; a rollout whose report missed it stays running
        # under this controller id and is reconciled by its next start.
        shutdown_timeout_s=config.kill_grace_s + 2.0,
        readiness=readiness,
        lease_ttl_s=config.lease_ttl_s,
    )
    log.info(
        "controller %s: runner %s, ledger %s, agents reach the proxy at %s, max concurrency %d",
        config.controller_id,
        config.runner,
        config.ledger,
        config.agent_url,
        config.max_concurrency,
    )
    probe = probe_client(config.ledger, config.key, timeout_s=max(config.ready_check_s, 1.0))
    following = asyncio.create_task(follow_ledger(probe, readiness, config.ready_check_s), name="follow-ledger")
    try:
        await controller.run(stop)
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        await probe.close()
        await ledger.close()
        if probes is not None:
            probes.shutdown()
    log.info("controller %s stopped", config.controller_id)


def main(argv: list[str] | None = None) -> None:
    config = load_config(argv)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.pop("AGL_KEY", None)  # read into the config; nothing started from here inherits it
    if config.key_file and os.stat(config.key_file).st_mode & 0o077:
        log.warning("--key-file %s can be read by other users: chmod 600 it", config.key_file)
    try:
        sandbox = agent_policy(config)
    except agent_sandbox.SandboxUnavailable as err:
        log.error("%s; exiting", err)
        sys.exit(2)
    refused = asyncio.run(key_refused_at_start(config.ledger, config.key))
    if refused:  # like the proxy: a key the ledger refuses is fixed by the operator, not by retrying
        log.error("%s; exiting", refused)
        sys.exit(2)
    asyncio.run(serve(config, sandbox))


if __name__ == "__main__":
    main()
