"""The whole loop on the local stack, as `make demo` runs it: produce → score → labels → join → snapshot → train →
register → canary → promote, while a running scorer hot-swaps with no failed request; then `loopline rollback`.

Real parts throughout: Kafka and Redis (the session's stack), the streaming feature job and the feedback joiner
(PyFlink mini-clusters), `loopline serve --kafka --http` in its own process, DeepSpeed training on the CPU, MLflow.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import LogReader
from feature_store.online_read import OnlineReader
from feedback_loop.consistency import by_outcome, summary
from infra.service import free_port, wait_until
from loopline.cli import app
from loopline.components import feature_plan, model_release
from loopline.job_processes import start_feature_job, stop_process_group, wait_until_serving
from loopline.monitoring import consistency_replay
from loopline.scenarios.demo_loop import DemoLoop
from loopline.scenarios.demo_scoring import DemoScoring
from loopline.scenarios.demo_world import DemoWorld
from loopline.settings import ReleaseSettings, ServingSettings, Settings, settings_environment
from schemas.model_registry import CANARY_ALIAS, PROD_ALIAS
from schemas.records import DeadLetterRecord, PredictionRecord
from schemas.topics import DEAD_LETTERS, PREDICTIONS, SCORE_REQUESTS
from schemas.validation import decode
from streams.topics import read_topic

#: Transactions per second, each followed by its score request; labels within seconds, as in the demo.
RATE, LABEL_DELAY_S = 150.0, (1.0, 10.0)
#: The longest the loop may take from the first transaction to the controller's verdict.
LOOP_BUDGET_S = 300.0


@pytest.fixture()
def loop_settings(applied: Settings, tmp_path: Path) -> Settings:
    """The session's stack with a scorer on free ports, its own registry and a release policy a test can wait for."""
    serving = ServingSettings(http_port=free_port(), grpc_port=free_port(), kafka_group_id="loop-scorer", model_name="loop-fraud")
    release = ReleaseSettings(min_watch_s=5, min_requests=100, max_watch_s=120, max_latency_ratio=10.0)
    # This test is about the loop's plumbing: whichever model the few hundred labels train is registered (the gate's
    # judgement is tested in test_candidate.py).
    retrain = applied.retrain.model_copy(update={"max_auc_drop": 1.0})
    return applied.model_copy(update={"serving": serving, "release": release, "retrain": retrain,
                                      "model_registry": applied.model_registry.model_copy(update={"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"})})  # fmt: skip


@pytest.mark.timeout(900)
def test_the_loop_closes_and_rolls_back(loop_settings: Settings, bootstrap: str, tmp_path: Path) -> None:
    settings = loop_settings
    job = start_feature_job(settings, tmp_path / "feature-job.log", restore=False)
    scoring = DemoScoring(settings, tmp_path / "models")
    loop = DemoLoop(scoring.settings, scoring.run_id, min_labeled=300, min_fraud=20)
    predictions = LogReader(bootstrap, PREDICTIONS.name)
    try:
        scoring.start_serving(tmp_path / "scorer.log")
        loop.start(tmp_path / "joiner.log")
        reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
        wait_until_serving(job, settings, reader, timeout_s=180)
        scoring.wait_ready()

        # The demo's own world, with no history (the job rebuilds from the session's whole log): live at once.
        world = DemoWorld(scoring.settings, scoring, RATE, history_s=0.0, malformed_rate=0.0, label_delay_s=LABEL_DELAY_S)
        world.start()
        world.go_live()
        scoring.start_counting()
        began = time.monotonic()
        loop.close_once(deadline=began + LOOP_BUDGET_S)
        try:
            assert wait_until(lambda: loop.settled() or not world.running, LOOP_BUDGET_S + 30, 0.5), "the loop did not finish"
            failed = [s for s in loop.steps.values() if s.state == "failed"]
            assert not failed, f"{failed[0].name}: {failed[0].detail}; see {tmp_path}"
            assert loop.outcome.release == "promote", {s.name: (s.state, s.detail) for s in loop.steps.values()}
            trained = loop.outcome.candidate_version
            release = model_release(settings)
            assert release.aliases(settings.serving.model_name) == {PROD_ALIAS: trained}
            # The scorer swaps to the promoted version: requests sent from a few seconds on are scored by it.
            time.sleep(6)  # the live world goes on a while: what is measured, not a wait for a condition
        finally:
            world.stop()
        sent = [m.key().decode() for m in read_topic(bootstrap, SCORE_REQUESTS.name, since_ms=world.published_from_ms)
                if m.key().decode().startswith(scoring.run_id)]  # fmt: skip
        assert len(sent) > RATE * 10, "the world scored every transaction it published"

        def all_scored() -> bool:
            return len({r.request_id for r in _records(predictions)} & set(sent)) == len(set(sent))

        assert wait_until(all_scored, 120, 0.5), "not every score request was answered"
        records = [r for r in _records(predictions) if r.request_id in set(sent)]
        # Exactly once, none failed (no request of this run dead-lettered), and scored by prod, the canary, then the new prod.
        assert Counter(r.request_id for r in records).most_common(1)[0][1] == 1
        dead = [decode(DeadLetterRecord, m.value()) for m in read_topic(bootstrap, DEAD_LETTERS.name)]  # the whole topic, now
        assert not [d for d in dead if d.key in set(sent)]
        by_version = Counter(r.model_version for r in records)
        assert set(by_version) == {"1", trained} and by_version[trained] > 0, by_version
        latest = sorted(records, key=lambda r: r.requested_at_ms)[-50:]
        assert {r.model_version for r in latest} == {trained}, "the last requests were scored by the promoted version"

        # The healthy pipeline is consistent: the monitor's replay of every scored request (the job rebuilt its state
        # from the whole log, as the replay reads it) finds no value mismatch; differences are lag or clocks.
        report = consistency_replay(settings, feature_plan(settings))(records)
        outcomes = by_outcome(report)
        assert outcomes["value"] == outcomes["extra"] == 0 and outcomes["match"] > 0, (outcomes, summary(report))
        assert report and {c.compared for c in report.values()} == {len(records)}, "every scored request compared, each feature"

        # One command puts the previous version back, and the alias history says who did what and why.
        outcome = CliRunner().invoke(app, ["rollback", "--reason", "test"], env=settings_environment(settings))
        assert outcome.exit_code == 0, outcome.output
        assert release.aliases(settings.serving.model_name)[PROD_ALIAS] == "1"
        changes = release.history(settings.serving.model_name)
        history = [(c.alias, c.previous, c.version, c.actor) for c in changes]
        assert (CANARY_ALIAS, None, trained, "loopline demo") in history
        assert (PROD_ALIAS, "1", trained, "release-controller") in history
        assert history[-1][:3] == (PROD_ALIAS, trained, "1") and changes[-1].reason == "test"
        # While it was the canary, the trained version already scored part of the traffic.
        promoted_at_ms = next(c.at_ms for c in changes if (c.alias, c.version) == (PROD_ALIAS, trained))
        assert any(r.model_version == trained and r.scored_at_ms < promoted_at_ms for r in records), "the canary took no requests"
    finally:
        loop.stop()
        scoring.stop()
        stop_process_group(job)
        predictions.close()


def _records(reader: LogReader) -> list[PredictionRecord]:
    return reader.records(PredictionRecord)
