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

Windows at request time. Without a read time the values are the job's finished ones, as of each entity's latest
event: what Feast's ``get_online_features`` returns. Given a read time per entity (the request's time), each windowed
feature is as of that time (``feature_store/window_tiles.py``): the same round trip also reads the marker of the
entity's tiles, and only for a slide length whose oldest tile with events has left one of its windows by then are
that slide's tiles read, in a second pipelined round trip for all such entities, and merged here. An entity with an
event inside every window costs one field more than before; a quiet one costs a second round trip. The two trips
are not one transaction: a tile the job rewrote between them comes back with the events it absorbed since, while
the tiles read stop at the first trip's latest event (a newer one's tile waits for the next read).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

from feature_store.config import REPO_PATH, feature_fields, feature_store
from feature_store.defaults import declared_default
from feature_store.online_layout import OnlineLayout, ViewLayout
from feature_store.redis_connection import redis_client
from feature_store.window_tiles import AggregationSpec, TileShape, decode_tile, parse_marker, window_values

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
        self, features: list[str], entity_rows: list[dict[str, str]], at_ms: Sequence[int] | None = None
    ) -> tuple[dict[str, list], dict[str, list[int | None]]]:
        """:meth:`get_online_features`, and per view the event time (ms) of each entity's row as read, None for
        none: in the same round trip, so the time is that of the values returned. With ``at_ms`` (a read time per
        row, epoch ms), windowed features are as of those times (the module's docstring)."""
        from google.protobuf.timestamp_pb2 import Timestamp

        by_view: dict[str, list[str]] = {}
        for reference in features:
            view, feature = reference.split(":", 1)
            by_view.setdefault(view, []).append(feature)
        pipe = self._redis.pipeline(transaction=False)
        for view, names in by_view.items():
            layout = self._views[view]
            fields = [*(layout.fields[name] for name in names), layout.timestamp_field]
            if at_ms is not None and layout.shapes:
                fields.append(layout.tiles_field)
            for row in entity_rows:
                pipe.hmget(self._redis_key(layout.join_key, row[layout.join_key]), fields)
        replies = iter(pipe.execute())
        result: dict[str, list] = {}
        row_times: dict[str, list[int | None]] = {}
        for row in entity_rows:
            for key, value in row.items():
                result.setdefault(key, []).append(value)
        merges: list[tuple[list, int, list, int, int, list]] = []  # column values, row, plan, read time, latest, slots
        for view, names in by_view.items():
            columns, times = [result.setdefault(name, []) for name in names], row_times.setdefault(view, [])
            tiled = at_ms is not None and bool(self._views[view].shapes)
            plan = _by_slide(self._views[view], names) if tiled else []
            for i, row in enumerate(entity_rows):
                reply = next(replies)
                *raws, stamp, marker = reply if tiled else (*reply, None)
                for column, raw in zip(columns, raws, strict=True):
                    column.append(None if raw is None else self._decode(raw))
                times.append(None if stamp is None else _millis(Timestamp.FromString(stamp)))
                if marker is not None:
                    assert at_ms is not None
                    latest, rings = parse_marker(marker)
                    slots = _tiles_to_merge(self._views[view], plan, rings, at_ms[i], latest)
                    if any(fields is not None for fields in slots):
                        key = self._redis_key(self._views[view].join_key, row[self._views[view].join_key])
                        merges.append((columns, i, plan, at_ms[i], latest, [(key, fields) for fields in slots]))
        if merges:
            self._merge(merges)
        return result, row_times

    def _merge(self, merges: list) -> None:
        """Read, in one pipelined round trip, the tiles each of ``merges`` needs, and put the values merged from them
        at its read time in its columns."""
        pipe = self._redis.pipeline(transaction=False)
        for *_, slots in merges:
            for key, fields in slots:
                if fields:
                    pipe.hmget(key, fields)
        replies = iter(pipe.execute())
        for columns, i, plan, at, latest, slots in merges:
            for (shape, positions, aggregations), (_, fields) in zip(plan, slots, strict=True):
                if fields is None or not positions:
                    continue
                tiles = dict(decode_tile(raw) for raw in next(replies) if raw is not None) if fields else {}
                for position, value in zip(positions, window_values(tiles, shape, aggregations, at, latest), strict=True):
                    columns[position][i] = value

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


def _by_slide(layout: ViewLayout, names: list[str]) -> list[tuple[TileShape, list[int], list[AggregationSpec]]]:
    """Per slide length of a windowed view, in the marker's order: its shape, and the positions among ``names`` and
    the aggregations of the windowed features on it."""
    plan = []
    for shape in layout.shapes.values():
        on_slide = [(i, layout.aggregations[name]) for i, name in enumerate(names)
                    if name in layout.aggregations and layout.aggregations[name].slide_ms == shape.slide_ms]  # fmt: skip
        plan.append((shape, [i for i, _ in on_slide], [a for _, a in on_slide]))
    return plan


def _tiles_to_merge(layout: ViewLayout, plan: list, rings: dict[int, tuple[int, int]], at_ms: int, latest_ms: int) -> list[list[bytes] | None]:
    """Per slide length of ``plan``, the tile fields a read at ``at_ms`` merges, or None where the finished values hold:
    no tile with events (``rings[slide]``: the job's ring size and oldest kept tile with events) has left the shortest
    window read on it, or the job's tiles of that slide length are not in the registry's ring (the views changed and
    the job has not restarted since). The fields are those a window can then hold: from the oldest kept with events,
    or the oldest any window reaches, to the latest event's."""
    slots: list[list[bytes] | None] = []
    head_ms = max(at_ms, latest_ms)
    for shape, positions, aggregations in plan:
        kept, first = rings.get(shape.slide_ms, (None, None))
        if not positions or kept != shape.kept or first is None or first > shape.tile_of(head_ms) - min(a.window_buckets for a in aggregations):
            slots.append(None)
            continue
        slots.append([layout.tile_field(shape.slide_ms, k) for k in range(max(first, shape.oldest_kept(head_ms)), shape.tile_of(latest_ms) + 1)])
    return slots


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

