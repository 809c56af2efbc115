"""`loopline flink up|status|down`: a standalone Flink session cluster (one JobManager, N TaskManagers) under one
folder, started from the PyFlink distribution, its Web UI and REST API on the JobManager's REST port.

The TaskManagers run with the environment of the process that starts them and need only Java; each job brings its
Python (``streams/job_archives.py``), so a TaskManager started with a bare ``PATH`` runs Loopline's jobs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from infra.flink_cluster import FlinkJobManager, FlinkTaskManager
from infra.service import ServiceStatus


class FlinkSessionCluster:
    """A JobManager at ``host:rest_port`` (RPC on ``rpc_port``) and ``taskmanagers`` TaskManagers of ``slots`` slots
    each; configuration, pid files and logs under ``home``."""

    def __init__(self, home: Path, host: str, rest_port: int, rpc_port: int, taskmanagers: int, slots: int) -> None:
        self.home, self.host, self.rest_port, self.taskmanagers = home, host, rest_port, taskmanagers
        self.jobmanager = FlinkJobManager(self._conf, host, rest_port, rpc_port, self._run, self._logs, slots)

    @property
    def address(self) -> str:
        """The JobManager's REST address (host:port): `--jobmanager` of `stream submit`, and the Web UI."""
        return self.jobmanager.address

    @property
    def _conf(self) -> Path:
        return self.home / "conf"

    @property
    def _run(self) -> Path:
        return self.home / "run"

    @property
    def _logs(self) -> Path:
        return self.home / "logs"

    def taskmanager(self, index: int) -> FlinkTaskManager:
        """The ``index``-th TaskManager (from 0)."""
        return FlinkTaskManager(self._conf, self.host, self.rest_port, self._run, self._logs, index)

    def _known_taskmanagers(self) -> list[FlinkTaskManager]:
        """The configured TaskManagers, and any more an earlier `up --taskmanagers` started (they have pid files)."""
        started = {int(p.stem.rsplit("-", 1)[1]) for p in self._run.glob("flink-taskmanager-*.pid")}
        return [self.taskmanager(i) for i in sorted(started | set(range(self.taskmanagers)))]

    def up(self) -> list[str]:
        """Start the JobManager, then each TaskManager, unless running; wait until each has registered. Returns the
        names of the processes started."""
        started = [self.jobmanager.name] if self.jobmanager.start() else []
        for index in range(self.taskmanagers):
            taskmanager = self.taskmanager(index)
            if taskmanager.start():
                started.append(taskmanager.name)
        return started

    def down(self) -> list[str]:
        """Stop every TaskManager, then the JobManager (running jobs fail; their retained checkpoints stay), and delete
        the jobs' unpacked Python environments (a TaskManager killed before it could clean up leaves its own). Returns
        the names of the processes stopped."""
        stopped = [tm.name for tm in self._known_taskmanagers() if tm.stop()]
        stopped += [self.jobmanager.name] if self.jobmanager.stop() else []
        shutil.rmtree(self.home / "tmp", ignore_errors=True)
        return stopped

    def status(self) -> list[ServiceStatus]:
        """The JobManager's and each TaskManager's state, address, version, pid and log."""
        return [self.jobmanager.status(), *(tm.status() for tm in self._known_taskmanagers())]
