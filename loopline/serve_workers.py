"""`loopline serve --workers N`: N scorer processes behind the same ports, watched by this one.

Each worker is a whole scorer (`loopline serve --worker-index i`): its own event loop, batcher, Redis and Kafka
clients, model copy and model registry watcher, so one core's worth of Python is no longer the ceiling. They
bind the HTTP port with SO_REUSEPORT (gRPC servers bind that way by default on Linux) and the kernel spreads
connections over them; probes and ``/metrics`` on any worker answer for all (``online/worker_peers.py``). The
Kafka door's workers are members of one consumer group, each with a transactional id of its own.

This process only supervises: a worker that dies is started again (the others serve meanwhile); one that exits by
itself with an error within its first ``_STARTUP_S`` seconds has met a configuration fault (a port taken, a model
that does not load), and everything stops. SIGINT/SIGTERM are passed on, and each worker drains as a single
scorer does; a second signal is passed on too (the workers exit at once). A worker whose supervisor dies, even by
SIGKILL, gets SIGTERM from the kernel and drains.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from loopline.settings import Settings, settings_environment

log = logging.getLogger(__name__)
#: A worker that fails this soon after its start would only fail again: nothing is restarted, everything stops.
_STARTUP_S = 30.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the supervisor is gone, whatever killed it."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class WorkerSupervisor:
    """Runs ``count`` workers of `loopline serve <arguments>` with ``settings`` until signalled."""

    def __init__(self, settings: Settings, arguments: Sequence[str], count: int) -> None:
        self.settings, self.arguments, self.count = settings, list(arguments), count
        self._workers: dict[int, tuple[subprocess.Popen, float]] = {}
        self._signal: int | None = None
        self._signalled = threading.Event()

    def _start(self, index: int) -> None:
        command = [
            sys.executable,
            "-c",
            "from loopline.cli import main; main()",
            "serve",
            *self.arguments,
            "--workers",
            str(self.count),
            "--worker-index",
            str(index),
        ]
        # A process group of its own: a signal to the supervisor's group (Ctrl-C, `kill -TERM -<pgid>`) reaches the
        # worker once, passed on by the supervisor, not a second time directly, which would make it exit at once.
        process = subprocess.Popen(command, env=settings_environment(self.settings), preexec_fn=_die_with_parent, process_group=0)
        self._workers[index] = (process, time.monotonic())
        if self._signal is not None:  # the signal came while it was being started: it stops with the others
            process.send_signal(self._signal)
        log.info("worker %d of %d started (pid %d)", index, self.count, process.pid)

    def _on_signal(self, number: int, _frame: object) -> None:
        self._signal = number
        for process, _ in self._workers.values():
            if process.poll() is None:
                process.send_signal(number)
        self._signalled.set()

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM (0 once every worker ended cleanly), or until a worker fails at startup
        (its exit status)."""
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, self._on_signal)
        for index in range(self.count):
            self._start(index)
        failed = None
        while not self._signalled.wait(0.5):
            for index, (process, started) in list(self._workers.items()):
                if process.poll() is None:
                    continue
                # A negative status is a signal (kill -9, the OOM killer): the worker is started again.
                if process.returncode > 0 and time.monotonic() - started < _STARTUP_S:
                    log.error("worker %d exited with status %d at startup: stopping every worker", index, process.returncode)
                    failed = process.returncode
                    break
                log.warning("worker %d exited with status %d: starting it again", index, process.returncode)
                self._start(index)
            if failed is not None:
                self._on_signal(signal.SIGTERM, None)
                break
        return self._wait(failed)

    def _wait(self, failed: int | None) -> int:
        """Wait for every worker to end (beyond their own forced-exit deadline, SIGKILL); the exit status."""
        deadline = time.monotonic() + self.settings.serving.shutdown_timeout_s + 5.0
        statuses = []
        for process, _ in self._workers.values():
            try:
                statuses.append(process.wait(max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                log.error("worker pid %d did not end after its shutdown deadline: killing it", process.pid)
                process.kill()
                statuses.append(process.wait())
        if failed is not None:
            return failed
        status = next((status for status in statuses if status != 0), 0)
        return 128 - status if status < 0 else status  # killed by signal N: the shell's 128 + N
