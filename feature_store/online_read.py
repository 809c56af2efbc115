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
feature is as of that time (``feature_store/window_tiles.py``): a small Redis script, one per entity and one key as
before, returns the finished values and, only for a slide length whose oldest tile with events has left a window by
then, that slide's tiles, which are merged here (exactly: Lua has only doubles). An entity with an event inside every
window costs one script call instead of an HMGET; a quiet one also sends its tiles.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

from redis.exceptions import NoScriptError

from feature_store.config import REPO_PATH, feature_fields, feature_store
from feature_store.defaults import declared_default
from feature_store.online_layout import OnlineLayout, ViewLayout
from feature_store.redis_connection import redis_client
from feature_store.window_tiles import AggregationSpec, TileShape, decode_tile, parse_marker, window_values

#: Wire tags of Feast's Value proto: field 5 (double_val, 64-bit) and field 4 (int64_val, varint).
_DOUBLE_TAG, _INT64_TAG = (5 << 3) | 1, (4 << 3) | 0
_DOUBLE = struct.Struct("<d")

#: KEYS[1]: the entity's hash. ARGV: the read time (ms), the number n of plain fields, the fields (the marker last),
#: then per slide length in the marker's order: the length (ms), the shortest window on it (in slides), how many
#: tiles it keeps, and their fields' prefix. Returns the plain fields' values, then per slide length, when a tile
#: with events has left one of its windows by the read time, the slots of the tiles a window at that time can hold
#: (from the oldest kept with events, or the oldest any window then reaches, to the latest event's); else nil.
_WINDOWS_AT = """
local n = tonumber(ARGV[2])
local plain = redis.call('HMGET', KEYS[1], unpack(ARGV, 3, 2 + n))
local result = {plain}
local marker = plain[n]
if not marker then return result end
local latest, rest = string.match(marker, '^(%d+)(.*)$')
latest = tonumber(latest)
local at = math.max(tonumber(ARGV[1]), latest)
local i = 3 + n
for oldest in string.gmatch(rest, ',(%d+)') do
  local slide, span, kept, prefix = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  i = i + 4
  local head = math.floor(at / slide)
  if tonumber(oldest) <= head - span then
    local slots = {}
    for k = math.max(tonumber(oldest), head - kept + 1), math.floor(latest / slide) do
      slots[#slots + 1] = prefix .. string.format('%d', k % kept)
    end
    result[#result + 1] = #slots > 0 and redis.call('HMGET', KEYS[1], unpack(slots)) or {}
  else
    result[#result + 1] = false
  end
end
return result
"""


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
        self._windows_at: bytes | None = None  # the script's SHA, once loaded
        #: Per windowed view, the script's arguments after the plain fields (see ``_WINDOWS_AT``).
        self._slide_args = {name: _slide_args(layout) for name, layout in self._views.items() if layout.shapes}

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
        try:
            replies = iter(self._replies(by_view, entity_rows, at_ms))
        except NoScriptError:  # Redis restarted, or failed over, since the script was loaded
            self._windows_at = None
            replies = iter(self._replies(by_view, entity_rows, at_ms))
        result: dict[str, list] = {}
        row_times: dict[str, list[int | None]] = {}
        for row in entity_rows:
            for key, value in row.items():
                result.setdefault(key, []).append(value)
        for view, names in by_view.items():
            columns, times = [result.setdefault(name, []) for name in names], row_times.setdefault(view, [])
            tiled = at_ms is not None and view in self._slide_args
            plan = _by_slide(self._views[view], names) if tiled else []
            for i in range(len(entity_rows)):
                reply = next(replies)
                if tiled:
                    (*raws, stamp, marker), *slides = reply
                    values = [None if raw is None else self._decode(raw) for raw in raws]
                    if any(slots is not None for slots in slides):
                        _merge(plan, values, marker, slides, at_ms[i])
                else:
                    *raws, stamp = reply
                    values = [None if raw is None else self._decode(raw) for raw in raws]
                for column, value in zip(columns, values, strict=True):
                    column.append(value)
                times.append(None if stamp is None else _millis(Timestamp.FromString(stamp)))
        return result, row_times

    def _replies(self, by_view: dict[str, list[str]], entity_rows: list[dict[str, str]], at_ms: Sequence[int] | None) -> list:
        """One pipelined round trip: per view and row, an HMGET of the features and the row's time, or with ``at_ms``
        for a windowed view the script that adds the marker and the tiles a read at that time merges."""
        if at_ms is not None and self._windows_at is None and any(view in self._slide_args for view in by_view):
            self._windows_at = self._redis.script_load(_WINDOWS_AT)
        pipe = self._redis.pipeline(transaction=False)
        for view, names in by_view.items():
            layout = self._views[view]
            fields = [*(layout.fields[name] for name in names), layout.timestamp_field]
            if at_ms is not None and view in self._slide_args:
                fields.append(layout.tiles_field)
                for row, at in zip(entity_rows, at_ms, strict=True):
                    # a plain command: redis-py's cluster pipeline has no evalsha(), but routes EVALSHA by its one key
                    pipe.execute_command("EVALSHA", self._windows_at, 1, self._redis_key(layout.join_key, row[layout.join_key]),
                                         at, len(fields), *fields, *self._slide_args[view])  # fmt: skip
            else:
                for row in entity_rows:
                    pipe.hmget(self._redis_key(layout.join_key, row[layout.join_key]), fields)
        return pipe.execute()

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


def _slide_args(layout: ViewLayout) -> list:
    """The script's per-slide arguments for a windowed view: length, shortest window in slides, tiles kept, prefix."""
    args: list = []
    for slide, shape in layout.shapes.items():
        span = min(a.window_buckets for a in layout.aggregations.values() if a.slide_ms == slide)
        args += [slide, span, shape.kept, layout.tile_prefix(slide)]
    return args


def _by_slide(layout: ViewLayout, names: list[str]) -> list[tuple[TileShape, list[int], list[AggregationSpec]]]:
    """Per slide length of the view, in the marker's order: its shape, and the positions among ``names`` and the
    aggregations of the windowed features on it."""
    plan = []
    for slide, shape in layout.shapes.items():
        on_slide = [(i, layout.aggregations[name]) for i, name in enumerate(names)
                    if name in layout.aggregations and layout.aggregations[name].slide_ms == slide]  # fmt: skip
        plan.append((shape, [i for i, _ in on_slide], [a for _, a in on_slide]))
    return plan


def _merge(plan: list, values: list, marker: bytes, slides: list, at_ms: int) -> None:
    """Replace in ``values`` each windowed one whose slide's tiles came back (``plan``: :func:`_by_slide`) with its value
    merged from them at ``at_ms``."""
    latest, _ = parse_marker(marker)
    for (shape, positions, aggregations), slots in zip(plan, slides, strict=True):
        if slots is not None and positions:
            tiles = dict(decode_tile(raw) for raw in slots if raw is not None)
            for i, value in zip(positions, window_values(tiles, shape, aggregations, at_ms, latest), strict=True):
                values[i] = value


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

