"""Contains one local agent: its own PID and mount namespaces, no capabilities, the services out of sight.

contain(policy), called in a process about to become an agent (a warm launcher's child, or this file run as
`python -I -S sandbox.py POLICY -- ARGV...` for a fresh interpreter or a command), returns in the agent's process
and guarantees, on Linux:

- the agent runs in a new PID namespace whose init is a small reaper of ours: it sees no process outside it
  (not the controller, the launcher, the ledger, the proxy, nor another rollout's agent), so it cannot read their
  /proc entries (environment, command line, memory), signal them or trace them;
- when the agent's own process ends, or the init is killed, the kernel kills everything left in the namespace, so
  nothing the agent started (with `setsid`, a double fork, anything) outlives its rollout;
- a fresh /proc shows that namespace only; the paths in `policy.hide` (the controller's log directory, its key
  file, more named by the operator) are covered with an empty read-only tmpfs (a directory) or /dev/null (a file)
  in the agent's own mount namespace, whose mounts do not propagate back to the host;
- the agent has no capabilities (bounding set emptied, `no_new_privs`), so it can neither undo those mounts nor gain
  privileges through a setuid program; with `policy.user` it also runs as that uid and gid, without supplementary
  groups.

A root warm launcher skips the relay and the copy of itself as init: NamespaceFork starts a `cat` as the new
namespace's init and forks the agent into it as the launcher's own child, which calls enter() (see NamespaceFork).
As root the agent's pid in its namespace is also its pid on the host (clone3 with set_tid).

The process that calls contain() stays outside as the relay the launcher or the controller knows: it forwards
SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the init, which passes them on to every process of the
namespace, and it ends the way the agent's process ended (its exit code, or killed by the same signal). When the
relay dies (SIGKILL to its group), the init gets SIGKILL from the kernel, and the namespace with it.

A controller that is not root creates a user namespace first (its own uid and gid mapped, nothing more), which
Linux allows when unprivileged user namespaces are enabled. Standard library only: a fresh launch runs this file
with `-I -S` before the agent's interpreter or command starts.

One module for the same reason: run as a file, it can import no sibling module.
"""

from __future__ import annotations

# The C module: `signal` would import enum, which a fresh launch would pay for.
import _signal as signal
import ctypes
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# The relay's exit code when the namespace could not be set up (the reason is on stderr, in the rollout's log).
SETUP_FAILED = 125


class SandboxError(OSError):
    """The namespaces could not be set up; the message names the step and the kernel's reason."""


class Policy:
    """What to hide from the agent and whom it runs as (a plain class: dataclasses would import inspect)."""

    __slots__ = ("gid", "hide", "uid")

    def __init__(self, hide: tuple[str, ...] = (), uid: int | None = None, gid: int | None = None) -> None:
        self.hide = tuple(hide)
        self.uid = uid
        self.gid = gid if gid is not None or uid is None else uid

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and (self.hide, self.uid, self.gid) == (other.hide, other.uid, other.gid)

    def __hash__(self) -> int:
        return hash((self.hide, self.uid, self.gid))

    def __repr__(self) -> str:
        return f"Policy(hide={self.hide!r}, uid={self.uid!r}, gid={self.gid!r})"

    def args(self, prefix: str = "--") -> list[str]:
        """The policy as this file's options (prefix "--sandbox-": the warm launcher's)."""
        args = [arg for path in self.hide for arg in (f"{prefix}hide", path)]
        if self.uid is not None:
            args += [f"{prefix}uid", str(self.uid), f"{prefix}gid", str(self.gid)]
        return args


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: None if text is None else os.fsencode(text)  # noqa: E731
    result = _libc().mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data))
    _check(result, f"mount {fstype or source} on {target}")


def _prctl(option: int, arg: int, what: str) -> None:
    _check(_libc().prctl(option, ctypes.c_ulong(arg), 0, 0, 0), what)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    except OSError as err:
        raise SandboxError(err.errno, f"write {path}: {err.strerror}") from err
    finally:
        os.close(fd)


