"""Loopline's processes as children (`loopline stream submit`, `feedback join`, `serve`), for the demo, tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from infra.service import wait_until
from loopline.settings import Settings, settings_environment
from offline_training.launch import lower_priority
from streams.feature_plan import FeaturePlan
from streams.producer import EventProducer


def start_loopline(
    settings: Settings, arguments: list[str], log_file: Path, niceness: int = 0, **extra_env: str
) -> subprocess.Popen:
    """`loopline <arguments>` with ``settings`` (``extra_env`` on top), in a session of its own, logging to ``log_file``;
    ``niceness`` steps nicer than this process, with whatever it starts (``lower_priority``), for work that should
    yield the cores to serving."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-c", "from loopline.cli import main; main()", *arguments],
        env=settings_environment(settings, **extra_env),
        stdout=log_file.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lower_priority(process.pid, niceness)
    return process


def _start_flink_job(
    settings: Settings, arguments: list[str], log_file: Path, niceness: int = 0, **extra_env: str
) -> subprocess.Popen:
    """A Flink job's `loopline` command; its mini-cluster log (restarts, task failures) goes to a folder beside
    ``log_file``, not into PyFlink's package folder."""
    flink_logs = log_file.with_name(f"{log_file.stem}-flink")
    flink_logs.mkdir(parents=True, exist_ok=True)
    return start_loopline(settings, arguments, log_file, niceness, FLINK_LOG_DIR=str(flink_logs), **extra_env)


def start_feature_job(
    settings: Settings, log_file: Path, restore: bool = True, from_ms: int | None = None, **extra_env: str
) -> subprocess.Popen:
    """Start `loopline stream submit` (embedded mini-cluster); without ``restore`` the job rebuilds its state from
    the oldest retained event, or from the first published at ``from_ms`` (epoch ms)."""
    since = [] if from_ms is None else ["--from-time", datetime.fromtimestamp(from_ms / 1000, UTC).isoformat()]
    return _start_flink_job(settings, ["stream", "submit", *([] if restore else ["--no-restore", *since])], log_file, **extra_env)


def start_joiner(
    settings: Settings, log_file: Path, restore: bool = True, niceness: int = 0, **extra_env: str
) -> subprocess.Popen:
    """Start `loopline feedback join` (the feedback joiner, embedded mini-cluster) at CPU ``niceness``."""
    return _start_flink_job(
        settings, ["feedback", "join", *([] if restore else ["--no-restore"])], log_file, niceness, **extra_env
    )


def start_scorer(settings: Settings, doors: list[str], log_file: Path, **extra_env: str) -> subprocess.Popen:
    """Start `loopline serve` with ``doors`` (e.g. ``["--http", "--kafka"]``, and ``--model PATH``): one worker
    unless ``settings`` or ``LOOPLINE_SERVING__WORKERS`` say otherwise, since the demo, the drill and the tests
    run the scorer on cores the whole stack shares."""
    workers = {"LOOPLINE_SERVING__WORKERS": str(settings.serving.workers or 1)}
    return start_loopline(settings, ["serve", *doors], log_file, **(workers | extra_env))


def stop_process_group(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> None:
    """Stop a process started here and everything it started (a Flink job's JVM and Python workers); TimeoutExpired
    if it has not ended within ``timeout_s``."""
    with contextlib.suppress(ProcessLookupError):  # it has ended already
        os.killpg(process.pid, sig)
    process.wait(timeout_s)


def wait_until_serving(job: subprocess.Popen, settings: Settings, reader, plan: FeaturePlan, timeout_s: float) -> None:
    """Publish one probe event of the project's world and wait until a row of it is readable online (the job has
    started)."""
    from loopline.components import world

    view = plan.views[0]
    probe = next(
        e
        for e in world(settings, 1.0, seed=1, start_ms=int(time.time() * 1000))
        if e.record is not None and e.topic == view.topic
    )
    EventProducer(settings.kafka.bootstrap, client_config=settings.kafka.client_config).publish([probe])
    keys = {key: getattr(probe.record, key) for key in view.entity_keys}
    event_time_us = getattr(probe.record, view.time_field) * 1000

    def probe_visible_or_job_gone() -> bool:
        return job.poll() is not None or (reader.row_timestamps_us(view.name, [keys])[0] or 0) >= event_time_us

    if not wait_until(probe_visible_or_job_gone, timeout_s, interval_s=0.2) or job.poll() is not None:
        raise RuntimeError(f"the feature job did not start within {timeout_s:.0f} s; see its log")
