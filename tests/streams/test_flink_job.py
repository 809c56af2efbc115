"""A stale checkpoint never wedges a job: `loopline stack down --wipe` takes the jobs' checkpoints with it; a
checkpoint of the wiped cluster, put back, makes `loopline stream submit` and `loopline feedback join` stop at once
with one line naming --no-restore, with which both run and write; and a restore that never checkpoints ends. (A
checkpoint of another feature plan is not restored but rebuilt from: tests/feature_store/test_view_state.py.)

One private stack for the module (it is wiped). Real Kafka, Redis, Flink and Feast; the jobs are `loopline` processes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from feature_store.config import apply_definitions
from feature_store.online_read import OnlineReader
from infra.service import free_port, wait_until
from loopline.components import apply_loopline_topics, build_stack, feature_plan
from loopline.job_processes import start_feature_job, start_joiner, start_loopline, stop_process_group, wait_until_serving
from loopline.settings import Settings, settings_environment
from schemas.records import PredictionRecord, TrainingExample
from schemas.topics import PREDICTIONS, TRAINING_EXAMPLES
from schemas.validation import decode, encode
from streams.checkpoint_origin import ORIGIN_FILE, kafka_cluster_id, recorded_origin
from streams.flink_job import latest_checkpoint
from streams.topics import read_topic
from tests.support.stack import stack_settings
from tests.support.templates import FRAUD, LABELS, LabelEvent

#: Checkpoints every second, so the jobs have one soon.
FAST_CHECKPOINTS = {"LOOPLINE_STREAM__CHECKPOINT_INTERVAL_MS": "1000", "LOOPLINE_FEEDBACK__CHECKPOINT_INTERVAL_MS": "1000"}
#: The integration tier: a stack of its own, which it wipes.
pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]


@dataclass(frozen=True)
class Wiped:
    """The module's stack after `stack down --wipe` and `up`, and what the wipe met."""

    settings: Settings
    #: The checkpoints folder as the jobs left it before the wipe (copied aside).
    aside: Path
    old_cluster: str
    #: What was under the checkpoints folder right after the wipe.
    left_by_wipe: list[Path]


def _prepare(settings: Settings) -> None:
    apply_loopline_topics(settings)
    apply_definitions(settings.feast_registry_path, settings.redis_connection, settings.repo_path)


def _publish_scored_event(producer: Producer) -> str:
    """A prediction and its label a millisecond later, for a new event; its id."""
    event, now = f"ev-{uuid.uuid4().hex[:12]}", int(time.time() * 1000)
    prediction = PredictionRecord(
        schema_version=1,
        request_id=f"req-{event}",
        entity_keys={"user_id": "u-1"},
        features={"f:x": 1.0},
        model_name="fraud",
        model_version="1",
        score=0.5,
        requested_at_ms=now - 5,
        scored_at_ms=now,
        event_id=event,
    )
    label = LabelEvent(schema_version=1, event_id=event, user_id="u-1", is_fraud=True, label_time_ms=now + 1, source="chargeback")
    producer.produce(PREDICTIONS.name, encode(prediction), prediction.request_id, timestamp=now)
    producer.produce(LABELS.name, FRAUD.encode(LABELS.name, label), event, timestamp=now + 1)
    return event


@contextmanager
def _scoring_traffic(bootstrap: str) -> Iterator[None]:
    """A scored event and its label every 50 ms while the block runs: each of the joiner's checkpoints holds a
    transaction of examples to commit, as in the demo."""
    stop = threading.Event()

    def publish() -> None:
        producer = Producer({"bootstrap.servers": bootstrap})
        while not stop.wait(0.05):
            _publish_scored_event(producer)
            producer.poll(0)
        producer.flush(30)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)


def _examples(bootstrap: str) -> list[TrainingExample]:
    return [decode(TrainingExample, m.value()) for m in read_topic(bootstrap, TRAINING_EXAMPLES.name)]


