"""The warm launcher: `python -m services.controller.local.fork_server --module M ...`, one process per agent module.

It imports the agent's module (and its heavy dependencies) once, then forks one child per rollout on the
controller's request. Guarantees kept for every child:

- the launcher has exactly one thread and no event loop when it forks (checked after the imports; a launcher
  that finds more threads says so in its `ready` message and the controller never asks it to fork);
- the child is the leader of a new session and process group, its stdin is /dev/null, its stdout and stderr
  go to the rollout's log file (created 0600), and os.environ is replaced by the rollout's environment before any
  agent code runs in it; a child dies (SIGKILL) when the launcher dies;
- with --sandbox (the controller's --agent-sandbox), the agent is contained before any of its code runs (its own
  PID and mount namespaces, no capabilities, the controller's files hidden; see sandbox.py). A root launcher forks
  the child straight into a new PID namespace whose init is a `cat` it started (sandbox.NamespaceFork), and the
  child enters its own mount namespace (sandbox.enter); once the child is reaped, the launcher ends the init, and
  the kernel the rest of the namespace. Otherwise the child calls sandbox.contain() and stays outside as the
  relay. The agent writes a returned reward through a file descriptor opened before, since the log directory is
  hidden from it;
- when a child exits, whatever is left of its process group is killed before the child is reaped, so the
  group id cannot be reused while it is signalled; the exit code is reported once.

Wire protocol: one JSON object per line over the control socket (fd --control-fd). Controller -> launcher:
`{"op": "launch", "id", "spec", "env", "log", "header", "result"}` (result: the file for a number run() returns),
`{"op": "signal", "id", "sig"}`. Launcher -> controller: `{"ev": "ready", "pid", "files", "threads", "error"}`,
`{"ev": "started", "id", "pid"}`, `{"ev": "refused", "id", "reason"}` (nothing was forked),
`{"ev": "exited", "id", "code"}` (negative: the signal). The child tells the controller that the agent's code
runs with one datagram on --notify-fd.
End of file on the control socket: the launcher kills its children's groups and exits.

The guarantees above hold across the launcher's loop and the child's set-up, both of one ForkServer's state (its
children, its control socket), and are checked in one place.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import json
import logging
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core import agent_runner
from ..core.agent_runner import notify_running, run_agent_in_child
from . import sandbox
from .agent_code import learned_modules, local_files
from .client_warmup import warm_http_clients

log = logging.getLogger("services.controller.local.fork_server")

_PR_SET_PDEATHSIG = 1
# A line written to a pipe in one write() of at most PIPE_BUF bytes is never interleaved with another's.
_PIPE_BUF = 4096


@dataclass
class Launch:
    launch_id: str
    spec: str
    env: dict[str, str]
    log: str
    header: str
    result: str = ""


def _parent_death_signal() -> Callable[[], None]:
    """A function that makes the calling process get SIGKILL when its parent dies (Linux), else a no-op."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return lambda: None
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def thread_count() -> int:
    """Threads of this process as the kernel sees them (C threads included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


class ForkServer:
    """The launcher's single-threaded loop: control messages in, children forked and reaped, events out."""

    def __init__(
        self,
        control: socket.socket,
        notify_fd: int,
        module: str,
        preload: list[str],
        learn: bool,
        warm_clients: bool = True,
        policy: sandbox.Policy | None = None,
    ) -> None:
        self._control = control
        self._policy = policy
        # As root, children are forked straight into their own PID namespace (no relay process); else contain().
        self._ns_fork = sandbox.NamespaceFork.available() if policy is not None else None
        # child pid -> (its namespace's init, the write end of the init's pipe) (NamespaceFork)
        self._inits: dict[int, tuple[int, int]] = {}
        self._notify_fd = notify_fd
        self._module = module
        self._preload = preload
        self._learn = learn
        self._warm_clients = warm_clients
        self._children: dict[int, str] = {}
        self._inbox = b""
        self._outbox: list[bytes] = []
        self._learned: set[str] = set()
        self._tried: set[str] = set()
        self._refuse = ""  # set when forking became unsafe: every launch is refused with this reason
        self._pid = os.getpid()
        self._set_pdeathsig = _parent_death_signal()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._learn_r, self._learn_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()

    # -- start-up ---------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Imports the agent's module and the preloads; reports what it watched and whether forking is safe."""
        error = ""
        for name in [*self._preload, self._module]:
            try:
                importlib.import_module(name)
            except BaseException as err:  # the child will try again and report it in the rollout's log
                if name == self._module:
                    error = f"{type(err).__name__}: {err}"
                log.warning("cannot import %s: %s: %s", name, type(err).__name__, err)
        self._warm_libraries(self._warm_clients)
        threads = thread_count()
        if threads > 1:
            self._refuse = f"the agent's module started {threads - 1} thread(s) at import; forking is unsafe"
            log.warning("%s", self._refuse)
        files = local_files()
        import gc

        gc.collect()
        gc.freeze()  # children do not copy pages the collector would otherwise touch
        self._send({"ev": "ready", "pid": self._pid, "files": files, "threads": threads, "error": error})
        self._flush()

    @staticmethod
    def _warm_libraries(warm_clients: bool) -> None:
        """Fills process-wide standard-library caches that no rollout can change, which each child would redo.

        OpenSSL's one-time initialisation, platform.uname().processor (which runs `uname -p` in a
        subprocess the first time; the OpenAI SDK asks for it on every client's first request), and the
        first-call paths of the HTTP client libraries the agent imported (client_warmup.py), unless the controller
        says --no-launcher-warm-clients.
        """
        with contextlib.suppress(Exception):
            import ssl

            ssl.create_default_context()
        with contextlib.suppress(Exception):
            import platform

            _ = platform.uname().processor
        if warm_clients:
            with contextlib.suppress(Exception):
                warm_http_clients()

    # -- main loop ---------------------------------------------------------------------------------------------

    def serve(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self._control.setblocking(False)
        self._selector.register(self._control, selectors.EVENT_READ, "control")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._selector.register(self._learn_r, selectors.EVENT_READ, "learn")
        while True:
            ready = self._selector.select(timeout=None if not self._learned else 0)
            if not ready and self._learned:
                self._import_learned()
            for key, _ in ready:
                if key.data == "control" and not self._read_control():
                    self._stop()
                    return
                if key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                if key.data == "learn":
                    self._read_learned()
            self._reap()
            self._flush()

    def _read_control(self) -> bool:
        try:
            data = self._control.recv(1 << 16)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        self._inbox += data
        while b"\n" in self._inbox:
            line, _, self._inbox = self._inbox.partition(b"\n")
            self._dispatch(json.loads(line))
        return True

    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "launch":
            fields = (message["id"], message["spec"], message["env"], message["log"], message["header"])
            launch = Launch(*fields, result=message.get("result", ""))
            self._launch(launch)
        elif op == "signal":
            self._signal(message["id"], int(message["sig"]))
        else:
            log.warning("unknown control message %r", op)

    def _launch(self, launch: Launch) -> None:
        if self._refuse:
            self._send({"ev": "refused", "id": launch.launch_id, "reason": self._refuse})
            return
        self._flush()
        sys.stdout.flush()
        sys.stderr.flush()
        init = init_pipe = -1
        try:
            if self._ns_fork is not None:
                pid, init, init_pipe = self._ns_fork.fork()
            else:
                pid = os.fork()
        except OSError as err:
            self._send({"ev": "refused", "id": launch.launch_id, "reason": f"fork failed: {err}"})
            return
        if pid == 0:
            self._child(launch, init_pipe)  # never returns
        self._children[pid] = launch.launch_id
        if init > 0:
            self._inits[pid] = (init, init_pipe)
        self._send({"ev": "started", "id": launch.launch_id, "pid": pid})

    def _signal(self, launch_id: str, signum: int) -> None:
        for pid, child_id in self._children.items():
            if child_id == launch_id:
                try:
                    os.killpg(pid, signum)
                except ProcessLookupError:  # not yet the leader of its own group
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signum)
                return

    def _reap(self) -> None:
        while self._children:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            # The unreaped leader keeps its group id from being reused: whatever it left behind dies now.
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            self._end_namespace(pid)
            launch_id = self._children.pop(pid, None)
            if launch_id:  # not an init (""), nor a child of no launch
                self._send({"ev": "exited", "id": launch_id, "code": os.waitstatus_to_exitcode(status)})

    def _end_namespace(self, pid: int) -> None:
        """The child was reaped: its namespace's init (if it has one) is killed, and the kernel kills the rest.
        The init is reaped with the next children (waitid above), as a child with no launch."""
        init, init_pipe = self._inits.pop(pid, (-1, -1))
        if init > 0:
            os.close(init_pipe)
            with contextlib.suppress(OSError):
                os.kill(init, signal.SIGKILL)
            self._children[init] = ""

    def _stop(self) -> None:
        """The controller is gone: no rollout of ours outlives it."""
        for pid in list(self._children):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for init, _ in self._inits.values():
            with contextlib.suppress(OSError):
                os.kill(init, signal.SIGKILL)
        for pid in [*self._children, *(init for init, _ in self._inits.values())]:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self._children.clear()
        self._inits.clear()

    # -- learned imports ---------------------------------------------------------------------------------------

    def _read_learned(self) -> None:
        try:
            data = os.read(self._learn_r, 1 << 16)
        except BlockingIOError:
            return
        for name in data.decode(errors="replace").split():
            if name not in self._tried and name not in sys.modules:
                self._learned.add(name)

    def _import_learned(self) -> None:
        """Imports library modules agents imported lazily, while no request waits, so later children find them."""
        names, self._learned = sorted(self._learned), set()
        before = set(sys.modules)
        for name in names:
            self._tried.add(name)
            with contextlib.suppress(BaseException):
                importlib.import_module(name)
        threads = thread_count()
        if threads > 1 and not self._refuse:
            self._refuse = f"a module agents import lazily started {threads - 1} thread(s); forking is unsafe"
            log.warning("%s", self._refuse)
        import gc

        gc.freeze()
        log.info("preloaded %d module(s) agents imported lazily", len(set(sys.modules) - before))

    # -- output ------------------------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        self._outbox.append(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def _flush(self) -> None:
        if not self._outbox:
            return
        data = b"".join(self._outbox)
        self._outbox.clear()
        self._control.setblocking(True)
        try:
            self._control.sendall(data)
        except OSError as err:
            if err.errno not in (errno.EPIPE, errno.ECONNRESET):
                raise
        finally:
            self._control.setblocking(False)

    # -- the child ---------------------------------------------------------------------------------------------

    def _child(self, launch: Launch, init_pipe: int = -1) -> None:
        """Runs in the forked child: isolate, redirect, replace the environment, run the agent, exit.

        init_pipe >= 0: the child was forked into its own PID namespace (NamespaceFork), not as its init."""
        code = 127
        try:
            os.setsid()
            self._set_pdeathsig()
            # The launcher died before the death signal was armed (in a new namespace the parent's pid reads 0).
            if sandbox.NamespaceFork.parent_gone(init_pipe) if init_pipe >= 0 else os.getppid() != self._pid:
                os._exit(code)
            for _, fd in self._inits.values():  # the other namespaces' init pipes: theirs to end, not ours
                os.close(fd)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self._selector.close()
            self._control.close()
            for fd in (self._wake_r, self._wake_w, self._learn_r):
                os.close(fd)
            out = os.open(launch.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(out, launch.header.encode(errors="replace"))
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(null)
            os.close(out)
            result: str | int = ""
            if launch.result:
                result = os.open(launch.result, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            if self._ns_fork is not None and self._policy is not None:
                sandbox.enter(self._policy)
            elif self._policy is not None:
                sandbox.contain(self._policy)  # returns in the contained agent's process
            os.environ.clear()
            os.environ.update(launch.env)
            sys.argv = [agent_runner.__file__, launch.spec]  # as `python -m ...agent_runner spec` has it
            logging.root.handlers.clear()
            logging.root.setLevel(logging.WARNING)
            before = set(sys.modules)
            notify = lambda: notify_running(self._notify_fd, launch.launch_id)  # noqa: E731
            code = run_agent_in_child(launch.spec, notify, result)
            if self._learn:
                self._report_learned(learned_modules(before))
        except BaseException:
            with contextlib.suppress(BaseException):
                import traceback

                traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def _report_learned(self, names: list[str]) -> None:
        line = ""
        for name in names:
            if len(line) + len(name) + 2 > _PIPE_BUF:
                self._write_learned(line)
                line = ""
            line += name + " "
        if line:
            self._write_learned(line)

    def _write_learned(self, line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self._learn_w, (line.rstrip() + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agl-launcher", description=__doc__.splitlines()[0])
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--notify-fd", type=int, required=True)
    parser.add_argument("--module", required=True, help="the agent's module, imported once")
    parser.add_argument("--preload", default="", help="more modules to import once, comma-separated")
    parser.add_argument("--no-learn", action="store_true", help="do not preload modules agents import lazily")
    parser.add_argument("--no-warm-clients", action="store_true", help="no warm-up call through the HTTP clients")
    parser.add_argument(
        "--sandbox", action="store_true", help="contain every child (services.controller.local.sandbox)"
    )
    parser.add_argument("--sandbox-hide", action="append", default=[], help="a path hidden from the children")
    parser.add_argument("--sandbox-uid", type=int, default=None, help="the uid the children run as")
    parser.add_argument("--sandbox-gid", type=int, default=None, help="the gid the children run as")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    policy = sandbox.Policy(tuple(args.sandbox_hide), args.sandbox_uid, args.sandbox_gid) if args.sandbox else None
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s launcher: %(message)s")
    os.set_inheritable(args.notify_fd, False)  # forked children inherit it; programs they exec do not
    control = socket.socket(fileno=args.control_fd)
    control.set_inheritable(False)
    preload = [name.strip() for name in args.preload.split(",") if name.strip()]
    server = ForkServer(
        control,
        args.notify_fd,
        args.module,
        preload,
        learn=not args.no_learn,
        warm_clients=not args.no_warm_clients,
        policy=policy,
    )
    started = time.process_time()
    server.prepare()
    log.info("imported %s in %.2f s of CPU; serving (pid %d)", args.module, time.process_time() - started, os.getpid())
    server.serve()
    log.info("controller gone; launcher exits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
