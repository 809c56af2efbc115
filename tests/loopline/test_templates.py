"""The delivery template's every view, streamed, equals the offline recompute: orders in JSON and courier pings in
Avro read by one job; views per restaurant, per courier, per zone (the key of neither topic) and per restaurant ×
zone (composite); a count distinct of strings and a courier's last zone (a string, ``last``). Its world sends events
out of order, late and broken, as producers do; the broken and late ones are dead-lettered, the rest counted.

(The fraud template's views: tests/streams/test_feature_job.py, through a crash.)
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections import Counter
from dataclasses import replace

import pytest
import redis

from feature_store.config import feature_store
from infra.service import wait_until
from loopline.components import feature_plan, project
from loopline.job_processes import start_feature_job, stop_process_group
from loopline.project import world_of
from loopline.settings import Settings
from schemas.records import DeadLetterRecord
from schemas.topics import DAY_MS, TopicSpec
from schemas.validation import decode
from streams.producer import EventProducer
from streams.recompute import accepted_events, feature_differences, recompute
from streams.topics import apply_topics, read_topic

#: Records of the delivery world (pings, orders, deliveries) published before the job starts: a backlog it reads.
RECORDS = 12_000
START_MS = 1_790_000_000_000


@pytest.mark.timeout(600)
def test_every_delivery_view_equals_the_recompute(delivery_applied: Settings) -> None:
    settings, run = delivery_applied, uuid.uuid4().hex[:8]
    # The stack's other tests write rows for the same synthetic entities with newer event times, which no older row
    # overwrites: this test compares the whole online store with its own recompute, so it starts from an empty one.
    redis.Redis(host=settings.redis.host, port=settings.redis.port).flushdb()
    declared = project(settings)
    plan = feature_plan(settings)
    # The views' topics, each under a name of this test's own (the job reads them by the mapping, as a replay would).
    routed = {topic: f"test.{run}.{topic}" for topic in plan.topics}
    specs = [replace(spec, name=routed[spec.name]) for spec in declared.topics if spec.name in routed]
    dead = TopicSpec(f"test.{run}.dlq", DeadLetterRecord, key="source_topic", partitions=1, retention_ms=DAY_MS)
    apply_topics(settings.kafka.bootstrap, [*specs, dead])
    world = world_of(declared, 11, START_MS, rate_per_s=400.0, malformed_rate=0.01, late_rate=0.01, label_delay_s=(1.0, 5.0))
    sent = [replace(e, topic=routed[e.topic]) for e in itertools.islice(world, RECORDS) if e.topic in routed]
    assert {e.topic for e in sent} == set(routed.values()) and sum(e.record is None for e in sent) > 20, (
        "both topics, broken records too"
    )
    EventProducer(settings.kafka.bootstrap).publish(sent)

    replayed = plan.reading(routed)
    accepted, late_by_topic = {}, {}
    for topic in replayed.topics:
        accepted[topic], late_events = accepted_events(replayed, topic, read_topic(settings.kafka.bootstrap, topic))
        late_by_topic[topic] = len(late_events)
    expected = {view.name: recompute(view, accepted[view.topic]) for view in replayed.views}
    assert {v.name for v in replayed.views if len(expected[v.name]) < 10} == set(), "many entities of every view"
    assert any(len(v.entity_keys) > 1 for v in replayed.views) and any(v.last_columns for v in replayed.views)

    store = feature_store(settings.feast_registry_path, settings.redis_connection, settings.repo_path)

    def online(view, offline):
        rows = [
            dict(zip(view.entity_keys, key if isinstance(key, tuple) else (key,), strict=True))
            for key in offline[view.entity_key]
        ]
        read = store.get_online_features(features=[f"{view.name}:{f}" for f in view.feature_names], entity_rows=rows).to_df()
        return read.assign(**{view.entity_key: list(offline[view.entity_key])})

    job = start_feature_job(
        settings,
        settings.home / f"job-{run}.log",
        restore=False,
        LOOPLINE_STREAM__SOURCE_TOPICS=json.dumps(routed),
        LOOPLINE_STREAM__DEAD_LETTER_TOPIC=dead.name,
        LOOPLINE_STREAM__GROUP_ID=f"template-features-{run}",
        LOOPLINE_STREAM__OFFLINE_DIR=str(settings.home / run),
    )
    problems: list[str] = []
    try:

        def agrees() -> bool:
            assert job.poll() is None, f"the job stopped; see {settings.home / f'job-{run}.log'}"
            problems[:] = feature_differences(replayed, expected, online)
            return not problems

        if not wait_until(agrees, 180, 2.0):
            pytest.fail(f"{len(problems)} online values differ from the recompute, e.g. {problems[:8]}")

        # What the job refused, by topic and reason (committed with its checkpoints): the broken records and the late
        # events of both topics, nothing else.
        broken = Counter(e.topic for e in sent if e.record is None)
        wanted = Counter(
            {**{(t, "invalid"): broken[t] for t in routed.values()}, **{(t, "late"): late_by_topic[t] for t in routed.values()}}
        )
        assert all(count > 0 for count in wanted.values()), wanted
        letters: Counter = Counter()

        def all_refused() -> bool:
            letters.clear()
            letters.update(
                (d.source_topic, d.reason)
                for d in (decode(DeadLetterRecord, m.value()) for m in read_topic(settings.kafka.bootstrap, dead.name))
            )
            return letters == wanted

        assert wait_until(all_refused, 60, 1.0), (letters, wanted)
    finally:
        stop_process_group(job)