@pytest.fixture(scope="module")
def wiped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wiped]:
    """Both jobs ran, the joiner writing examples, until each completed a checkpoint; then `loopline stack down --wipe`
    and `up` again."""
    home = tmp_path_factory.mktemp("stale")
    settings = stack_settings(home / "stack")
    bootstrap, logs = settings.kafka.bootstrap, home / "logs"
    stack = build_stack(settings)
    stack.up()
    try:
        _prepare(settings)
        old_cluster = kafka_cluster_id(bootstrap, {})
        features = start_feature_job(settings, logs / "features.log", **FAST_CHECKPOINTS)
        joiner = start_joiner(settings, logs / "joiner.log", **FAST_CHECKPOINTS)
        try:
            with _scoring_traffic(bootstrap):
                assert wait_until(lambda: _examples(bootstrap) or joiner.poll() is not None, 240, 1.0), f"see {logs}"
                # A checkpoint after examples were committed: it holds the open transaction of later ones.
                committed = latest_checkpoint(settings.feedback_checkpoint_dir)
                assert wait_until(lambda: latest_checkpoint(settings.feedback_checkpoint_dir) != committed, 60, 0.2)
                assert wait_until(lambda: latest_checkpoint(settings.checkpoint_dir) or features.poll() is not None, 240, 0.5)
                assert features.poll() is None and joiner.poll() is None, f"a job ended; see {logs}"
        finally:
            stop_process_group(features)
            stop_process_group(joiner)
        aside = home / "aside"
        shutil.copytree(settings.checkpoints_root, aside)
        down = start_loopline(settings, ["stack", "down", "--wipe"], logs / "down.log")
        assert down.wait(120) == 0, (logs / "down.log").read_text()
        left = sorted(settings.checkpoints_root.rglob("*")) if settings.checkpoints_root.exists() else []
        stack.up()
        _prepare(settings)
        yield Wiped(settings, aside, old_cluster, left)
    finally:
        stack.down(wipe=True)


def _put_back(wiped: Wiped, keep_records: bool = True) -> None:
    """The checkpoints folder as it was before the wipe (with ``keep_records`` False: as written before records were
    kept)."""
    root = wiped.settings.checkpoints_root
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(wiped.aside, root, ignore=None if keep_records else shutil.ignore_patterns(ORIGIN_FILE))


def test_wipe_takes_the_jobs_checkpoints(wiped: Wiped) -> None:
    settings = wiped.settings
    for folder in (settings.checkpoint_dir, settings.feedback_checkpoint_dir):
        before = wiped.aside / Path(folder).name
        newest = latest_checkpoint(before)
        assert newest is not None and recorded_origin(newest) == wiped.old_cluster, (
            f"{Path(folder).name} checkpointed before the wipe"
        )
    assert wiped.left_by_wipe == []


def _refusal(process: subprocess.Popen, log: Path, timeout_s: float) -> str:
    """The one line a job that refused to start printed, after checking it ended with exit code 1."""
    assert process.wait(timeout_s) == 1, log.read_text()
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert "Traceback" not in log.read_text() and lines[-1].startswith("error: "), log.read_text()
    return lines[-1]


