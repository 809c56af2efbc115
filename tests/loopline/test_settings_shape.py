"""Kafka's replication settings follow the stack's shape (the brokers `stack up` started, remembered), and a setting
that contradicts the shape is refused with the fix. No stack."""

from __future__ import annotations

import os

import pytest

from loopline.settings import Settings, remember_stack_shape, settings_environment


@pytest.fixture(autouse=True)
def _no_settings_from_outside(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in [n for n in os.environ if n.startswith("LOOPLINE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LOOPLINE_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def _replication(**kafka: object) -> tuple[int, int]:
    return Settings(kafka=kafka).kafka.replication


def test_unset_replication_follows_the_brokers() -> None:
    assert _replication() == (1, 1)
    assert _replication(brokers=2) == (2, 1)
    assert _replication(brokers=3) == (3, 2)
    assert _replication(brokers=5) == (3, 2)
    assert _replication(bootstrap_servers=["k1:9092", "k2:9092", "k3:9092"]) == (1, 1), "a named cluster: set, not guessed"
    assert _replication(bootstrap_servers=["k:9092"], brokers=3) == (1, 1), "the stack's node count is not the cluster's"


def test_a_set_value_wins_and_the_other_follows_it() -> None:
    assert _replication(brokers=3, replication_factor=1) == (1, 1)
    assert _replication(brokers=3, replication_factor=2) == (2, 1)
    assert _replication(brokers=3, min_insync_replicas=3) == (3, 3)


def test_topics_follow_the_shape_stack_up_remembered(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    remember_stack_shape(tmp_path, {"kafka": {"brokers": 3}})
    kafka = Settings().kafka
    assert (kafka.brokers, *kafka.replication) == (3, 3, 2)
    monkeypatch.setenv("LOOPLINE_KAFKA__REPLICATION_FACTOR", "2")
    assert Settings().kafka.replication == (2, 1)


def test_a_child_process_follows_the_shape_too_unless_the_parent_set_the_replication() -> None:
    env = settings_environment(Settings(kafka={"brokers": 3}))
    assert env["LOOPLINE_KAFKA__BROKERS"] == "3" and "LOOPLINE_KAFKA__REPLICATION_FACTOR" not in env
    env = settings_environment(Settings(kafka={"brokers": 3, "replication_factor": 2}))
    assert env["LOOPLINE_KAFKA__REPLICATION_FACTOR"] == "2" and "LOOPLINE_KAFKA__MIN_INSYNC_REPLICAS" not in env


@pytest.mark.parametrize(
    ("kafka", "says"),
    [
        ({"replication_factor": 3}, "replication_factor 3 needs as many brokers; the stack starts 1 — fix: leave"),
        ({"brokers": 3, "replication_factor": 4}, "the stack starts 3 — fix: leave kafka.replication_factor unset"),
        ({"min_insync_replicas": 2}, "min_insync_replicas (2) exceeds kafka.replication_factor (1)"),
        ({"brokers": 3, "replication_factor": 2, "min_insync_replicas": 3}, "fix: set kafka.min_insync_replicas to at most 2"),
    ],
)
def test_a_setting_that_contradicts_the_shape_is_refused_with_the_fix(kafka: dict, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        Settings(kafka=kafka)
    assert says in str(refused.value)