def contain(policy: Policy) -> None:
    """Returns in the contained agent process; the caller's process becomes the relay and never returns.

    Raises SandboxError (in the caller, before anything was forked) when the namespaces cannot be created."""
    uid, gid = os.getuid(), os.getgid()
    if os.geteuid() == 0:
        _check(_libc().unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    else:
        if policy.uid is not None:
            raise SandboxError(1, "running agents as another user needs a controller running as root")
        _check(_libc().unshare(CLONE_NEWUSER | CLONE_NEWPID), "unshare(CLONE_NEWUSER | CLONE_NEWPID)")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    pid_max = _pid_max() if os.geteuid() == 0 else None
    status_r, status_w = os.pipe()
    alive_r, alive_w = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    init = os.fork()
    if init:
        os.close(status_w)
        os.close(alive_r)
        os.write(alive_w, f"{init}\n".encode())  # the init's pid on the host: the agent's is likely the next one
        _relay(init, status_r)
    os.close(status_r)
    os.close(alive_w)
    _init(policy, status_w, alive_r, pid_max)


def _relay(init: int, status_r: int) -> None:
    """Outside the namespace: forwards signals to its init and ends as the agent's process ended."""
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, _frame: _forward(init, signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    _, status = os.waitpid(init, 0)
    os.set_blocking(status_r, False)
    try:
        told = os.read(status_r, 64)
    except BlockingIOError:
        told = b""
    if told:  # the init saw the agent's process end: end the same way
        status = int(told)
    _end_like(status)


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return


def _end_like(status: int) -> None:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the agent dumped core (or not); the relay does not
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else SETUP_FAILED)


def _init(policy: Policy, status_w: int, alive_r: int, pid_max: int | None) -> None:
    """The relay's child, PID 1 of the new namespace."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "prctl(PR_SET_PDEATHSIG)")
        told = os.read(alive_r, 32)  # the relay's word (our pid on the host), or end of file: it died before the
        if not told:  # death signal was armed
            os._exit(SETUP_FAILED)
        os.close(alive_r)
        os.setsid()  # out of the relay's process group: a signal to the group reaches us once, through the relay
    except BaseException as err:
        sys.stderr.write(f"agl sandbox: cannot contain the agent: {err}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED)
    become_init(policy, status_w, (int(told), pid_max) if pid_max is not None else None)


def become_init(policy: Policy, status_w: int, host_pid: tuple[int, int] | None) -> None:
    """In PID 1 of a new namespace (FORWARDED signals blocked): mounts /proc and the hiding mounts, forks the agent,
    then reaps and passes signals on until the agent's process ends, writes its wait status to status_w and exits
    (the kernel kills whatever is left). Returns in the agent's process only, in its own session, without
    capabilities. host_pid: (this init's pid on the host, pid_max), to give the agent the same pid on both."""
    try:
        # The host's /proc, before ours covers it: which host pids are taken (see _fork_agent). Closed in both
        # processes once the agent is forked: the agent must never hold a way into the host's /proc.
        host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if host_pid is not None else -1
        _mount_views(policy)
        try:
            agent = _fork_agent(host_pid, host_proc)
        finally:
            if host_proc >= 0:
                os.close(host_proc)
    except BaseException as err:
        sys.stderr.write(f"agl sandbox: cannot contain the agent: {err}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED)
    if agent == 0:
        os.close(status_w)
        for signum in FORWARDED:  # as an interpreter starts: SIGINT raises KeyboardInterrupt, the rest kill
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        try:
            os.setsid()  # a signal to the init's group reaches the agent once, passed on by the init
            _drop_privileges(policy)
        except BaseException as err:
            sys.stderr.write(f"agl sandbox: cannot drop the agent's privileges: {err}\n")
            sys.stderr.flush()
            os._exit(SETUP_FAILED)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        return
    for signum in FORWARDED:
        signal.signal(signum, _pass_on)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        if pid == agent:
            os.write(status_w, str(status).encode())
            os._exit(0)  # the kernel kills whatever is left in the namespace


class NamespaceFork:
    """For a root warm launcher: each agent forked straight into a new PID namespace, as the launcher's own child.

    The namespace's init is `cat` reading a pipe whose only write end the launcher holds (posix_spawn: no copy of
    the launcher's address space): it ends when the launcher closes that end (the agent was reaped) or dies, and
    the kernel then kills whatever is left in the namespace. The agent, forked next into the same namespace, sets
    up its own mount namespace and drops its capabilities (enter()), so it is contained as by contain(), with its
    wait status the launcher's to read. An init that is a copy of the launcher (forked, then forking the agent)
    cost the agent's share of the machine about 7 ms of CPU more a rollout (a second copy of the address space,
    its page faults and its exit): the contained calc burst ran at 0.85 of an uncontained one.

    Unlike contain()'s init, `cat` neither passes signals on nor reaps: a signal to the launch reaches the agent's
    process group, and a process the agent orphaned stays a zombie until the agent ends, when the namespace goes."""

    def __init__(self, init_program: str) -> None:
        self._init_program = init_program
        self._own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self._host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._pid_max = _pid_max()

    @classmethod
    def available(cls) -> NamespaceFork | None:
        """One for a root launcher on a host with `cat` where it always is; else None (contain() then)."""
        if os.geteuid() != 0:
            return None
        for folder in ("/usr/bin", "/bin"):
            program = os.path.join(folder, "cat")
            if os.access(program, os.X_OK):
                return cls(program)
        return None

    def fork(self) -> tuple[int, int, int]:
        """In the launcher: (agent pid, init pid, the init pipe's write end: close it, after the agent is reaped,
        to end the namespace). In the child: (0, -1, a read end to hand to parent_gone()). Raises OSError (nothing
        is left running)."""
        init_r, init_w = os.pipe2(os.O_CLOEXEC)
        init = pid = -1
        try:
            _check(_libc().unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
            try:
                actions = [(os.POSIX_SPAWN_DUP2, init_r, 0), (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
                actions += [(os.POSIX_SPAWN_DUP2, 1, 2)]
                actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds() if fd > 2]
                init = os.posix_spawn(self._init_program, [self._init_program], {}, file_actions=actions, setsid=True)
                host = (init, self._pid_max) if self._pid_max is not None else None
                pid = _fork_agent(host, self._host_proc)
            finally:
                if init < 0 or pid != 0:  # the launcher: its next child is in its own namespace again
                    _check(_libc().setns(self._own, CLONE_NEWPID), "setns(own PID namespace)")
        except BaseException:
            os.close(init_w)
            if init > 0:
                os.kill(init, signal.SIGKILL)
                os.waitpid(init, 0)
            os.close(init_r)
            raise
        if pid == 0:
            os.close(init_w)
            os.close(self._own)
            os.close(self._host_proc)
            return 0, -1, init_r
        os.close(init_r)
        return pid, init, init_w

    @staticmethod
    def parent_gone(init_r: int) -> bool:
        """In the child, once its death signal is armed: whether the launcher died before (no one holds the init
        pipe's write end any more). Closes init_r."""
        import select

        poller = select.poll()
        poller.register(init_r, select.POLLIN)
        gone = any(event & select.POLLHUP for _, event in poller.poll(0))
        os.close(init_r)
        return gone


def _inheritable_fds() -> list[int]:
    """The open descriptors an exec would pass on (most are close-on-exec: PEP 446)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.get_inheritable(int(name)):
                found.append(int(name))
        except OSError:  # the directory's own descriptor, closed by now
            continue
    return found


def enter(policy: Policy) -> None:
    """In a process just forked into a new PID namespace that it is not the init of (NamespaceFork): its own mount
    namespace with a fresh /proc and the hiding mounts, then no capabilities. Raises SandboxError."""
    _mount_views(policy)
    _drop_privileges(policy)


def _mount_views(policy: Policy) -> None:
    """A mount namespace of the caller's own: /proc shows its PID namespace only, policy.hide is covered."""
    _check(_libc().unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in policy.hide:
        _hide(path)
    # A working directory in (or under) a hidden one is resolved anew, so it is the empty one. (No
    # contextlib.suppress: its imports would cost a fresh launch ~15 ms.)
    try:  # noqa: SIM105
        os.chdir(os.getcwd())
    except OSError:
        pass


def _pid_max() -> int | None:
    try:
        with open("/proc/sys/kernel/pid_max") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return None


class _CloneArgs(ctypes.Structure):
    # struct clone_args (linux/sched.h): eleven 64-bit fields
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("pidfd", ctypes.c_uint64),
        ("child_tid", ctypes.c_uint64),
        ("parent_tid", ctypes.c_uint64),
        ("exit_signal", ctypes.c_uint64),
        ("stack", ctypes.c_uint64),
        ("stack_size", ctypes.c_uint64),
        ("tls", ctypes.c_uint64),
        ("set_tid", ctypes.c_uint64),
        ("set_tid_size", ctypes.c_uint64),
        ("cgroup", ctypes.c_uint64),
    ]


_SYS_CLONE3 = 435  # the same number on every architecture that has clone3
_SIGCHLD = 17


# Host pids looked at (a stat each) and clones tried, at most, before a plain fork.
_PIDS_LOOKED_AT = 256
_CLONES_TRIED = 4


def _fork_agent(host_pid: tuple[int, int] | None, host_proc: int = -1) -> int:
    """os.fork(), except that where the kernel lets the init choose (a root controller on x86-64 Linux 5.5+: clone3
    with set_tid) the agent's pid in its namespace is also its pid on the host: a pid the agent reports (a pid file, a
    log line) names it on the host too. Its own children's pids are its namespace's only.

    host_pid is (the init's pid on the host, pid_max); host_proc, a directory fd of the host's /proc. The pids after
    the init's are tried, as the kernel would hand them out, skipping those the host's /proc lists: a clone into a
    taken pid is refused only after the whole address space was copied (and then freed). Without that look, a burst
    of launches, whose inits take the next pids first, cost up to nine copies an agent: clone3 was 8% of the
    machine's CPU in a contained calc burst (perf), against 1% for the launcher's own forks."""
    if host_pid is None or os.uname().machine != "x86_64":
        return os.fork()
    candidate, pid_max = host_pid
    python = ctypes.pythonapi
    syscall = ctypes.PyDLL(None, use_errno=True).syscall  # PyDLL: the GIL stays held, as os.fork holds it
    syscall.restype = ctypes.c_long
    tried = 0
    for _ in range(_PIDS_LOOKED_AT):
        if tried >= _CLONES_TRIED:
            break
        candidate = candidate + 1 if candidate + 1 < pid_max else 301  # the kernel's own wrap (RESERVED_PIDS)
        if host_proc >= 0 and _listed(host_proc, candidate):
            continue
        tried += 1
        tids = (ctypes.c_int32 * 2)(candidate, candidate)  # in the new namespace, then on the host
        args = _CloneArgs(exit_signal=_SIGCHLD, set_tid=ctypes.addressof(tids), set_tid_size=2)
        python.PyOS_BeforeFork()
        pid = syscall(ctypes.c_long(_SYS_CLONE3), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
        if pid == 0:
            python.PyOS_AfterFork_Child()
            return 0
        err = ctypes.get_errno()
        python.PyOS_AfterFork_Parent()
        if pid > 0:
            return pid
        if err != 17:  # EEXIST: the host gave that pid away meanwhile; anything else: the kernel will not choose
            break
    return os.fork()


def _listed(proc_fd: int, pid: int) -> bool:
    """Whether the /proc open as proc_fd lists pid (a live process or a zombie: either holds the pid)."""
    try:
        os.stat(str(pid), dir_fd=proc_fd)
    except OSError:
        return False
    return True


def _pass_on(signum: int, _frame: object) -> None:
    """The init's handler: every process of the namespace gets the signal (kill(-1) spares the init itself)."""
    try:
        os.kill(-1, signum)
    except ProcessLookupError:
        return


def _hide(path: str) -> None:
    if os.path.isdir(path):
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=0555")
    elif os.path.exists(path):
        _mount("/dev/null", path, None, MS_BIND)


def _drop_privileges(policy: Policy) -> None:
    """No capabilities, now or after an exec; then the agent's uid and gid when the policy names them."""
    if policy.uid is not None:
        os.setgroups([])
        os.setgid(policy.gid if policy.gid is not None else policy.uid)
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last_cap = int(handle.read())
    for cap in range(last_cap + 1):
        _prctl(PR_CAPBSET_DROP, cap, f"prctl(PR_CAPBSET_DROP, {cap})")
    _check(_libc().prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    _prctl(PR_SET_NO_NEW_PRIVS, 1, "prctl(PR_SET_NO_NEW_PRIVS)")
    if policy.uid is not None:
        os.setuid(policy.uid)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc().capset(header, data), "capset (drop every capability)")


def _which(program: str) -> str:
    """The file exec would run for program (execvp's PATH lookup, without the modules os.execvp imports lazily)."""
    if "/" in program:
        return program
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", program)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return program


def main(argv: list[str] | None = None) -> int:
    """`sandbox.py [--hide PATH]... [--uid N --gid N] -- ARGV...`: ARGV contained; `... --check`: exits 0 once
    contained. (No argparse, no json: a fresh launch pays for every module imported here.)"""
    args = sys.argv[1:] if argv is None else list(argv)
    hide: list[str] = []
    ids: dict[str, int] = {}
    while len(args) >= 2 and args[0] in ("--hide", "--uid", "--gid"):
        option, value, args = args[0], args[1], args[2:]
        if option == "--hide":
            hide.append(value)
        else:
            ids[option[2:]] = int(value)
    if not args or args[0] not in ("--", "--check") or (args[0] == "--" and len(args) < 2):
        sys.stderr.write("usage: sandbox.py [--hide PATH]... [--uid N --gid N] (-- ARGV... | --check)\n")
        return 2
    program = _which(args[1]) if len(args) > 1 else ""  # looked up before the agent's uid may lose the stdlib
    try:
        contain(Policy(tuple(hide), ids.get("uid"), ids.get("gid")))
    except SandboxError as err:
        sys.stderr.write(f"agl sandbox: cannot contain the agent: {err.strerror}\n")
        return SETUP_FAILED
    if args[0] == "--check":
        return 0
    try:
        os.execv(program, args[1:])
    except OSError as err:
        sys.stderr.write(f"agl sandbox: cannot start {args[1]!r}: {err}\n")
    return 127


if __name__ == "__main__":
    sys.exit(main())