def test_a_checkpoint_of_the_wiped_cluster_is_refused_in_one_line_and_no_restore_writes(wiped: Wiped, tmp_path: Path) -> None:
    settings, bootstrap = wiped.settings, wiped.settings.kafka.bootstrap
    new_cluster = kafka_cluster_id(bootstrap, {})
    assert new_cluster != wiped.old_cluster
    _put_back(wiped)

    began = time.monotonic()
    logs = {"stream submit": tmp_path / "features-refused.log", "feedback join": tmp_path / "joiner-refused.log"}
    refused = {
        "stream submit": start_feature_job(settings, logs["stream submit"]),
        "feedback join": start_joiner(settings, logs["feedback join"]),
    }
    for command, process in refused.items():
        line = _refusal(process, logs[command], 120)
        assert wiped.old_cluster in line and new_cluster in line, line
        assert f"`loopline {command} --no-restore`" in line, line
        # Refused before any Flink job was built: no mini-cluster wrote a log (job_processes puts them beside the log).
        assert not any(logs[command].with_name(f"{logs[command].stem}-flink").iterdir()), f"{command} started Flink"
    took_s = time.monotonic() - began
    assert took_s < 90, f"the refusals took {took_s:.0f} s (the imports and the Feast plan, not a mini-cluster's start)"

    features = start_feature_job(settings, tmp_path / "features.log", restore=False, **FAST_CHECKPOINTS)
    joiner = start_joiner(settings, tmp_path / "joiner.log", restore=False, **FAST_CHECKPOINTS)
    try:
        producer = Producer({"bootstrap.servers": bootstrap})
        event = _publish_scored_event(producer)
        assert producer.flush(30) == 0
        assert wait_until(
            lambda: any(e.event_id == event for e in _examples(bootstrap)) or joiner.poll() is not None, 240, 1.0
        ), f"no example; see {tmp_path / 'joiner.log'}"
        assert [e.label for e in _examples(bootstrap) if e.event_id == event] == [1.0]
        reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
        wait_until_serving(features, settings, reader, feature_plan(settings), timeout_s=240)
        for folder in (settings.checkpoint_dir, settings.feedback_checkpoint_dir):
            assert wait_until(lambda folder=folder: recorded_origin(latest_checkpoint(folder)) == new_cluster, 60, 0.5), (
                f"the newest checkpoint in {folder} is not one of the new run's, recorded for the new cluster"
            )
    finally:
        stop_process_group(features)
        stop_process_group(joiner)


def test_a_stale_restore_never_wedges_the_joiner(wiped: Wiped, tmp_path: Path) -> None:
    """The wiped cluster's checkpoint, as written before records were kept, restored: only the watchdog can tell it is
    stale. When it holds a transaction the new cluster never knew, no checkpoint completes and the watchdog ends the
    job naming the fix; when it holds none (the joiner's last one may have committed everything), the job checkpoints
    again. Either way it is not wedged."""
    _put_back(wiped, keep_records=False)
    restored = latest_checkpoint(wiped.settings.feedback_checkpoint_dir)
    log, flink_logs = tmp_path / "joiner.log", tmp_path / "joiner-flink"
    flink_logs.mkdir()
    # The joiner as `loopline feedback join` runs it, with a watchdog of 20 s instead of minutes.
    program = (
        "from loopline.components import joiner_settings; from loopline.settings import Settings; "
        "from feedback_loop.joiner_job import run_embedded; run_embedded(joiner_settings(Settings()), stall_after_s=20)"
    )
    with log.open("ab") as out:
        joiner = subprocess.Popen(
            [sys.executable, "-c", program],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=settings_environment(wiped.settings, FLINK_LOG_DIR=str(flink_logs), **FAST_CHECKPOINTS),
        )

    def checkpointed_again() -> bool:
        newest = latest_checkpoint(wiped.settings.feedback_checkpoint_dir)
        return newest not in (None, restored) and Path(newest).parent.name != Path(restored).parent.name

    try:
        assert wait_until(lambda: joiner.poll() is not None or checkpointed_again(), 400, 1.0), (
            "wedged: neither ended nor checkpointed"
        )
    finally:
        code = joiner.poll()
        stop_process_group(joiner)
    text = log.read_text()
    if code is None:  # it checkpoints again: the restore was harmless
        return
    assert code != 0 and "running it again from its newest checkpoint" in text, text[-3000:]
    assert re.search(
        r"JobStateError: restored from \S+, the job completed no checkpoint in two runs of 20 s: the checkpoint "
        r"cannot be restored — fix: start the job without it: `loopline feedback join --no-restore`",
        text,
    ), text[-3000:]


def test_a_broker_that_does_not_answer_is_one_line_with_the_fix() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(TimeoutError) as caught:
        kafka_cluster_id(address, {}, timeout_s=2)
    message = str(caught.value)
    assert message.startswith(f"Kafka at {address} did not answer within 2 s") and "fix: start it" in message, message
    assert "\n" not in message
