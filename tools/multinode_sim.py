"""Multi-node training, simulated on one machine: a two-node Ray cluster (a head and a second raylet joined with
`ray start --address`, each with its own resources, ports and temp dir), the CPU trainer submitted to it with
`ray job submit` as `trainer.nnodes=2`, so that verl places one actor rank on each node and FSDP2 runs over gloo
between them. The trainer talks to the ledger, controller and engine given in its overrides, as on one node.

    python tools/multinode_sim.py [--ranks-per-node 1] [--working-dir DIR] [--report FILE] -- \\
        agl.ledger_address=127.0.0.1:50051 agl.key=$AGL_KEY agl.launch.agent_class=pkg.mod:Agent \\
        actor_rollout_ref.model.path=/abs/model data.train_files=/abs/tasks.jsonl ...

The overrides go to `agl-trainer` after `placement=cpu trainer.nnodes=2 trainer.n_gpus_per_node=N`. When the job
ends, Ray's state API says on which node each training rank ran; the report (printed, and written as JSON with
--report) names them. Exit code 0 only when the job succeeded and every node held a rank.

Nothing here is shared with another Ray on the machine: the temp dirs are this run's own (so `ray.init()`
elsewhere never finds this cluster through /tmp/ray), every port is a free one, and the cluster is stopped
through the processes this tool started, never with `ray stop` (which stops every Ray on the machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RAY = BIN / "ray"
TRAINER = BIN / "agl-trainer"

# The custom resource each node declares (one unit): what tells the nodes apart in the report, and what a job
# can ask for to land a task on one of them.
HEAD, WORKER = "agl_node_head", "agl_node_worker"
# CPUs of one training rank's placement bundle and of the task runner (services/trainer/runner.py: CPUS_PER_RANK,
# TASK_RUNNER_CPUS), plus one spare on the head for the job's own helpers.
CPUS_PER_RANK, HEAD_EXTRA_CPUS = 3, 2
# Tries to start each node (see start_until_up).
NODE_START_TRIES = 3
OBJECT_STORE_BYTES = 256 * 1024**2


class SimulationError(RuntimeError):
    """The cluster did not come up, or the job could not be submitted or inspected."""


class NodeExited(SimulationError):
    """`ray start` of a node exited while the node was starting."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RayNode:
    name: str  # its custom resource, HEAD or WORKER
    temp_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]

    def log_tail(self, lines: int = 40) -> str:
        """The end of `ray start`'s output, then of Ray's own GCS and raylet logs of the node's latest session:
        `ray start` only says that the node timed out, those say why."""
        parts = [_tail(self.log_path, lines)]
        session_logs = self.temp_dir / "session_latest" / "logs"
        for name in ("gcs_server.err", "gcs_server.out", "raylet.err", "raylet.out"):
            tail = _tail(session_logs / name, 10)
            if tail:
                parts.append(f"[{name}]\n{tail}")
        return "\n".join(part for part in parts if part)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Cluster:
    gcs_address: str
    dashboard_url: str
    nodes: list[RayNode]


