"""Loopline's child processes: background work started at a lower CPU priority gets it, for its whole session."""

from __future__ import annotations

import os
from pathlib import Path

import requests

from infra.service import free_port, wait_until
from infra.settings import DashboardSettings
from loopline.job_processes import start_loopline, stop_process_group
from loopline.settings import Settings


def _niceness(pid: int) -> int:
    """A process's nice value (field 19 of /proc/<pid>/stat; the command name in field 2 may hold spaces)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def test_a_background_process_and_its_session_run_at_the_niceness_given(applied: Settings, tmp_path: Path) -> None:
    settings = applied.model_copy(update={"dashboard": DashboardSettings(port=free_port())})
    url = f"http://127.0.0.1:{settings.dashboard.port}/"
    expected = min(os.getpriority(os.PRIO_PROCESS, 0) + 7, 19)
    dashboard = start_loopline(settings, ["dashboard"], tmp_path / "dashboard.log", niceness=7)
    try:
        assert wait_until(lambda: _answers(url) or dashboard.poll() is not None, 60, 0.2), f"see {tmp_path / 'dashboard.log'}"
        assert dashboard.poll() is None
        assert _niceness(dashboard.pid) == expected, "the command itself, not a wrapper, runs 7 nicer than its parent"
        assert os.getsid(dashboard.pid) == dashboard.pid != os.getsid(0), "a session of its own"
        autogroup = Path(f"/proc/{dashboard.pid}/autogroup")
        if autogroup.exists():  # the kernel schedules sessions as groups: the session's group is niced too
            assert autogroup.read_text().split()[-1] == str(expected), autogroup.read_text()
    finally:
        stop_process_group(dashboard)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).ok
    except requests.RequestException:
        return False
