"""The retrain trigger: fires when prod's labeled quality over the window falls below the policy, with at least the
minimum of labels, or when a skew or consistency alert fires for prod; stays quiet on good quality, too few labels,
other models' or versions' examples and alerts, examples older than the window, while a canary is out and during its
cooldown. Then `loopline retrain watch --once` on the real stack: it reads training.examples and the registry, fires
(notify mode), and records the firing so the next look cools down; it reads a real Prometheus' firing alerts; in
retrain mode one look snapshots the model's own examples, trains (DeepSpeed), judges the candidate against prod and
releases it as a canary."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from confluent_kafka import Producer
from typer.testing import CliRunner

from feedback_loop.retrain_check import LAST_FIRED_TAG, TRIGGER_ACTOR
from feedback_loop.retrain_trigger import FiringAlert, TriggerPolicy, decide
from feedback_loop.settings import RETRAIN_ALERTS, RetrainSettings
from infra.prometheus_server import RULES_DIR, PrometheusServer, alerts
from infra.service import free_port, wait_until
from infra.settings import PrometheusSettings
from loopline.cli import app
from loopline.components import model_release
from loopline.settings import Settings, settings_environment
from offline_training.evaluation import classification_metrics
from offline_training.onnx_models import write_linear_model
from online.settings import ServingSettings
from schemas.records import TrainingExample
from schemas.topics import TRAINING_EXAMPLES
from schemas.validation import encode

NOW_MS = 1_790_000_000_000
HOUR_MS = 3_600_000
MODEL = "fraud"
POLICY = TriggerPolicy(window_s=86_400, min_auc=0.75, min_labels=200, cooldown_s=6 * 3600)


def examples(
    count: int,
    *,
    quality: str,
    version: str = "2",
    model: str = MODEL,
    age_ms: int = HOUR_MS,
    seed: int = 0,
    labeled: bool = True,
) -> list[TrainingExample]:
    """``count`` examples scored ``age_ms`` before NOW_MS, half fraud: ``good`` scores rank them nearly perfectly,
    ``bad`` scores are noise, ``overconfident`` rank well but sit in [0.9, 1] (badly calibrated)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 2 == 0
    noise = rng.random(count)
    score = {"good": 0.8 * labels + 0.2 * noise, "bad": noise, "overconfident": 0.9 + 0.08 * labels + 0.02 * noise}[quality]
    return [
        TrainingExample(
            schema_version=TrainingExample.SCHEMA_VERSION,
            event_id=f"evt-{seed}-{i}",
            request_id=f"req-{seed}-{i}",
            entity_keys={"user_id": f"u{i}"},
            features={"request:amount": 1.0},
            model_name=model,
            model_version=version,
            score=float(score[i]),
            label=float(labels[i]) if labeled else None,
            requested_at_ms=NOW_MS - age_ms,
            predicted_at_ms=NOW_MS - age_ms,
            label_time_ms=NOW_MS if labeled else None,
            joined_at_ms=NOW_MS,
        )
        for i in range(count)
    ]


def judge(
    batch: list[TrainingExample],
    policy: TriggerPolicy = POLICY,
    *,
    prod: str | None = "2",
    canary: str | None = None,
    last_fired_ms: int | None = None,
    alerts: tuple[FiringAlert, ...] = (),
    quality=classification_metrics,
):
    return decide(
        policy,
        batch,
        model_name=MODEL,
        prod_version=prod,
        canary_version=canary,
        now_ms=NOW_MS,
        last_fired_ms=last_fired_ms,
        quality=quality,
        alerts=alerts,
    )


SKEW = FiringAlert("LooplineFeatureSkew", {"feature": "request:amount", "model_version": "2"}, "2026-12-01T02:00:00Z")


def test_fires_when_prods_auc_falls_below_the_threshold():
    decision = judge(examples(300, quality="bad"))
    assert decision.fire, decision.reason
    assert decision.labeled == 300
    assert decision.quality["auc"] < POLICY.min_auc
    assert "AUC" in decision.reason and "below 0.75" in decision.reason and "prod v2" in decision.reason


def test_quiet_while_quality_holds():
    decision = judge(examples(300, quality="good"))
    assert not decision.fire, decision.reason
    assert decision.quality["auc"] > 0.95
    assert "within the policy" in decision.reason


def test_quiet_with_fewer_labels_than_the_minimum():
    batch = examples(150, quality="bad") + examples(400, quality="bad", seed=1, labeled=False)
    decision = judge(batch)
    assert not decision.fire
    assert decision.labeled == 150
    assert "judged from 200" in decision.reason
    assert judge(batch, TriggerPolicy(min_labels=150)).fire  # the same examples, a lower minimum