def node_argv(resource: str, *, gpus: int, cpus: int, temp_dir: Path, head_gcs: str | None = None) -> list[str]:
    """`ray start` for one node on loopback: the head when head_gcs is None, else a raylet joining it. Every port a
    second raylet on the same host would otherwise share with the first is a free one; workers bind random ports."""
    argv = [str(RAY), "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
    argv += [f"--temp-dir={temp_dir}", f"--node-name={resource}"]
    argv += [f"--num-cpus={cpus}", f"--num-gpus={gpus}", "--resources=" + json.dumps({resource: 1})]
    argv += [f"--object-store-memory={OBJECT_STORE_BYTES}", "--min-worker-port=0", "--max-worker-port=0"]
    for flag in (
        "node-manager-port",
        "object-manager-port",
        "metrics-export-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
    ):
        argv.append(f"--{flag}={free_port()}")
    if head_gcs is None:
        argv += ["--head", "--dashboard-host=127.0.0.1"]
        argv += [f"--ray-client-server-port={free_port()}"]
    else:
        argv.append(f"--address={head_gcs}")
    return argv


def ray_environment(extra: Mapping[str, str] = ()) -> dict[str, str]:
    """The raylets' environment (their workers and the job's entry point inherit it): this checkout first on the
    path, no RAY_ADDRESS or AGL_* of the caller's, and Ray's token authentication off.

    Why off: Ray turns token auth on for `ray start` whenever ~/.ray/auth_token exists, and any earlier local
    `ray.init()` on the machine writes that file; the nodes then refuse the state API calls of a process that has
    no token loaded ("Missing authentication token"). Whether this loopback-only cluster authenticates must not
    depend on what ran before it, so it is said explicitly."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("AGL_")}
    env["RAY_AUTH_MODE"] = "disabled"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _start(argv: list[str], name: str, temp_dir: Path, logs: Path, env: Mapping[str, str]) -> RayNode:
    log_path = logs / f"ray-{name}.log"
    with open(log_path, "wb") as log_file:
        # Its own session: the node's processes are stopped as one group, and nothing else is.
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True)
    return RayNode(name, temp_dir, log_path, proc)


def _stop(node: RayNode, timeout_s: float = 30.0) -> None:
    """SIGTERM to `ray start --block` (it stops the node's processes), then whatever is left of its group."""
    if node.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            node.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(node.proc.pid, signal.SIGKILL)
    node.proc.wait()


def alive_nodes(dashboard_url: str) -> list[Any]:
    """The cluster's live nodes, from Ray's state API (over the dashboard's HTTP; no ray.init here)."""
    from ray.util.state import list_nodes

    nodes = list_nodes(address=dashboard_url, detail=True, raise_on_missing_output=False)
    return [node for node in nodes if node.state == "ALIVE"]


def _wait_nodes(cluster: Cluster, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if _INTERRUPTED.is_set():
            raise KeyboardInterrupt
        for node in cluster.nodes:
            if node.proc.poll() is not None:
                code = node.proc.returncode
                raise NodeExited(f"`ray start` of {node.name} exited with {code}:\n{node.log_tail()}")
        try:
            if len(alive_nodes(cluster.dashboard_url)) >= count:
                return
        except Exception as err:  # the dashboard is not up yet; any failure is retried until the deadline
            last = str(err)
        time.sleep(1.0)
    tails = "\n".join(f"--- {n.name} ---\n{n.log_tail()}" for n in cluster.nodes)
    raise SimulationError(f"the cluster did not show {count} live nodes in {timeout_s:.0f}s ({last})\n{tails}")


def start_until_up(
    cluster: Cluster,
    name: str,
    argv_for: Callable[[], list[str]],
    temp_dir: Path,
    logs: Path,
    env: Mapping[str, str],
    timeout_s: float,
) -> None:
    """Starts one node and waits until the cluster shows it live. A `ray start` that exits while starting is tried
    again, with ports picked afresh by `argv_for`: a port found free may be taken by the time Ray binds it (the
    machine's other loopback clients draw their ports from the same range), and `ray start` gives a GCS or raylet
    that is slow to come up a fixed 30 s before it exits. Each failed try is reported on stderr with Ray's logs."""
    for attempt in range(1, NODE_START_TRIES + 1):
        node = _start(argv_for(), name, temp_dir, logs, env)
        cluster.nodes.append(node)
        try:
            _wait_nodes(cluster, len(cluster.nodes), timeout_s)
            return
        except NodeExited as err:
            cluster.nodes.remove(node)
            _stop(node)
            if attempt == NODE_START_TRIES:
                raise NodeExited(f"{err}\n(the last of {NODE_START_TRIES} tries)") from None
            print(f"multinode_sim: {err}\nmultinode_sim: starting {name} again, with fresh ports", file=sys.stderr)


@contextlib.contextmanager
def two_node_cluster(
    logs: Path,
    *,
    ranks_per_node: int = 1,
    head_gpus: int | None = None,
    env: Mapping[str, str] = (),
    start_timeout_s: float = 180.0,
) -> Iterator[Cluster]:
    """A head and one more raylet on this machine, each with `ranks_per_node` logical GPUs (one per CPU training
    rank) and the CPUs those ranks' bundles take (the head a few more: the task runner and the job's helpers).
    `head_gpus` gives the head another GPU count (0: a CPU-only head with GPU workers, as on many clusters)."""
    logs.mkdir(parents=True, exist_ok=True)
    # Short and private: Ray's socket paths live under it (Unix sockets allow ~107 bytes).
    root = Path(tempfile.mkdtemp(prefix="agl-ray-"))
    environment = ray_environment(env)
    cluster = Cluster("", "", [])

    def head_argv() -> list[str]:  # the GCS and dashboard ports too are picked afresh on each try
        gcs_port, dashboard_port = free_port(), free_port()
        cluster.gcs_address = f"127.0.0.1:{gcs_port}"
        cluster.dashboard_url = f"http://127.0.0.1:{dashboard_port}"
        argv = node_argv(
            HEAD,
            gpus=ranks_per_node if head_gpus is None else head_gpus,
            cpus=CPUS_PER_RANK * ranks_per_node + HEAD_EXTRA_CPUS,
            temp_dir=root / "head",
        )
        return [*argv, f"--port={gcs_port}", f"--dashboard-port={dashboard_port}"]

    def worker_argv() -> list[str]:
        cpus = CPUS_PER_RANK * ranks_per_node
        return node_argv(WORKER, gpus=ranks_per_node, cpus=cpus, temp_dir=root / "worker", head_gcs=cluster.gcs_address)

    try:
        start_until_up(cluster, HEAD, head_argv, root / "head", logs, environment, start_timeout_s)
        start_until_up(cluster, WORKER, worker_argv, root / "worker", logs, environment, start_timeout_s)
        yield cluster
    finally:
        # The joined raylet first: the head going first would leave it retrying a GCS that is gone.
        for node in reversed(cluster.nodes):
            _stop(node)
        shutil.rmtree(root, ignore_errors=True)


# -- the job ------------------------------------------------------------------------------------------------


def trainer_argv(overrides: Sequence[str], ranks_per_node: int) -> list[str]:
    """`agl-trainer` on CPU over both nodes; the caller's overrides come last and win."""
    return [str(TRAINER), "placement=cpu", "trainer.nnodes=2", f"trainer.n_gpus_per_node={ranks_per_node}", *overrides]


def submit(
    cluster: Cluster,
    submission_id: str,
    entrypoint: Sequence[str],
    *,
    working_dir: Path | None = None,
    env_vars: Mapping[str, str] = (),
    timeout_s: float = 1800.0,
) -> subprocess.CompletedProcess[str]:
    """`ray job submit` to the head's dashboard, waiting for the job to end (its output is the job's log)."""
    argv = [str(RAY), "job", "submit", "--address", cluster.dashboard_url, "--submission-id", submission_id]
    if working_dir is not None:
        argv += ["--working-dir", str(working_dir)]
    if env_vars:
        argv += ["--runtime-env-json", json.dumps({"env_vars": dict(env_vars)})]
    argv += ["--", *entrypoint]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"  # as the nodes (ray_environment)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)


@dataclass(frozen=True)
class RankPlacement:
    """Where one actor rank of the job ran: its worker-group index (verl's `<prefix><Class>_<node>:<local rank>`
    actor name) and the node that hosted it."""

    actor_name: str
    node_index: int
    local_rank: int
    node: str  # the node's custom resource: HEAD or WORKER
    node_id: str
    pid: int


@dataclass(frozen=True)
class JobReport:
    submission_id: str
    status: str
    ranks: list[RankPlacement]
    task_runner_node: str

    @property
    def nodes_with_a_rank(self) -> set[str]:
        return {rank.node for rank in self.ranks}

    def lines(self) -> list[str]:
        out = [f"job {self.submission_id}: {self.status}"]
        out += [
            f"rank {r.node_index}:{r.local_rank} ({r.actor_name}, pid {r.pid}) ran on {r.node} ({r.node_id[:12]})"
            for r in self.ranks
        ]
        out.append(f"the task runner (the trainer's driver) ran on {self.task_runner_node or 'an unknown node'}")
        return out


def _node_names(dashboard_url: str) -> dict[str, str]:
    from ray.util.state import list_nodes

    names = {}
    for node in list_nodes(address=dashboard_url, detail=True, raise_on_missing_output=False):
        marks = [r for r in (HEAD, WORKER) if (node.resources_total or {}).get(r)]
        names[node.node_id] = marks[0] if marks else node.node_name
    return names


def _holds_a_gpu(resources: Mapping[str, float]) -> bool:
    # A bundle's resources may carry the placement group's suffix (GPU_group_0_<id>).
    return any(name == "GPU" or name.startswith("GPU_group_") for name, amount in resources.items() if amount)


def job_report(cluster: Cluster, submission_id: str) -> JobReport:
    """The job's status and, from Ray's state API, the node of each training rank (the actors holding a logical GPU,
    alive or ended) and of the task runner."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors

    info = JobSubmissionClient(cluster.dashboard_url).get_job_info(submission_id)
    if not info.job_id:
        raise SimulationError(f"job {submission_id} never started a driver ({info.status}: {info.message})")
    nodes = _node_names(cluster.dashboard_url)
    actors = list_actors(
        address=cluster.dashboard_url,
        filters=[("job_id", "=", info.job_id)],
        detail=True,
        limit=10_000,
        raise_on_missing_output=False,
    )
    ranks, runner = [], ""
    for actor in actors:
        if actor.class_name == "AglTaskRunner":
            runner = nodes.get(actor.node_id or "", "")
        if not _holds_a_gpu(actor.required_resources or {}):
            continue
        group, _, local = (actor.name or "").rpartition("_")[2].partition(":")
        ranks.append(
            RankPlacement(
                actor_name=actor.name or actor.class_name,
                node_index=int(group) if group.isdigit() else -1,
                local_rank=int(local) if local.isdigit() else -1,
                node=nodes.get(actor.node_id or "", "?"),
                node_id=actor.node_id or "",
                pid=int(actor.pid or 0),
            )
        )
    ranks.sort(key=lambda r: (r.node_index, r.local_rank))
    status = getattr(info.status, "value", info.status)
    return JobReport(submission_id, str(status), ranks, runner)


def write_report(report: JobReport, path: Path) -> None:
    data = {**asdict(report), "nodes_with_a_rank": sorted(report.nodes_with_a_rank)}
    path.write_text(json.dumps(data, indent=2) + "\n")


# -- the command --------------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run the CPU trainer as a Ray job over a two-node Ray cluster simulated on this machine.",
        epilog="Everything after -- goes to agl-trainer (after placement=cpu trainer.nnodes=2 ...).",
    )
    parser.add_argument("--ranks-per-node", type=int, default=1, help="CPU training ranks per node (logical GPUs)")
    parser.add_argument("--working-dir", type=Path, default=None, help="shipped as the job's working dir")
    parser.add_argument("--logs", type=Path, default=None, help="the raylets' logs (default: a temporary folder)")
    parser.add_argument("--report", type=Path, default=None, help="also write the placement report here (JSON)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the job may take")
    parser.add_argument("overrides", nargs="*", help="agl-trainer overrides")
    args = parser.parse_args(argv)
    if args.ranks_per_node < 1:
        parser.error(f"--ranks-per-node {args.ranks_per_node}: each node needs at least one rank")
    return args


# Set on Ctrl-C or SIGTERM: Ray's state API, polled while the nodes start, can swallow the KeyboardInterrupt raised
# inside it, so the wait checks this too.
_INTERRUPTED = threading.Event()


def _interrupt(signum: int, frame: Any) -> None:
    _INTERRUPTED.set()
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    # SIGTERM unwinds like Ctrl-C, so that the nodes (each in its own session, out of reach of a signal to this
    # process group) are stopped by two_node_cluster's exit instead of left running.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="agl-multinode-logs-"))
    submission_id = f"agl-multinode-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    try:
        with two_node_cluster(logs, ranks_per_node=args.ranks_per_node) as cluster:
            print(f"cluster: head {cluster.gcs_address}, dashboard {cluster.dashboard_url}, 2 nodes; logs in {logs}")
            sys.stdout.flush()
            entrypoint = trainer_argv(args.overrides, args.ranks_per_node)
            proc = submit(cluster, submission_id, entrypoint, working_dir=args.working_dir, timeout_s=args.timeout)
            sys.stdout.write(proc.stdout + proc.stderr)
            report = job_report(cluster, submission_id)
    except SimulationError as err:
        print(f"multinode_sim: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the cluster was stopped on the way out (two_node_cluster)
        print("multinode_sim: interrupted; the cluster is stopped", file=sys.stderr)
        return 130
    for line in report.lines():
        print(line)
    print(f"wall time: {time.monotonic() - started:.0f}s")
    if args.report:
        write_report(report, args.report)
    missing = {HEAD, WORKER} - report.nodes_with_a_rank
    if missing:
        print(f"FAIL: no training rank ran on {', '.join(sorted(missing))}", file=sys.stderr)
    return 0 if report.status == "SUCCEEDED" and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
