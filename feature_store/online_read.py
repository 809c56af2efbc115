"""The fast online read path: feature vectors straight from Redis, in Feast's own layout.

It returns exactly what Feast's ``get_online_features(...).to_dict()`` returns for the same keys
(values, ``None`` for a missing entity or feature; like Feast's, rows past the view's TTL are
still returned), with one pipelined
round trip for all entities and views and no per-call registry work: the Redis keys and hashed
field names are computed once, when the reader is built from the registry (``feature_store/online_layout.py``,
the layout the writer uses too).

On a Redis Cluster (the Feast config's ``redis_type: redis_cluster``) the same pipeline is redis-py's cluster
pipeline: Feast's layout keeps all of an entity's views in one hash under one key, so every command names a single
key (never a cross-slot one); the commands are grouped by the master of their key's slot and sent to all masters
before any reply is read, still one round trip. A master that does not answer fails the read (the scorer answers
on defaults) until the cluster has failed it over to its replica and the client has learnt the new layout.
"""

from __future__ import annotations

import struct
from pathlib import Path

from feature_store.config import REPO_PATH, feature_fields, feature_store
from feature_store.defaults import declared_default
from feature_store.online_layout import OnlineLayout
from feature_store.redis_connection import redis_client

#: Wire tags of Feast's Value proto: field 5 (double_val, 64-bit) and field 4 (int64_val, varint).
_DOUBLE_TAG, _INT64_TAG = (5 << 3) | 1, (4 << 3) | 0
_DOUBLE = struct.Struct("<d")


class OnlineReader:
    """Reads feature vectors of registered feature views from the Redis online store."""

    def __init__(
        self,
        feast_registry_path: Path | None,
        redis_connection: str,
        repo_path: Path = REPO_PATH,
        timeout_s: float | None = None,
        *,
        redis_cluster: bool = False,
    ) -> None:
        """``timeout_s`` bounds connecting and each reply (None: wait as long as Redis takes); ``redis_cluster``: the
        connection names a Redis Cluster's nodes."""
        from feast.protos.feast.types.Value_pb2 import Value

        store = feature_store(feast_registry_path, redis_connection, repo_path, redis_cluster=redis_cluster)
        self._value = Value
        views = [*store.list_feature_views(), *store.list_stream_feature_views()]
        #: The default each feature declares ("view:feature" -> value or None), for callers that fall back.
        self.defaults = {f"{view.name}:{f.name}": declared_default(f) for view in views for f in feature_fields(view)}
        #: Where each view's rows are in Redis (the writer's layout too).
        self.layout = OnlineLayout(store.config, views)
        self._views, self._redis_key = self.layout.views, self.layout.redis_key
        online_store = store.config.online_store
        self._redis = redis_client(online_store.connection_string, timeout_s, cluster=online_store.redis_type == "redis_cluster")

    def join_keys(self, features: list[str]) -> set[str]:
        """The entity join keys a read of ``features`` needs in each row."""
        return {self._views[reference.split(":", 1)[0]].join_key for reference in features}

    def get_online_features(self, features: list[str], entity_rows: list[dict[str, str]]) -> dict[str, list]:
        """Like Feast's ``get_online_features(features, entity_rows).to_dict()`` (without full feature names)."""
        return self.read_with_row_times(features, entity_rows)[0]

    def read_with_row_times(
        self, features: list[str], entity_rows: list[dict[str, str]]
    ) -> tuple[dict[str, list], dict[str, list[int | None]]]:
        """:meth:`get_online_features`, and per view the event time (ms) of each entity's row as read, None for
        none: in the same round trip, so the time is that of the values returned."""
        from google.protobuf.timestamp_pb2 import Timestamp

        by_view: dict[str, list[str]] = {}
        for reference in features:
            view, feature = reference.split(":", 1)
            by_view.setdefault(view, []).append(feature)
        pipe = self._redis.pipeline(transaction=False)
        for view, names in by_view.items():
            layout = self._views[view]
            fields = [*(layout.fields[name] for name in names), layout.timestamp_field]
            for row in entity_rows:
                pipe.hmget(self._redis_key(layout.join_key, row[layout.join_key]), fields)
        replies = iter(pipe.execute())
        result: dict[str, list] = {}
        row_times: dict[str, list[int | None]] = {}
        for row in entity_rows:
            for key, value in row.items():
                result.setdefault(key, []).append(value)
        for view, names in by_view.items():
            columns, times = [result.setdefault(name, []) for name in names], row_times.setdefault(view, [])
            for _ in entity_rows:
                *raws, stamp = next(replies)
                for column, raw in zip(columns, raws, strict=True):
                    column.append(None if raw is None else self._decode(raw))
                times.append(None if stamp is None else _millis(Timestamp.FromString(stamp)))
        return result, row_times

    def row_timestamps_us(self, view: str, entities: list[str]) -> list[int | None]:
        """When each entity's row was computed (its event time, in microseconds), or None if it has none."""
        from google.protobuf.timestamp_pb2 import Timestamp

        layout = self._views[view]
        pipe = self._redis.pipeline(transaction=False)
        for entity in entities:
            pipe.hget(self._redis_key(layout.join_key, entity), layout.timestamp_field)
        stamps = [None if raw is None else Timestamp.FromString(raw) for raw in pipe.execute()]
        return [None if s is None else s.seconds * 1_000_000 + s.nanos // 1_000 for s in stamps]

    def _decode(self, raw: bytes):
        """A Feast ValueProto's Python value; doubles and int64s (most features) are read directly."""
        if len(raw) == 9 and raw[0] == _DOUBLE_TAG:
            return _DOUBLE.unpack_from(raw, 1)[0]
        if raw and raw[0] == _INT64_TAG and 1 < len(raw) <= 10:
            return _varint_int64(raw, 1)
        value = self._value.FromString(raw)
        kind = value.WhichOneof("val")
        return None if kind is None or kind == "null_val" else getattr(value, kind)


def _millis(stamp) -> int:
    """A protobuf Timestamp in epoch milliseconds."""
    return stamp.seconds * 1000 + stamp.nanos // 1_000_000


def _varint_int64(raw: bytes, start: int) -> int:
    """Protobuf varint at ``start`` as a signed 64-bit integer (two's complement)."""
    result, shift = 0, 0
    for byte in raw[start:]:
        result |= (byte & 0x7F) << shift
        shift += 7
    return result - (1 << 64) if result >= 1 << 63 else result

