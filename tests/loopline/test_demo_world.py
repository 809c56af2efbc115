"""The demo's world on the real stack: its history goes out at once and unscored, then every live transaction is
scored once and only the scored ones' labels are published; and the demo's own check of its promises."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from infra.service import wait_until
from loopline.scenarios.demo import unkept_promises
from loopline.scenarios.demo_loop import DemoLoop
from loopline.scenarios.demo_scoring import DemoScoring
from loopline.scenarios.demo_world import DemoWorld
from loopline.settings import Settings
from schemas.records import ScoreRequest
from schemas.topics import SCORE_REQUESTS
from schemas.validation import decode
from streams.topics import read_topic
from tests.support.templates import FRAUD, LABELS, TRANSACTIONS

HISTORY_S, RATE = 30.0, 100.0


def test_history_goes_at_once_unscored_then_live_transactions_are_each_scored_once(applied: Settings, tmp_path: Path) -> None:
    scoring = DemoScoring(applied, tmp_path / "models")
    world = DemoWorld(applied, scoring, RATE, HISTORY_S, malformed_rate=0.0, label_delay_s=(0.2, 1.0))
    world.start()
    try:
        assert wait_until(lambda: world.stream_time_ms >= time.time() * 1000 - 500, 30, 0.1), "the history never caught up"
        world.go_live()
        time.sleep(4)  # a few seconds of the live world: the thing measured, not a wait for a condition
    finally:
        stats = world.stop()

    bootstrap = applied.kafka.bootstrap

    def published(topic: str, read):
        return [(m.timestamp()[1], read(m.value())) for m in read_topic(bootstrap, topic, since_ms=world.published_from_ms)]

    transactions = published(TRANSACTIONS.name, FRAUD.decoder(TRANSACTIONS.name))
    requests = published(SCORE_REQUESTS.name, lambda payload: decode(ScoreRequest, payload))
    labels = [label for _, label in published(LABELS.name, FRAUD.decoder(LABELS.name))]
    assert stats.delivered[TRANSACTIONS.name] == len(transactions)

    history = [(sent, t) for sent, t in transactions if t.event_time_ms < world.published_from_ms]
    # The stream's bursts (4x its base rate, 2-10 s long) make 30 s of history vary widely (4,539 seen in CI, 1.5x
    # RATE * HISTORY_S): the bounds lie below a world with no burst (0.77x) and above one all burst (3.1x).
    assert 0.5 * RATE * HISTORY_S < len(history) < 4 * RATE * HISTORY_S, len(history)
    assert min(t.event_time_ms for _, t in history) >= world.history_from_ms - 600_000, "late events reach back at most 10 min"
    assert max(sent for sent, _ in history) - world.published_from_ms < 5_000, "the history went out at once"

    scored = Counter(r.event_id for _, r in requests)
    assert scored and max(scored.values()) == 1, "every scored transaction scored once"
    assert sum(t.event_id not in scored for _, t in transactions) == world.history_published, "the unscored are the history"
    by_id = {t.event_id: (sent, t) for sent, t in transactions}
    assert set(scored) <= set(by_id), "every request names a transaction of this world"
    assert all(by_id[event][0] >= world.live_since_ms - 50 for event in scored), "nothing of the history was scored"
    live = [t for sent, t in transactions if sent > world.live_since_ms + 50]
    assert live and all(t.event_id in scored for t in live), "every live transaction was scored"
    assert all(
        r.request_id.startswith(f"{scoring.run_id}-") and r.entity_keys == {"user_id": by_id[r.event_id][1].user_id}
        for _, r in requests
    )
    assert len({r.request_id for _, r in requests}) == len(requests), "each request has its own id"
    assert labels and all(label.event_id in scored for label in labels), "only scored transactions' labels are published"


def test_the_demo_names_each_promise_it_did_not_keep(applied: Settings) -> None:
    loop = DemoLoop(applied, "demo-test")
    for step in loop.steps.values():
        step.state = "done"
    kept = {
        "release": "promote",
        "skew_injected": True,
        "skew_alerting_features": ["request:amount"],
        "skew_injected_features": ["request:amount"],
        "skew_pending_features": [],
        "prometheus_answered": True,
    }
    assert unkept_promises(kept, loop) == []
    assert unkept_promises({**kept, "release": "rollback"}, loop) == [], "a rollback is a verdict too"

    two_alerts = {**kept, "skew_alerting_features": ["request:amount", "user_transaction_features:txn_count_5m"]}
    assert unkept_promises(two_alerts, loop) == [
        "skew alerts fired for ['request:amount', 'user_transaction_features:txn_count_5m'], "
        "the skew was injected into ['request:amount']"
    ]
    assert unkept_promises({**kept, "skew_alerting_features": []}, loop) == [
        "skew alerts fired for no feature, the skew was injected into ['request:amount']"
    ]
    assert unkept_promises({**kept, "skew_injected": False}, loop)[0].startswith("the skew was never injected")
    assert unkept_promises({**kept, "skew_pending_features": ["request:amount"]}, loop) == [], (
        "the injected one may still be pending"
    )
    assert unkept_promises({**kept, "skew_pending_features": ["user_transaction_features:amount_sum_1h"]}, loop) == [
        "skew alerts are pending for ['user_transaction_features:amount_sum_1h'], which nobody skewed"
    ]
    assert unkept_promises({**kept, "prometheus_answered": False, "skew_alerting_features": []}, loop) == [
        "Prometheus did not answer: which skew alerts fired is unknown"
    ]

    training = loop.steps["train, evaluate, release"]
    training.state, training.detail = "failed", "RuntimeError: not registered"
    loop.steps["controller"].state = "skipped"
    assert unkept_promises({**kept, "release": None}, loop) == [
        "the loop's step 'train, evaluate, release' failed: RuntimeError: not registered"
    ]
    training.state, training.detail = "running", ""
    assert unkept_promises({**kept, "release": None}, loop) == [
        "the loop's step 'train, evaluate, release' was still running when the demo's time ran out"
    ]