def test_only_prods_own_examples_within_the_window_count():
    other_version = examples(300, quality="bad", version="1", seed=1)
    other_model = examples(300, quality="bad", model="churn", seed=2)
    too_old = examples(300, quality="bad", age_ms=30 * HOUR_MS, seed=3)
    current = examples(300, quality="good", seed=4)
    decision = judge(other_version + other_model + too_old + current)
    assert not decision.fire, decision.reason
    assert decision.labeled == 300
    # Each bad group does count where it belongs: as prod's (or that model's) examples, or inside a wider window.
    assert judge(other_version, prod="1").fire
    assert decide(
        POLICY,
        other_model,
        model_name="churn",
        prod_version="2",
        canary_version=None,
        now_ms=NOW_MS,
        last_fired_ms=None,
        quality=classification_metrics,
    ).fire
    assert judge(too_old, TriggerPolicy(window_s=48 * 3600)).fire


def test_quiet_during_the_cooldown_and_fires_after_it():
    bad = examples(300, quality="bad")
    cooling = judge(bad, last_fired_ms=NOW_MS - HOUR_MS)
    assert not cooling.fire
    assert "cooling down" in cooling.reason and "18,000 s more" in cooling.reason
    assert judge(bad, last_fired_ms=NOW_MS - 7 * HOUR_MS).fire


def test_quiet_while_a_canary_is_out_or_without_prod():
    bad = examples(300, quality="bad")
    with_canary = judge(bad, canary="3")
    assert not with_canary.fire and "canary v3" in with_canary.reason
    without_prod = judge(bad, prod=None)
    assert not without_prod.fire and "no prod" in without_prod.reason


def test_one_outcome_only_is_not_judged():
    legit_only = [e for e in examples(600, quality="bad") if not e.label]
    decision = judge(legit_only)
    assert not decision.fire and "one outcome" in decision.reason


def test_calibration_fires_only_when_the_policy_judges_it():
    overconfident = examples(300, quality="overconfident")
    unjudged = judge(overconfident)
    assert not unjudged.fire, unjudged.reason
    assert unjudged.quality["auc"] > 0.95 and unjudged.quality["calibration_error"] > 0.3
    judged = judge(overconfident, TriggerPolicy(max_calibration_error=0.1))
    assert judged.fire and "calibration error" in judged.reason


def test_a_skew_or_consistency_alert_for_prod_fires_it_and_says_which():
    good = examples(300, quality="good")
    decision = judge(good, alerts=(SKEW,))
    assert decision.fire and decision.causes == {"alert"}, decision
    assert "LooplineFeatureSkew firing for request:amount since 2026-12-01T02:00:00Z (prod v2)" in decision.reason
    assert "within the policy" in decision.reason and decision.quality["auc"] > 0.95  # quality was judged too
    # A consistency alert names a feature and no version: it is about whatever serves it.
    inconsistent = FiringAlert("LooplineFeatureInconsistent", {"feature": "user_transaction_features:txn_count_5m"})
    assert judge(good, alerts=(inconsistent,)).causes == {"alert"}
    # Another version's alert is not prod's; without alerts, good quality stays quiet.
    other = FiringAlert("LooplineFeatureSkew", {"feature": "request:amount", "model_version": "3"})
    ignored = judge(good, alerts=(other,))
    assert not ignored.fire and "no alert firing for prod v2 (1 firing for other versions)" in ignored.reason
    assert not judge(good).fire
    # Quality off: the alert alone decides.
    assert judge([], alerts=(SKEW,), quality=None).fire and not judge([], quality=None).fire


def test_bad_quality_and_an_alert_are_both_causes_and_the_release_and_cooldown_come_first():
    bad = examples(300, quality="bad")
    both = judge(bad, alerts=(SKEW,))
    assert both.causes == {"quality", "alert"} and "below 0.75; also LooplineFeatureSkew firing for request:amount" in both.reason
    assert judge(bad).causes == {"quality"}
    assert not judge(bad, alerts=(SKEW,), canary="3").fire
    assert not judge(bad, alerts=(SKEW,), last_fired_ms=NOW_MS - HOUR_MS).fire


def test_each_cause_has_its_own_mode_the_strongest_acts_and_the_default_alerts_are_the_monitors_paging_rules():
    options = RetrainSettings(mode="notify", alert_mode="retrain")
    assert [options.mode_for(c) for c in ({"alert"}, {"quality"}, {"quality", "alert"})] == ["retrain", "notify", "retrain"]
    assert RetrainSettings(mode="off", alert_mode="notify").mode_for({"quality", "alert"}) == "notify"
    rules = {
        rule["alert"]: rule
        for group in yaml.safe_load((RULES_DIR / "monitoring.rules.yml").read_text())["groups"]
        for rule in group["rules"]
    }
    assert set(RetrainSettings().alerts) == set(RETRAIN_ALERTS) <= set(rules)
    assert {rules[name]["labels"]["severity"] for name in RETRAIN_ALERTS} == {"page"}


