"""The feature job's JVM writer (``OnlineRowSink``) leaves in Redis exactly what the Python ``OnlineWriter`` leaves.

Random online rows of both views (counts, negative and huge numbers, missing values, entities in any script, two rows
of one entity in one batch, rows older than the stored one) go through the real sink in a PyFlink job, and the same
rows, for twin entities, through ``OnlineWriter``: every hash is the same, field by field and byte by byte, with the
same expiry, and Feast's own ``get_online_features`` reads from the sink's hashes each entity's newest row. Real
Flink, Redis and Feast.
"""

from __future__ import annotations

import dataclasses
import random
import uuid

import pytest
import redis

from feature_store.config import feature_store
from feature_store.online_read import OnlineReader
from feature_store.online_write import FeatureRow, OnlineWriter
from feature_store.view_state import views_key
from loopline.components import feature_plan, job_settings
from loopline.settings import Settings
from streams.feature_job import feature_columns, new_environment, row_type, steps_columns, view_generations
from streams.feature_plan import ViewPlan

RUN = uuid.uuid4().hex[:6]
#: The keys' expiry both writers give them: the template's views' ttl (2 days), the repo's config setting no
#: key_ttl_seconds.
TTL_S = 2 * 86_400


def _rows(view: ViewPlan, rng: random.Random, entities: list[str]) -> list[tuple]:
    """Online rows of ``view`` (``feature_columns(view, online=True)``): several per entity, in a random order."""
    rows = []
    for entity in entities:
        for _ in range(rng.randint(1, 3)):
            latest = rng.choice([1_790_000_000_000, 1_790_000_000_000 + rng.randint(0, 10**9), 1_000, 4_102_444_800_123])
            features = []
            for a in view.aggregations:
                if rng.random() < 0.15 and a.function not in ("count", "count_distinct"):
                    features.append(None)
                elif a.function in ("count", "count_distinct"):
                    features.append(rng.choice([0, 1, 7, 2**40, 2**63 - 1, -3]))
                else:
                    features.append(rng.choice([0.0, -0.0, 1.5, -2.25e-7, 9.0e9, rng.uniform(-1e6, 1e6)]))
            steps = [rng.randbytes(rng.choice([8, 24, 200])) for _ in steps_columns(view)]
            absorbed = ",".join(f"{p}:{rng.randint(0, 10**12)}" for p in sorted(rng.sample(range(12), rng.randint(0, 3))))
            rows.append((entity, latest * 1000, latest, rng.randint(1, 5), absorbed, *steps, *features))
    rng.shuffle(rows)
    return rows


@pytest.mark.timeout(300)
def test_the_jvm_writer_writes_what_the_python_writer_writes(applied: Settings, tmp_path) -> None:
    from pyflink.common import Row
    from pyflink.java_gateway import get_gateway

    plan = feature_plan(applied)
    settings = dataclasses.replace(job_settings(applied), checkpoint_dir=str(tmp_path / "checkpoints"), parallelism=1)
    writer = OnlineWriter(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    rng = random.Random(20)
    env = new_environment(settings)
    written: dict[str, tuple[ViewPlan, list[tuple]]] = {}
    writer.redis.delete(views_key(writer.project))  # this plan's rows serve at once (another test's job may have left others)
    generations = view_generations(writer, plan)
    for view in plan.views:
        entities = [f"sink-{RUN}-{name}" for name in ("a", "ünïcødé-名前", "x" * 200, "", "b", "c")]
        rows = _rows(view, rng, entities)
        written[view.name] = (view, rows)
        layout = writer.jvm_layout(generations[view.name][0], view.feature_names, max_batch_rows=3)
        source = env.from_collection([Row(*row) for row in rows], type_info=row_type(feature_columns(view, online=True)))
        source._j_data_stream.sinkTo(get_gateway().jvm.dev.loopline.streams.OnlineRowSink(layout))
    env.execute("online row sink test")

    client = redis.Redis(host=applied.redis.host, port=applied.redis.port)
    reader = OnlineReader(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    store = feature_store(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    for view, rows in written.values():
        windows = list(reader.layout.views[view.name].windows)
        for entity, _, latest, events, absorbed, *values in rows:  # one write each: Python's writer keeps a batch's newest too
            steps, features = values[: len(windows)], values[len(windows) :]
            writer.write(
                [
                    FeatureRow(
                        view.name,
                        f"py-{entity}",
                        latest * 1000,
                        dict(zip(view.feature_names, features, strict=True)),
                        events,
                        dict(zip(windows, steps, strict=True)),
                        absorbed,
                        generations[view.name][0].identity,
                    )
                ]
            )
        entities = sorted({row[0] for row in rows})
        for entity in entities:
            jvm_key, python_key = (reader.layout.redis_key(view.entity_keys, (e,)) for e in (entity, f"py-{entity}"))
            jvm, python = client.hgetall(jvm_key), client.hgetall(python_key)
            assert jvm and jvm == python, entity
            assert TTL_S - 60 <= client.ttl(jvm_key) <= TTL_S and abs(client.ttl(jvm_key) - client.ttl(python_key)) <= 60, entity
        names = [f"{view.name}:{name}" for name in view.feature_names]
        by_feast = store.get_online_features(names, [{view.entity_key: e} for e in entities]).to_dict()
        newest = {entity: max((r for r in rows if r[0] == entity), key=lambda r: (r[2], r[3])) for entity in entities}
        for i, entity in enumerate(entities):
            expected = dict(zip(view.feature_names, newest[entity][5 + len(windows) :], strict=True))
            assert {n: by_feast[n][i] for n in view.feature_names} == expected, entity
