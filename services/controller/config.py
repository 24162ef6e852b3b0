"""Controller settings: one frozen object built from flags, each defaulting to an AGL_* environment variable.

The flags, their variables, defaults and what each value must be are declared once, in SETTINGS below
(`agl-controller --help` lists them). Local runner: --log-dir, --kill-grace, --workdir, --agent-*, --launcher-*;
Kubernetes runner: --kubeconfig, --namespace, --max-jobs-per-minute, --job-*, --reconcile-interval, --template-*.

Local agents inherit the controller's environment minus every AGL_* variable (with the CA variables chosen by
--agent-ca, see local/agent_ca.py), plus §3 and env_map.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from services import settings as st

from .local.agent_ca import MODES as AGENT_CA_MODES
from .local.agent_ca import SYSTEM_DIR, agent_ca_env
from .local.agent_sandbox import AUTO, parse_agent_user
from .local.agent_sandbox import MODES as SANDBOX_MODES


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
    launcher_warm_clients: bool
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
    template_quick_limit_s: float = 0.25
    # The environment local agents start from (AGL_* removed); never logged.
    agent_base_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    python: str = sys.executable
    key_file: str = ""
    # Local agents' containment (local/agent_sandbox.py): auto, on or off; the (uid, gid) they run as; paths hidden.
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


def _selector(text: str) -> dict[str, str]:
    try:
        return parse_label_selector(text)
    except ValueError as err:
        raise ValueError(str(err).removeprefix("--label-selector: ")) from None


def _agent_user(text: str) -> tuple[int, int] | None:
    try:
        return parse_agent_user(text)
    except ValueError as err:
        raise ValueError(str(err).removeprefix("--agent-user: ")) from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


_S = st.seconds()
_NAMES = st.custom("comma-separated names", _names, metavar="A,B")
SETTINGS = st.Settings(
    "agl-controller",
    __doc__.splitlines()[0],
    [
        st.Setting("--ledger", "AGL_LEDGER_ADDR", st.text(nonempty=True), "127.0.0.1:50051"),
        st.Setting("--proxy-url", "AGL_PROXY_URL", st.text(nonempty=True), "http://127.0.0.1:8080",
                   "the proxy's URL"),
        st.Setting("--agent-url", "AGL_AGENT_URL", st.text(), "", "proxy URL as agents reach it",
                   shown="the proxy URL"),
        st.Setting("--runner", "AGL_CONTROLLER_RUNNER", st.choice("local", "k8s"), "local"),
        st.Setting("--max-concurrency", "AGL_CONTROLLER_MAX_CONCURRENCY", st.integer(1), 32, "attempts at once"),
        st.Setting("--label-selector", "AGL_CONTROLLER_LABEL_SELECTOR", st.custom("k=v,k2=v2", _selector, "K=V,..."),
                   {}, "only rollouts with these labels", shown="none"),
        st.Setting("--controller-id", "AGL_CONTROLLER_ID", st.text(nonempty=True), socket.gethostname(),
                   "keep it stable across restarts (reconciliation uses it)", shown="the host name"),
        st.Setting("--lease-ttl", "AGL_CONTROLLER_LEASE_TTL", st.seconds(low=0.3, high=3600), 30.0,
                   "seconds without a heartbeat after which live controllers take over this one's running rollouts "
                   "(renewed every third of it)",
                   name="lease_ttl_s"),  # the ledger's bounds
        st.Setting("--key", "AGL_KEY", st.text(empty_is_none=True), None, "master key", secret=True),
        st.Setting("--key-file", "AGL_KEY_FILE", st.text(), "",
                   "a file holding the master key (mode 0600): the key then appears on no command line and in no "
                   "environment"),
        st.Setting("--default-timeout", "AGL_CONTROLLER_DEFAULT_TIMEOUT", _S, 3600.0,
                   "seconds, for rollouts whose config sets none", name="default_timeout_s"),
        st.Setting("--metrics-host", "AGL_CONTROLLER_METRICS_HOST", st.text(), "127.0.0.1",
                   "bind address of the metrics and probes (loopback unless configured; 0.0.0.0 in the image)"),
        st.Setting("--metrics-port", "AGL_CONTROLLER_METRICS_PORT", st.port(zero_is_off=True), 9465,
                   "/metrics, /healthz, /readyz"),
        st.Setting("--ready-check", "AGL_CONTROLLER_READY_CHECK", _S, 2.0,
                   "seconds between the cheap ledger calls that /readyz follows", name="ready_check_s"),
        st.Setting("--log-level", "AGL_LOG_LEVEL", st.log_level(), "INFO"),
        st.Setting("--log-dir", "AGL_CONTROLLER_LOG_DIR", st.text(nonempty=True), "agl-rollout-logs",
                   "local: one log file per rollout"),
        st.Setting("--kill-grace", "AGL_CONTROLLER_KILL_GRACE", st.seconds(zero=True), 5.0,
                   "local: seconds between SIGTERM and SIGKILL", name="kill_grace_s"),
        st.Setting("--workdir", "AGL_CONTROLLER_WORKDIR", st.text(), "", "local: agents' working directory",
                   shown="the controller's"),
        st.Setting("--agent-launch", "AGL_CONTROLLER_AGENT_LAUNCH", st.choice("warm", "fresh"), "warm",
                   "local: agent classes forked by a warm launcher of their module, or each in a fresh interpreter "
                   "(a rollout's label agl-launch=fresh|warm overrides it)"),
        st.Setting("--agent-ca", "AGL_CONTROLLER_AGENT_CA", st.choice(*AGENT_CA_MODES), SYSTEM_DIR,
                   "local: CA certificates agents trust: system-dir swaps a CA bundle for the operating system's "
                   "hashed directory (a TLS context then costs ~1 ms instead of ~30 ms per client), inherit passes "
                   "the environment on unchanged"),
        st.Setting("--launcher-preload", "AGL_CONTROLLER_LAUNCHER_PRELOAD", _NAMES, (),
                   "local: modules every launcher imports besides the agent's"),
        st.Setting("--launcher-learn", "AGL_CONTROLLER_LAUNCHER_LEARN", st.switch(), True,
                   "local: launchers import the libraries agents imported lazily, once, for the next agents"),
        st.Setting("--launcher-warm-clients", "AGL_CONTROLLER_LAUNCHER_WARM_CLIENTS", st.switch(), True,
                   "local: launchers make one call through the agent's HTTP client libraries (OpenAI SDK, httpx) to a "
                   "loopback stand-in before forking agents, so that no agent pays for their first call"),
        st.Setting("--launcher-idle", "AGL_CONTROLLER_LAUNCHER_IDLE", _S, 600.0,
                   "local: seconds without a rollout that stop a launcher", name="launcher_idle_s"),
        st.Setting("--agent-sandbox", "AGL_CONTROLLER_AGENT_SANDBOX", st.choice(*SANDBOX_MODES), AUTO,
                   "local: contain agents (own PID and mount namespaces, no capabilities, the controller's files "
                   "hidden): auto where the host allows it (else one warning), on (else the controller does not "
                   "start), off"),
        st.Setting("--agent-user", "AGL_CONTROLLER_AGENT_USER", st.custom("NAME, UID or UID:GID", _agent_user),
                   None, "local: contained agents run as this user (the controller must be root; the "
                   "interpreter must be readable by it)",
                   shown="the controller's uid, without capabilities"),
        st.Setting("--agent-hide", "AGL_CONTROLLER_AGENT_HIDE", _NAMES, (),
                   "local: more paths hidden from contained agents, e.g. the ledger's data directory (the log "
                   "directory and the key file always are)"),
        st.Setting("--kubeconfig", "AGL_KUBECONFIG", st.text(), "", "k8s: the kubeconfig file",
                   shown="in-cluster, else ~/.kube/config"),
        st.Setting("--namespace", "AGL_CONTROLLER_NAMESPACE", st.text(nonempty=True), "default",
                   "k8s: the namespace of the Jobs"),
        st.Setting("--max-jobs-per-minute", "AGL_CONTROLLER_MAX_JOBS_PER_MINUTE", st.number(0.0), 120.0,
                   "k8s: 0 is unlimited"),
        st.Setting("--job-burst", "AGL_CONTROLLER_JOB_BURST", st.integer(1), 10,
                   "k8s: Jobs created back to back at most"),
        st.Setting("--job-ttl", "AGL_CONTROLLER_JOB_TTL", st.integer(0), 600,
                   "k8s: seconds (ttlSecondsAfterFinished)", name="job_ttl_s"),
        st.Setting("--reconcile-interval", "AGL_CONTROLLER_RECONCILE_INTERVAL", _S, 30.0,
                   "k8s: seconds between full re-lists of Jobs", name="reconcile_interval_s"),
        st.Setting("--template-timeout", "AGL_CONTROLLER_TEMPLATE_TIMEOUT", _S, 5.0,
                   "k8s: seconds to render one Job template", name="template_timeout_s"),
        st.Setting("--template-memory-mb", "AGL_CONTROLLER_TEMPLATE_MEMORY_MB", st.integer(128), 1024,
                   "k8s: MiB of address space of a render worker"),
        st.Setting("--template-max-bytes", "AGL_CONTROLLER_TEMPLATE_MAX_BYTES", st.integer(1024), 1 << 20,
                   "k8s: UTF-8 bytes of rendered template at most (the Job as JSON: twice that)"),
        st.Setting("--template-workers", "AGL_CONTROLLER_TEMPLATE_WORKERS", st.integer(1, 64), 2,
                   "k8s: render worker processes in each lane (fast and slow)"),
        st.Setting("--template-quick-limit", "AGL_CONTROLLER_TEMPLATE_QUICK_LIMIT", _S, 0.25,
                   "k8s: seconds a render may take in the fast lane; a longer one is rendered again in the slow lane "
                   "(within --template-timeout), so slow templates hold up only each other",
                   name="template_quick_limit_s"),
    ],
)  # fmt: skip


def load_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> ControllerConfig:
    env = os.environ if env is None else env
    v = SETTINGS.parse(argv, env)
    if v["agent_user"] is not None and v["agent_sandbox"] == "off":
        SETTINGS.fail("--agent-user needs the sandbox: drop --agent-sandbox off")
    key = v.pop("key")
    key_file = v.pop("key_file")
    if key_file:
        if key:
            SETTINGS.fail("--key and --key-file are both set (--key or AGL_KEY, --key-file or AGL_KEY_FILE): use one")
        key = read_key_file(key_file)
    agent_ca = v.pop("agent_ca")
    v.update(
        agent_url=v["agent_url"] or v["proxy_url"],
        label_selector=dict(v["label_selector"]),
        log_level=v["log_level"].upper(),
        template_memory_bytes=v.pop("template_memory_mb") << 20,
    )
    return ControllerConfig(
        **v,
        key=key,
        key_file=os.path.abspath(key_file) if key_file else "",
        agent_base_env=agent_ca_env({k: val for k, val in env.items() if not k.startswith("AGL_")}, agent_ca),
    )


def read_key_file(path: str) -> str:
    """The master key from its file (one line; surrounding whitespace dropped). Exits with the reason if unusable."""
    try:
        with open(path, encoding="utf-8") as handle:
            key = handle.read().strip()
    except (OSError, UnicodeDecodeError) as err:
        SETTINGS.fail(f"--key-file {path}: cannot read it: {err}")
    if not key:
        SETTINGS.fail(f"--key-file {path} is empty")
    if "\n" in key:
        SETTINGS.fail(f"--key-file {path} holds more than one line")
    return key