@pytest.mark.stack
def test_watch_once_fires_on_an_alert_firing_in_a_real_prometheus(settings: Settings, tmp_path: Path):
    name = f"alerted-{uuid.uuid4().hex[:8]}"
    rules = tmp_path / "alerts.rules.yml"
    # The monitor's skew alert, held for no time: one for the prod version below and one for a version not served.
    rules.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "test",
                        "rules": [
                            {
                                "alert": "LooplineFeatureSkew",
                                "expr": "vector(1)",
                                "labels": {"severity": "page", "feature": "request:amount", "model_version": version},
                            }
                            for version in ("1", "99")
                        ],
                    }
                ]
            }
        )
    )
    prometheus = PrometheusServer(
        "127.0.0.1", free_port(), {}, 1.0, tmp_path / "data", tmp_path / "run", tmp_path / "logs", rule_files=[rules]
    )
    watched = settings.model_copy(
        update={
            "serving": ServingSettings(model_name=name),
            "model_registry": settings.model_registry.model_copy(
                update={"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db", "artifact_location": str(tmp_path / "artifacts")}
            ),
            "retrain": RetrainSettings(mode="off", alert_mode="notify"),
            "prometheus": PrometheusSettings(port=prometheus.port),
        }
    )
    release = model_release(watched)
    version = release.register(name, write_linear_model(tmp_path / "prod.onnx", ["request:amount"], np.ones(1), 0.0))
    release.promote(name, version, "test", "the model the trigger judges")
    assert version == "1"
    runner, env = CliRunner(), settings_environment(watched)
    typo = runner.invoke(app, ["retrain", "watch", "--once"], env={**env, "LOOPLINE_RETRAIN__ALERTS": '["LooplineFeatureSkwe"]'})
    assert typo.exit_code == 2 and "LooplineFeatureSkwe" in typo.output, typo.output  # refused, not silently never firing
    down = runner.invoke(app, ["retrain", "watch", "--once"], env=env)
    said = " ".join(down.output.split())  # the console wraps lines
    assert down.exit_code == 0 and "quiet: quality is not judged; alerts not read: prometheus at" in said, said
    prometheus.start()
    try:
        assert wait_until(lambda: sum(a["state"] == "firing" for a in alerts(prometheus.address)) == 2, 30, 0.2)
        first = runner.invoke(app, ["retrain", "watch", "--once"], env=env)
    finally:
        prometheus.stop()
    assert first.exit_code == 0, first.output
    assert "fire (notify)" in first.output and "LooplineFeatureSkew firing for request:amount since" in first.output, first.output
    assert "(prod v1)" in first.output and "quality is not judged" in first.output, first.output
    assert first.output.count("firing for") == 1, "the alert for a version not served is left out"
    second = runner.invoke(app, ["retrain", "watch", "--once"], env=env)
    assert "quiet: cooling down" in second.output, second.output
    assert release.aliases(name) == {"prod": version}


@pytest.mark.stack
def test_watch_once_reads_the_examples_topic_fires_and_then_cools_down(settings: Settings, bootstrap: str, tmp_path: Path):
    name = f"watched-{uuid.uuid4().hex[:8]}"
    watched = settings.model_copy(
        update={
            "serving": ServingSettings(model_name=name),
            "model_registry": settings.model_registry.model_copy(
                update={"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db", "artifact_location": str(tmp_path / "artifacts")}
            ),
            "retrain": RetrainSettings(mode="notify", min_labels=200, window_s=10 * 365 * 86_400),
        }
    )
    release = model_release(watched)
    version = release.register(name, write_linear_model(tmp_path / "prod.onnx", ["request:amount"], np.ones(1), 0.0))
    release.promote(name, version, "test", "the model the trigger judges")
    producer = Producer({"bootstrap.servers": bootstrap})
    for example in examples(300, quality="bad", model=name, version=version):
        producer.produce(TRAINING_EXAMPLES.name, key=example.event_id, value=encode(example))
    assert producer.flush(30) == 0
    producer.close()
    runner, env = CliRunner(), settings_environment(watched)

    first = runner.invoke(app, ["retrain", "watch", "--once"], env=env)
    assert first.exit_code == 0, first.output
    assert "fire (notify)" in first.output and f"prod v{version}" in first.output, first.output
    fired_ms = int(release.client.get_registered_model(name).tags[LAST_FIRED_TAG])

    second = runner.invoke(app, ["retrain", "watch", "--once"], env=env)
    assert second.exit_code == 0, second.output
    assert "quiet: cooling down" in second.output, second.output
    assert int(release.client.get_registered_model(name).tags[LAST_FIRED_TAG]) == fired_ms
    assert release.aliases(name) == {"prod": version}  # notify mode retrains nothing


