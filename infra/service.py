"""A local service run as a detached child process with a pid file, a log file and readiness checks."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from infra.errors import StackError

_POLL_INTERVAL_S = 0.1


@dataclass(frozen=True)
class ServiceStatus:
    """What ``stack status`` shows for one service."""

    name: str
    state: str
    address: str
    version: str
    pid: int | None = None
    detail: str = ""


def port_in_use(host: str, port: int) -> bool:
    """Whether something already accepts connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` nothing listens on right now (for private stacks in tests and benchmarks)."""
    return free_ports(1, host)[0]


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux's ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


#: Private stacks' ports start here and stay below the ephemeral range.
_LOWEST_PORT = 10_000


def free_ports(count: int, host: str = "127.0.0.1", attempts: int = 1_000) -> list[int]:
    """``count`` different TCP ports on ``host`` nothing listens on right now, below the range the kernel picks
    outgoing connections' ports from: a port of the ephemeral range, free when chosen, was taken by some client's
    connection while its broker was down for a restart (CI: "Address already in use" on `stack up` after a wipe).
    All are held open until all are chosen, so none is handed out twice."""
    rng, top = random.Random(), _ephemeral_low()
    if top - _LOWEST_PORT < 1_000:  # no room below the ephemeral range on this machine: any free port
        top = 0
    sockets: list[socket.socket] = []
    try:
        for _ in range(attempts):
            if len(sockets) == count:
                break
            sock = socket.socket()
            try:
                sock.bind((host, rng.randrange(_LOWEST_PORT, top) if top else 0))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        if len(sockets) < count:
            raise StackError(f"no {count} free ports on {host} below {top}", "stop what holds them, or try again")
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port_block(count: int, host: str = "127.0.0.1", attempts: int = 200) -> int:
    """The first of ``count`` consecutive TCP ports on ``host`` nothing listens on right now (a cluster's nodes on
    ``base + i``); StackError after ``attempts`` tries."""
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(_LOWEST_PORT, _ephemeral_low() - count)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise StackError(f"no {count} consecutive free ports on {host}", "stop what holds them, or try again")


def wait_until(condition, timeout_s: float, interval_s: float = _POLL_INTERVAL_S) -> bool:
    """Poll ``condition()`` until it is true or ``timeout_s`` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a text file (empty if it does not exist)."""
    if not path.exists():
        return []
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 256 * 1024))
        return handle.read().decode(errors="replace").splitlines()[-lines:]


class ManagedService(ABC):
    """A server process the stack starts, watches and stops.

    Subclasses say how to prepare its data, which command runs it, which ports it binds and
    how to tell that it really answers.
    """

    name: str
    #: Part of the service's command line; a pid whose command line lacks it is not ours (pid reused).
    cmdline_marker: str

    def __init__(self, run_dir: Path, log_dir: Path, start_timeout_s: float) -> None:
        self.run_dir = run_dir
        self.log_file = log_dir / f"{self.name}.log"
        self.pid_file = run_dir / f"{self.name}.pid"
        self.start_timeout_s = start_timeout_s

    @property
    @abstractmethod
    def address(self) -> str:
        """Where clients reach the service."""

    @abstractmethod
    def ports(self) -> dict[str, tuple[str, int]]:
        """Every (host, port) the service binds, by purpose, with the setting that changes it."""

    @abstractmethod
    def command(self) -> list[str]:
        """The argv that runs the service in the foreground."""

    @abstractmethod
    def ready(self) -> bool:
        """Whether the service answers a real request (not merely whether its port is open)."""

    @abstractmethod
    def version(self) -> str:
        """The version of the server software."""

    def environment(self) -> dict[str, str] | None:
        """Environment of the service process (default: the caller's)."""
        return None

    def prepare(self) -> None:
        """Create or check the data directory before the first start (default: nothing)."""
        return None

    def wipe(self) -> None:
        """Delete the service's data (default: nothing)."""
        return None

    @property
    def nodes(self) -> tuple[ManagedService, ...]:
        """The processes this service runs as (a cluster of several, such as ``KafkaCluster``, has the same
        ``start``/``stop``/``wipe``/``nodes``): itself."""
        return (self,)

    def pid(self) -> int | None:
        """The pid of our running process, or None (a stale pid file is removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            os.kill(pid, 0)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (ProcessLookupError, FileNotFoundError):
            self.pid_file.unlink(missing_ok=True)
            return None
        if self.cmdline_marker not in cmdline:
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid

    def start(self) -> bool:
        """Start the service unless it already runs; wait until it answers.

        Returns True if a process was started, False if it was already running and ready.
        """
        process = self.launch()
        self.await_ready(process)
        return process is not None

    def launch(self) -> subprocess.Popen | None:
        """Start the process unless ours already runs, without waiting for it to answer (the nodes of a cluster
        answer only once enough of them run): the new process, or None."""
        if self.pid() is not None:
            return None
        for purpose, (host, port) in self.ports().items():
            if port_in_use(host, port):
                raise StackError(
                    f"port {port} ({self.name} {purpose}) on {host} is already used by another process",
                    "stop that process, or choose another port (`loopline config` shows the settings)",
                )
        self.prepare()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.environment(),
            )
        self.pid_file.write_text(str(process.pid))
        return process

    def await_ready(self, process: subprocess.Popen | None) -> None:
        """Wait until the service answers; ``process``: the one ``launch`` started (None: it ran already). A process
        that exits or never answers is stopped and raises StackError naming its log."""
        if process is None:
            if not wait_until(self.ready, self.start_timeout_s):
                raise StackError(
                    f"{self.name} runs (pid {self.pid()}) but does not answer at {self.address}",
                    f"see {self.log_file}, or restart it with `loopline stack down && loopline stack up`",
                )
            return
        if not wait_until(lambda: process.poll() is not None or self.ready(), self.start_timeout_s):
            self.stop()
            last = " | ".join(line.strip() for line in tail(self.log_file, 3))
            raise StackError(
                f"{self.name} did not answer at {self.address} within {self.start_timeout_s:.0f} s; its log ends: {last}",
                f"see {self.log_file}",
            )
        if process.poll() is not None:
            self.pid_file.unlink(missing_ok=True)
            last = " | ".join(line.strip() for line in tail(self.log_file, 3))
            raise StackError(f"{self.name} exited with code {process.returncode}: {last}", f"see {self.log_file}")

    def stop(self, grace_s: float = 30.0) -> bool:
        """Stop the service: SIGTERM, then SIGKILL after ``grace_s`` (0: SIGKILL at once, for a service whose data is
        deleted next, so a clean shutdown buys nothing). Returns False if it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        if grace_s > 0:
            os.kill(pid, signal.SIGTERM)
        if not wait_until(lambda: not _alive(pid), grace_s):
            # The service leads a session of its own (``launch``): its whole group goes, children of a wrapper too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not _alive(pid), 5.0)
        # A killed JVM's main thread shows as a zombie while its other threads still hold its sockets: it is gone once
        # nothing answers on its ports, so a restart right after finds them free.
        wait_until(lambda: not any(port_in_use(host, port) for host, port in self.ports().values()), 10.0)
        self.pid_file.unlink(missing_ok=True)
        return True

    def status(self) -> ServiceStatus:
        """Whether it runs and answers, where, and which version."""
        pid = self.pid()
        state = "stopped" if pid is None else "ready" if self.ready() else "not answering"
        return ServiceStatus(self.name, state, self.address, self.version(), pid, str(self.log_file))


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie child of ours is reaped and counts as dead)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class ServiceGroup:
    """Several services run as one (a cluster's nodes, ``nodes``): started together, stopped in reverse, wiped."""

    nodes: tuple[ManagedService, ...]

    def start_all(self) -> bool:
        """Start every node that is not running, then wait until each answers (a cluster's nodes may answer only once
        enough of them run, so none is waited for alone). True if any process was started."""
        launched = [node.launch() for node in self.nodes]
        for node, process in zip(self.nodes, launched, strict=True):
            node.await_ready(process)
        return any(process is not None for process in launched)

    def stop(self, grace_s: float = 30.0) -> bool:
        """Stop every node (``ManagedService.stop``'s ``grace_s``); False if none ran."""
        return any([node.stop(grace_s) for node in reversed(self.nodes)])

    def wipe(self) -> None:
        """Delete every node's data."""
        for node in self.nodes:
            node.wipe()
