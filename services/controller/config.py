"""Controller settings: one frozen object built from flags, each defaulting to an AGL_* environment variable.

| flag | env | default |
|---|---|---|
| --ledger | AGL_LEDGER_ADDR | 127.0.0.1:50051 |
| --proxy-url | AGL_PROXY_URL | http://127.0.0.1:8080 |
| --agent-url | AGL_AGENT_URL | (the proxy URL) — proxy URL as the agents reach it |
| --runner | AGL_CONTROLLER_RUNNER | local (local or k8s) |
| --max-concurrency | AGL_CONTROLLER_MAX_CONCURRENCY | 32 attempts at once |
| --label-selector | AGL_CONTROLLER_LABEL_SELECTOR | none; "k=v,k2=v2" takes only rollouts with these labels |
| --controller-id | AGL_CONTROLLER_ID | host name; keep it stable across restarts (reconciliation uses it) |
| --key | AGL_KEY | none; the master key (agents get per-rollout tokens, never this) |
| --key-file | AGL_KEY_FILE | none; a file holding the master key (instead of --key: not on any command line) |
| --default-timeout | AGL_CONTROLLER_DEFAULT_TIMEOUT | 3600 s, for rollouts whose config sets none |
| --metrics-host / -port | AGL_CONTROLLER_METRICS_HOST / _PORT | 0.0.0.0 / 9465 (0: off); also /healthz, /readyz |
| --lease-ttl | AGL_CONTROLLER_LEASE_TTL | 30 s heartbeat lease; silent that long, its rollouts are taken over |
| --ready-check | AGL_CONTROLLER_READY_CHECK | 2 s between the cheap ledger calls /readyz follows |
| --log-level | AGL_LOG_LEVEL | INFO |
| local: --log-dir | AGL_CONTROLLER_LOG_DIR | ./agl-rollout-logs (one log file per rollout) |
| local: --kill-grace | AGL_CONTROLLER_KILL_GRACE | 5 s between SIGTERM and SIGKILL |
| local: --workdir | AGL_CONTROLLER_WORKDIR | the controller's working directory |
| local: --agent-launch | AGL_CONTROLLER_AGENT_LAUNCH | warm (agent classes forked by a launcher) or fresh |
| local: --agent-ca | AGL_CONTROLLER_AGENT_CA | system-dir (the OS's hashed CA directory: cheap TLS) or inherit |
| local: --launcher-preload | AGL_CONTROLLER_LAUNCHER_PRELOAD | none; more modules each launcher imports, "a,b" |
| local: --launcher-learn / --no-launcher-learn | AGL_CONTROLLER_LAUNCHER_LEARN | on (1); 0 turns it off |
| local: --launcher-idle | AGL_CONTROLLER_LAUNCHER_IDLE | 600 s without a rollout stops a launcher |
| local: --agent-sandbox | AGL_CONTROLLER_AGENT_SANDBOX | auto: agents contained where the host allows (on: required) |
| local: --agent-user | AGL_CONTROLLER_AGENT_USER | none (the controller's uid); NAME, UID or UID:GID agents run as |
| local: --agent-hide | AGL_CONTROLLER_AGENT_HIDE | none; "a,b": more paths hidden (log dir, key file: always) |
| k8s: --kubeconfig | AGL_KUBECONFIG | in-cluster config, else ~/.kube/config |
| k8s: --namespace | AGL_CONTROLLER_NAMESPACE | default |
| k8s: --max-jobs-per-minute | AGL_CONTROLLER_MAX_JOBS_PER_MINUTE | 120 (0: unlimited) |
| k8s: --job-burst | AGL_CONTROLLER_JOB_BURST | 10 Jobs created back to back at most |
| k8s: --job-ttl | AGL_CONTROLLER_JOB_TTL | 600 s (ttlSecondsAfterFinished) |
| k8s: --reconcile-interval | AGL_CONTROLLER_RECONCILE_INTERVAL | 30 s between full re-lists of Jobs |
| k8s: --template-timeout | AGL_CONTROLLER_TEMPLATE_TIMEOUT | 5 s to render one Job template |
| k8s: --template-memory-mb | AGL_CONTROLLER_TEMPLATE_MEMORY_MB | 1024 MiB address space of the render worker |
| k8s: --template-max-bytes | AGL_CONTROLLER_TEMPLATE_MAX_BYTES | 1048576 bytes of rendered template at most |
| k8s: --template-workers | AGL_CONTROLLER_TEMPLATE_WORKERS | 2 render worker processes |

Local agents inherit the controller's environment minus every AGL_* variable (with the CA variables chosen by
--agent-ca, see agent_ca.py), plus §3 and env_map.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .agent_ca import MODES as AGENT_CA_MODES
from .agent_ca import SYSTEM_DIR, agent_ca_env
from .agent_sandbox import AUTO, parse_agent_user
from .agent_sandbox import MODES as SANDBOX_MODES


@dataclass(frozen=True)
class ControllerConfig:
    ledger: str
    proxy_url: str
    agent_url: str
    runner: str
    max_concurrency: int
    controller_id: str
    label_selector: Mapping[str, str]
    key: str | None = field(repr=False)
    default_timeout_s: float
    metrics_host: str
    metrics_port: int
    ready_check_s: float
    lease_ttl_s: float
    log_level: str
    log_dir: str
    kill_grace_s: float
    workdir: str
    agent_launch: str
    launcher_preload: tuple[str, ...]
    launcher_learn: bool
    launcher_idle_s: float
    kubeconfig: str
    namespace: str
    max_jobs_per_minute: float
    job_burst: int
    job_ttl_s: int
    reconcile_interval_s: float
    template_timeout_s: float = 5.0
    template_memory_bytes: int = 1 << 30
    template_max_bytes: int = 1 << 20
    template_workers: int = 2
    # The environment local agents start from (AGL_* removed); never logged.
    agent_base_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    python: str = sys.executable
    key_file: str = ""
    # Local agents' containment (agent_sandbox.py): auto, on or off; the (uid, gid) they run as; more hidden paths.
    agent_sandbox: str = AUTO
    agent_user: tuple[int, int] | None = None
    agent_hide: tuple[str, ...] = ()


def parse_label_selector(text: str) -> dict[str, str]:
    """ "k=v,k2=v2" -> {"k": "v", "k2": "v2"}."""
    selector: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--label-selector: {part!r} is not key=value")
        selector[key.strip()] = value.strip()
    return selector


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    def default(name: str, fallback: str) -> str:
        return env.get(name, fallback)

    parser = argparse.ArgumentParser(prog="agl-controller", description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", default=default("AGL_LEDGER_ADDR", "127.0.0.1:50051"))
    parser.add_argument("--proxy-url", default=default("AGL_PROXY_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--agent-url", default=default("AGL_AGENT_URL", ""), help="proxy URL as agents reach it")
    parser.add_argument("--runner", choices=("local", "k8s"), default=default("AGL_CONTROLLER_RUNNER", "local"))
    parser.add_argument("--max-concurrency", type=int, default=int(default("AGL_CONTROLLER_MAX_CONCURRENCY", "32")))
    parser.add_argument(
        "--label-selector",
        default=default("AGL_CONTROLLER_LABEL_SELECTOR", ""),
        help="only rollouts with these labels: k=v,k2=v2",
    )
    parser.add_argument("--controller-id", default=default("AGL_CONTROLLER_ID", socket.gethostname()))
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=float(default("AGL_CONTROLLER_LEASE_TTL", "30")),
        help="seconds without a heartbeat after which live controllers take over this one's running rollouts",
    )
    parser.add_argument("--key", default=default("AGL_KEY", ""), help="master key (default: none)")
    parser.add_argument(
        "--key-file",
        default=default("AGL_KEY_FILE", ""),
        help="a file holding the master key (mode 0600): the key then appears on no command line and in no environment",
    )
    parser.add_argument(
        "--default-timeout", type=float, default=float(default("AGL_CONTROLLER_DEFAULT_TIMEOUT", "3600"))
    )
    parser.add_argument("--metrics-host", default=default("AGL_CONTROLLER_METRICS_HOST", "0.0.0.0"))
    parser.add_argument("--metrics-port", type=int, default=int(default("AGL_CONTROLLER_METRICS_PORT", "9465")))
    parser.add_argument(
        "--ready-check",
        type=float,
        default=float(default("AGL_CONTROLLER_READY_CHECK", "2")),
        help="seconds between the cheap ledger calls that /readyz follows",
    )
    parser.add_argument("--log-level", default=default("AGL_LOG_LEVEL", "INFO"))
    parser.add_argument("--log-dir", default=default("AGL_CONTROLLER_LOG_DIR", "agl-rollout-logs"))
    parser.add_argument("--kill-grace", type=float, default=float(default("AGL_CONTROLLER_KILL_GRACE", "5")))
    parser.add_argument("--workdir", default=default("AGL_CONTROLLER_WORKDIR", ""))
    parser.add_argument(
        "--agent-launch",
        choices=("warm", "fresh"),
        default=default("AGL_CONTROLLER_AGENT_LAUNCH", "warm"),
        help="agent classes: forked by a warm launcher of their module, or each in a fresh interpreter "
        "(a rollout's label agl-launch=fresh|warm overrides it)",
    )
    parser.add_argument(
        "--agent-ca",
        choices=AGENT_CA_MODES,
        default=default("AGL_CONTROLLER_AGENT_CA", SYSTEM_DIR),
        help="CA certificates local agents trust: system-dir swaps a CA bundle for the operating system's hashed "
        "directory (a TLS context then costs ~1 ms instead of ~30 ms per client), inherit passes the "
        "environment on unchanged",
    )
    parser.add_argument(
        "--launcher-preload",
        default=default("AGL_CONTROLLER_LAUNCHER_PRELOAD", ""),
        help="modules every launcher imports besides the agent's, comma-separated",
    )
    parser.add_argument(
        "--launcher-learn",
        action=argparse.BooleanOptionalAction,
        default=default("AGL_CONTROLLER_LAUNCHER_LEARN", "1").strip().lower() not in ("0", "false", "no", "off"),
        help="launchers import the libraries agents imported lazily, once, for the next agents",
    )
    parser.add_argument("--launcher-idle", type=float, default=float(default("AGL_CONTROLLER_LAUNCHER_IDLE", "600")))
    parser.add_argument(
        "--agent-sandbox",
        choices=SANDBOX_MODES,
        default=default("AGL_CONTROLLER_AGENT_SANDBOX", AUTO),
        help="contain local agents (own PID and mount namespaces, no capabilities, the controller's files hidden): "
        "auto where the host allows it (else one warning), on (else the controller does not start), off",
    )
    parser.add_argument(
        "--agent-user",
        default=default("AGL_CONTROLLER_AGENT_USER", ""),
        help="contained local agents run as this user (NAME, UID or UID:GID; the controller must be root); "
        "default: the controller's uid, without capabilities",
    )
    parser.add_argument(
        "--agent-hide",
        default=default("AGL_CONTROLLER_AGENT_HIDE", ""),
        help="more paths hidden from contained local agents, comma-separated (the log directory and the key file "
        "always are)",
    )
    parser.add_argument("--kubeconfig", default=default("AGL_KUBECONFIG", ""))
    parser.add_argument("--namespace", default=default("AGL_CONTROLLER_NAMESPACE", "default"))
    parser.add_argument(
        "--max-jobs-per-minute", type=float, default=float(default("AGL_CONTROLLER_MAX_JOBS_PER_MINUTE", "120"))
    )
    parser.add_argument("--job-burst", type=int, default=int(default("AGL_CONTROLLER_JOB_BURST", "10")))
    parser.add_argument("--job-ttl", type=int, default=int(default("AGL_CONTROLLER_JOB_TTL", "600")))
    parser.add_argument(
        "--reconcile-interval", type=float, default=float(default("AGL_CONTROLLER_RECONCILE_INTERVAL", "30"))
    )
    parser.add_argument(
        "--template-timeout", type=float, default=float(default("AGL_CONTROLLER_TEMPLATE_TIMEOUT", "5"))
    )
    parser.add_argument(
        "--template-memory-mb", type=int, default=int(default("AGL_CONTROLLER_TEMPLATE_MEMORY_MB", "1024"))
    )
    parser.add_argument(
        "--template-max-bytes", type=int, default=int(default("AGL_CONTROLLER_TEMPLATE_MAX_BYTES", str(1 << 20)))
    )
    parser.add_argument("--template-workers", type=int, default=int(default("AGL_CONTROLLER_TEMPLATE_WORKERS", "2")))
    return parser


def load_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> ControllerConfig:
    env = os.environ if env is None else env
    parser = build_parser(env)
    args = parser.parse_args(argv)
    if args.max_concurrency < 1:
        parser.error("--max-concurrency must be at least 1")
    if args.default_timeout <= 0:
        parser.error("--default-timeout must be positive")
    if args.launcher_idle <= 0:
        parser.error("--launcher-idle must be positive")
    if args.ready_check <= 0:
        parser.error("--ready-check must be positive")
    if not 0.3 <= args.lease_ttl <= 3600:  # the ledger's bounds; a NaN fails too
        parser.error("--lease-ttl must be between 0.3 and 3600 seconds")
    if not args.controller_id:
        parser.error("--controller-id must not be empty")
    if args.template_timeout <= 0 or args.template_memory_mb < 128 or args.template_max_bytes < 1024:
        parser.error("--template-timeout must be positive, --template-memory-mb at least 128, "
                     "--template-max-bytes at least 1024")  # fmt: skip
    if not 1 <= args.template_workers <= 64:
        parser.error("--template-workers must be between 1 and 64")
    try:
        selector = parse_label_selector(args.label_selector)
        agent_user = parse_agent_user(args.agent_user)
    except ValueError as err:
        parser.error(str(err))
    if agent_user is not None and args.agent_sandbox == "off":
        parser.error("--agent-user needs the sandbox: drop --agent-sandbox off")
    key = args.key or None
    if args.key_file:
        if args.key:
            parser.error("--key and --key-file are both set (--key or AGL_KEY, --key-file or AGL_KEY_FILE): use one")
        key = read_key_file(parser, args.key_file)
    return ControllerConfig(
        ledger=args.ledger,
        proxy_url=args.proxy_url,
        agent_url=args.agent_url or args.proxy_url,
        runner=args.runner,
        max_concurrency=args.max_concurrency,
        controller_id=args.controller_id,
        label_selector=selector,
        key=key,
        default_timeout_s=args.default_timeout,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        ready_check_s=args.ready_check,
        lease_ttl_s=args.lease_ttl,
        log_level=args.log_level.upper(),
        log_dir=args.log_dir,
        kill_grace_s=args.kill_grace,
        workdir=args.workdir,
        agent_launch=args.agent_launch,
        launcher_preload=tuple(name.strip() for name in args.launcher_preload.split(",") if name.strip()),
        launcher_learn=args.launcher_learn,
        launcher_idle_s=args.launcher_idle,
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        max_jobs_per_minute=args.max_jobs_per_minute,
        job_burst=args.job_burst,
        job_ttl_s=args.job_ttl,
        reconcile_interval_s=args.reconcile_interval,
        template_timeout_s=args.template_timeout,
        template_memory_bytes=args.template_memory_mb << 20,
        template_max_bytes=args.template_max_bytes,
        template_workers=args.template_workers,
        agent_base_env=agent_ca_env({k: v for k, v in env.items() if not k.startswith("AGL_")}, args.agent_ca),
        key_file=os.path.abspath(args.key_file) if args.key_file else "",
        agent_sandbox=args.agent_sandbox,
        agent_user=agent_user,
        agent_hide=tuple(path.strip() for path in args.agent_hide.split(",") if path.strip()),
    )


def read_key_file(parser: argparse.ArgumentParser, path: str) -> str:
    """The master key from its file (one line; surrounding whitespace dropped). Exits with the reason if unusable."""
    try:
        with open(path, encoding="utf-8") as handle:
            key = handle.read().strip()
    except (OSError, UnicodeDecodeError) as err:
        parser.error(f"--key-file {path}: cannot read it: {err}")
    if not key:
        parser.error(f"--key-file {path} is empty")
    if "\n" in key:
        parser.error(f"--key-file {path} holds more than one line")
    return key