def _signal_examples(count: int, model: str, version: str, now_ms: int) -> list[TrainingExample]:
    """``count`` examples of ``model`` scored in the last hour: fraud spends ~e^5, the rest ~e^3, and the logged scores
    (prod's: -0.01 per unit of amount) rank them backwards."""
    rng = np.random.default_rng(5)
    labels = rng.random(count) < 0.3
    amounts = np.where(labels, rng.lognormal(5, 0.5, count), rng.lognormal(3, 0.5, count))
    return [
        TrainingExample(
            schema_version=TrainingExample.SCHEMA_VERSION,
            event_id=f"sig-{i}",
            request_id=f"sig-req-{i}",
            entity_keys={"user_id": f"u{i}"},
            features={"request:amount": float(amounts[i])},
            model_name=model,
            model_version=version,
            score=float(1 / (1 + np.exp(0.01 * amounts[i]))),
            label=float(labels[i]),
            requested_at_ms=now_ms - HOUR_MS + i * 1_000,
            predicted_at_ms=now_ms - HOUR_MS + i * 1_000 + 3,
            label_time_ms=now_ms,
            joined_at_ms=now_ms,
        )
        for i in range(count)
    ]


@pytest.mark.stack
def test_retrain_mode_snapshots_trains_and_releases_the_better_model_as_a_canary(
    settings: Settings, bootstrap: str, tmp_path: Path
):
    from feedback_loop.snapshots import find_snapshot
    from loopline.retraining import trigger_step
    from schemas.topics import TopicSpec
    from streams.topics import apply_topics

    name, topic = f"retrained-{uuid.uuid4().hex[:8]}", f"test.examples.{uuid.uuid4().hex[:8]}"
    apply_topics(bootstrap, [TopicSpec(topic, TrainingExample, key="event_id", partitions=2, retention_ms=7 * 24 * HOUR_MS)])
    watched = settings.model_copy(
        update={
            "home": tmp_path / "home",
            "serving": ServingSettings(model_name=name),
            "model_registry": settings.model_registry.model_copy(
                update={"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db", "artifact_location": str(tmp_path / "artifacts")}
            ),
            "feedback": settings.feedback.model_copy(update={"examples_topic": topic, "train_processes": 1}),
            "retrain": RetrainSettings(mode="retrain", min_labels=200, canary_percent=50.0, owner="fraud-oncall"),
        }
    )
    release = model_release(watched)
    prod = release.register(name, write_linear_model(tmp_path / "prod.onnx", ["request:amount"], np.array([-0.01]), 0.0))
    release.promote(name, prod, "test", "the model the trigger judges")
    now_ms = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": bootstrap})
    # Another model's examples on the same topic are not this model's to train on.
    for example in [*_signal_examples(600, name, prod, now_ms), *examples(150, quality="good", model="other-model", seed=9)]:
        producer.produce(topic, key=example.event_id, value=encode(example))
    assert producer.flush(30) == 0

    decision, outcome = trigger_step(watched)

    assert decision.fire and "AUC" in decision.reason, decision
    assert outcome is not None and outcome.name == name
    manifest, _ = find_snapshot(watched.snapshots_root, outcome.snapshot_id)
    assert manifest.rows == 600 and manifest.source["model_name"] == name and manifest.features == ["request:amount"]
    metrics = json.loads((outcome.run_dir / "metrics.json").read_text())
    comparison = outcome.report.comparison
    assert metrics["snapshot_id"] == manifest.snapshot_id and comparison.candidate["auc"] > 0.9 > 0.2 > comparison.prod["auc"]
    assert outcome.report.verdict.register and outcome.report.card_path.exists()
    # The trigger's model card names the owner the settings give (retrain.owner), on the registry version too.
    assert outcome.report.card.owner == "fraud-oncall"
    assert release.client.get_model_version(name, outcome.report.version).tags["loopline.owner"] == "fraud-oncall"
    assert release.aliases(name) == {"prod": prod, "canary": outcome.report.version} and outcome.canary_percent == 50.0
    assert release.history(name)[-1].actor == TRIGGER_ACTOR and decision.reason in release.history(name)[-1].reason
    # The firing is recorded: the next look cools down instead of training again.
    again, nothing = trigger_step(watched)
    assert not again.fire and nothing is None
