"""No event stops the feature job: Hypothesis-generated transactions (hostile values, odd text, raw bytes).

Each record is either aggregated (and the online features of its entity equal the offline recompute)
or dead-lettered once with its reason; the job is still running afterwards and a valid event still
reaches Redis. Real Kafka, Redis, Flink and Feast.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections import Counter
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from feature_store.config import feature_store
from feature_store.online_read import OnlineReader
from infra.service import wait_until
from loopline.job_processes import start_feature_job, stop_process_group
from loopline.settings import Settings
from schemas.records import DeadLetterRecord
from schemas.topics import DAY_MS, TopicSpec
from schemas.validation import decode, encode
from streams.feature_plan import compile_plan
from streams.producer import EventProducer
from streams.recompute import accepted_events, feature_differences, recompute
from streams.topics import apply_topics, read_topic
from streams.world import Emitted
from tests.support.templates import FRAUD, TRANSACTIONS, TransactionEvent

SOURCE = TopicSpec("test.fuzz", TransactionEvent, key="user_id", partitions=1, retention_ms=DAY_MS)
DEAD = TopicSpec("test.fuzz.dlq", DeadLetterRecord, key="source_topic", partitions=1, retention_ms=DAY_MS)
NOW_MS = int(time.time() * 1000)

_text = st.text(max_size=8)


def _mostly(good: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` nine times in ten, else ``hostile``: most events stay valid, so aggregation is exercised too."""
    return st.integers(0, 9).flatmap(lambda n: hostile if n == 0 else good)


_event = st.fixed_dictionaries(
    {
        "schema_version": _mostly(st.just(1), st.sampled_from([0, 2, "1", None])),
        "event_id": _text,
        "event_time_ms": _mostly(st.integers(NOW_MS - 3_000, NOW_MS), st.integers(-(2**63), 2**70)),
        "user_id": _mostly(st.sampled_from(["fz-a", "fz-b", "fz-c"]), st.one_of(_text, st.text(min_size=300, max_size=400))),
        "merchant_id": _mostly(st.sampled_from(["fm-1", "fm-2"]), _text),
        "amount": _mostly(
            st.floats(0, 10_000), st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**20))
        ),
        "currency": _mostly(st.just("EUR"), st.sampled_from(["eur", "", "EURO"])),
        "merchant_category": _mostly(st.just("grocery"), _text),
        "channel": _mostly(st.sampled_from(["online", "pos", "atm"]), st.just("fax")),
        "country": _mostly(st.sampled_from(["DE", "FR"]), st.sampled_from(["D", "123", ""])),
    }
)


def test_fuzzed_events_never_stop_the_feature_job(applied: Settings, tmp_path: Path) -> None:
    payloads: list[bytes] = []

    # Derandomized: the same records every run, so the share of valid ones (asserted below) is the same too.
    @hypothesis_settings(
        max_examples=400, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(event=_event, raw=st.binary(max_size=100), as_raw=st.integers(0, 9))
    def collect(event: dict, raw: bytes, as_raw: int) -> None:
        payloads.append(raw if as_raw == 0 else json.dumps(event).encode())

    collect()
    apply_topics(applied.kafka.bootstrap, [SOURCE, DEAD])
    emitted = [Emitted(SOURCE.name, f"fuzz-{n}", value, NOW_MS, None) for n, value in enumerate(payloads)]
    EventProducer(applied.kafka.bootstrap).publish(emitted)

    job = start_feature_job(
        applied,
        tmp_path / "job.log",
        LOOPLINE_STREAM__SOURCE_TOPICS=json.dumps({TRANSACTIONS.name: SOURCE.name}),
        LOOPLINE_STREAM__DEAD_LETTER_TOPIC=DEAD.name,
        LOOPLINE_STREAM__GROUP_ID=f"fuzz-{uuid.uuid4().hex[:8]}",
        LOOPLINE_STREAM__OFFLINE_DIR=str(tmp_path / "offline"),
        LOOPLINE_STREAM__CHECKPOINT_INTERVAL_MS="1000",
    )
    try:
        views = feature_store(
            applied.feast_registry_path, applied.redis_connection, applied.repo_path
        ).list_stream_feature_views()
        plan = compile_plan(views, FRAUD).reading({TRANSACTIONS.name: SOURCE.name})
        # A valid event sent after all of them is still aggregated: the job survived.
        probe = TransactionEvent(
            schema_version=1,
            event_id="probe",
            event_time_ms=int(time.time() * 1000),
            user_id="fz-probe",
            merchant_id="fm-1",
            amount=1.0,
            currency="EUR",
            merchant_category="grocery",
            channel="pos",
            country="DE",
        )
        EventProducer(applied.kafka.bootstrap).publish([Emitted(SOURCE.name, "fz-probe", encode(probe), NOW_MS, probe)])
        reader = OnlineReader(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
        seen = lambda: reader.row_timestamps_us("user_transaction_features", [{"user_id": "fz-probe"}])[0] is not None  # noqa: E731
        assert wait_until(lambda: seen() or job.poll() is not None, 180, 0.5) and job.poll() is None, (
            f"see {tmp_path / 'job.log'}"
        )
        messages = read_topic(applied.kafka.bootstrap, SOURCE.name)
        accepted, late = accepted_events(plan, SOURCE.name, messages)
        assert 50 < len(accepted) < len(messages) * 0.9, "a mix of good and bad records"

        expected = {view.name: recompute(view, accepted) for view in plan.views}

        def read(view, offline: pd.DataFrame) -> pd.DataFrame:
            values = reader.get_online_features(
                [f"{view.name}:{f}" for f in view.feature_names], [{view.entity_key: k} for k in offline[view.entity_key]]
            )
            return pd.DataFrame({view.entity_key: offline[view.entity_key], **{f: values[f] for f in view.feature_names}})

        problems: list[str] = []

        def agrees() -> bool:
            problems[:] = feature_differences(plan, expected, read)
            return not problems

        assert wait_until(agrees, 60, 0.5), problems[:5]

        # Every other record has exactly one dead letter, with a reason.
        def letters() -> Counter:
            records = [decode(DeadLetterRecord, m.value()) for m in read_topic(applied.kafka.bootstrap, DEAD.name)]
            return Counter((r.source_offset, r.reason) for r in records)

        refused = len(messages) - len(accepted)
        assert wait_until(lambda: sum(letters().values()) >= refused, 60, 0.5), f"{sum(letters().values())} of {refused}"
        counted = letters()
        assert sum(counted.values()) == refused and max(counted.values()) == 1
        reasons = Counter(reason for _, reason in counted)
        assert reasons["late"] == len(late) and set(reasons) <= {"invalid", "out_of_range", "late"}, reasons
        assert not math.isnan(accepted["amount"].sum())
    finally:
        stop_process_group(job)
