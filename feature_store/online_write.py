"""Batched writes of feature rows into the online store, in the layout of Feast's Redis store.

A row is the features of an entity as of its latest event (its event time) after the job absorbed ``events`` of
the entity's events (``SlidingWindows`` in ``streams/jvm``). The store orders an entity's rows by (event time,
events) and keeps only a newer one: an older event never overwrites a newer value, and a job restored from a
checkpoint, whose replay may interleave its partitions in another order than before the failure, still ends with
the row of every event it has absorbed (its order is never below a row it wrote before, and equal only for the
same events). Each row is one compare-and-set, atomic in Redis (a Lua script of one key, so it runs on the master
of the key's slot in a Redis Cluster); the rows of a batch go in one pipelined round trip.

The hash is Feast's own: its key, its hashed feature fields with serialized Value protos, and ``_ts:<view>`` the
event time as a protobuf Timestamp, so Feast's ``get_online_features`` reads the rows as it reads its own writes.
Beside them one field, ``_order:<view>``, holds ``<event time µs>:<events>``, the tie-break of rows of one event
time, and one, ``_absorbed:<view>``, the log positions behind the row (each partition's last absorbed offset): which
events it holds, exactly, however an entity's events spread over partitions (the consistency replay reads them). A row written by Feast itself (no such field) is replaced only by a row of a later event time. The keys and
fields come from ``feature_store/online_layout.py``, the layout the reader uses too.

Windowed views also keep, per window, the steps the job merged from the entity's tiles (``feature_store/window_tiles.py``),
each in a field of its own written with the row, under its compare-and-set: the row and its steps are always of the
same events. A row without steps for a window (one written by hand, not by the job) deletes that window's field, so
a read at request time falls back to the row's finished values rather than to another row's steps.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from feature_store.config import feature_fields, feature_store
from feature_store.online_layout import OnlineLayout
from feature_store.redis_connection import redis_client

#: Feast value-proto field for each feature dtype Loopline declares.
_VALUE_FIELDS = {"INT64": "int64_val", "INT32": "int32_val", "DOUBLE": "double_val", "FLOAT": "float_val",
                 "STRING": "string_val", "BOOL": "bool_val"}  # fmt: skip

#: KEYS[1]: the entity's hash. ARGV: the ``_ts`` field, its new Timestamp, the new seconds and nanos, the order
#: field, the new event time (µs) and events, a TTL in seconds (0: none), the number d of fields to delete (steps the
#: row has none of), those d fields, then the feature (and steps) fields and values. The stored Timestamp is decoded here (protobuf varints: field 1 seconds, field 2 nanos) to compare times.
_COMPARE_AND_SET = """
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if stored then
  local parts, i = {0, 0}, 1
  while i <= #stored do
    local tag, value, scale, byte = stored:byte(i), 0, 1, 128
    i = i + 1
    while byte >= 128 do
      byte = stored:byte(i)
      value, scale, i = value + (byte % 128) * scale, scale * 128, i + 1
    end
    if tag == 8 then parts[1] = value elseif tag == 16 then parts[2] = value end
  end
  local seconds, nanos = tonumber(ARGV[3]), tonumber(ARGV[4])
  if seconds < parts[1] or (seconds == parts[1] and nanos <= parts[2]) then
    local same = seconds == parts[1] and nanos == parts[2]
    local at, events = string.match(redis.call('HGET', KEYS[1], ARGV[5]) or '', '^(%d+):(%d+)$')
    if not (same and at == ARGV[6] and tonumber(ARGV[7]) > tonumber(events)) then return 0 end
  end
end
local cleared = 10 + tonumber(ARGV[9])
local fields = {ARGV[1], ARGV[2], ARGV[5], ARGV[6] .. ':' .. ARGV[7]}
for n = cleared, #ARGV do fields[#fields + 1] = ARGV[n] end
redis.call('HSET', KEYS[1], unpack(fields))
if cleared > 10 then redis.call('HDEL', KEYS[1], unpack(ARGV, 10, cleared - 1)) end
if ARGV[8] ~= '0' then redis.call('EXPIRE', KEYS[1], ARGV[8]) end
return 1
"""


@dataclass(frozen=True)
class FeatureRow:
    """The features of one entity of one view as of its latest event (``event_time_us``, microseconds since the
    epoch), after ``events`` of its events were absorbed (the tie-break between rows of one event time). ``entity``:
    its join key's value, or the tuple of its join keys' values in the view's order."""

    view: str
    entity: str | tuple[str, ...]
    event_time_us: int
    features: dict[str, float | int | str | bool | None]
    events: int = 0
    windows: dict[tuple[int, int], bytes] = field(default_factory=dict)  # (slide ms, window ms) -> the window's steps
    #: The log positions behind the row: each partition's last absorbed offset, ``partition:offset,...`` by partition.
    absorbed: str = ""

    @property
    def order(self) -> tuple[int, int]:
        """How the store orders the entity's rows: a row replaces only one of a lower order."""
        return self.event_time_us, self.events


def latest_per_entity(rows: list[FeatureRow]) -> list[FeatureRow]:
    """Only the newest row of each (view, entity): the others would be skipped by the store anyway."""
    newest: dict[tuple[str, str], FeatureRow] = {}
    for row in rows:
        current = newest.get((row.view, row.entity))
        if current is None or row.order > current.order:
            newest[(row.view, row.entity)] = row
    return list(newest.values())


class OnlineWriter:
    """Writes FeatureRows of the registry's views to the online store configured in the repo."""

    def __init__(self, feast_registry_path: Path | None, redis_connection: str | None, repo_path: Path, *, redis_cluster: bool = False) -> None:
        """``redis_cluster``: the connection names a Redis Cluster's nodes (each entity's row is one hash, so each
        write names one key and goes to the master of its slot)."""
        from feast.infra.online_stores.helpers import get_online_store_from_config

        store = feature_store(feast_registry_path, redis_connection, repo_path, redis_cluster=redis_cluster)
        self._config = store.config
        self._online_store = get_online_store_from_config(store.config.online_store)
        self._views = {view.name: view for view in store.list_stream_feature_views()}
        #: Where each view's rows are in Redis (the reader's layout too).
        self.layout = OnlineLayout(store.config, self._views.values())
        #: Each view's Value proto field of each feature.
        self._kinds = {name: {f.name: _VALUE_FIELDS[f.dtype.to_value_type().name] for f in feature_fields(view)}
                       for name, view in self._views.items()}  # fmt: skip
        self._ttl_s = store.config.online_store.key_ttl_seconds or 0

    @cached_property
    def _redis(self):
        """The client, made at the first write (a cluster client connects when made; building a job needs no Redis)."""
        online_store = self._config.online_store
        return redis_client(online_store.connection_string, cluster=online_store.redis_type == "redis_cluster")

    def write(self, rows: list[FeatureRow]) -> int:
        """Write the newest row of each entity where it is newer than the stored one; return how many rows were sent."""
        from feast.protos.feast.types.Value_pb2 import Value
        from google.protobuf.timestamp_pb2 import Timestamp

        newest = latest_per_entity(rows)
        pipe = self._redis.pipeline(transaction=False)
        for row in newest:
            layout, kinds = self.layout.views[row.view], self._kinds[row.view]
            stamp = Timestamp()
            stamp.FromMicroseconds(row.event_time_us)
            values, cleared = [layout.absorbed_field, row.absorbed.encode()], []
            for name, value in row.features.items():
                values += [layout.fields[name], (Value() if value is None else Value(**{kinds[name]: value})).SerializeToString()]
            for key, (steps_field, _) in layout.windows.items():
                if key in row.windows:
                    values += [steps_field, row.windows[key]]
                else:
                    cleared.append(steps_field)
            # EVAL as a plain command: redis-py's cluster pipeline has no eval(), but routes EVAL by its one key.
            entity = (row.entity,) if isinstance(row.entity, str) else row.entity
            pipe.execute_command("EVAL", _COMPARE_AND_SET, 1, self.layout.redis_key(layout.join_keys, entity), layout.timestamp_field,
                                 stamp.SerializeToString(), stamp.seconds, stamp.nanos, layout.order_field, row.event_time_us,
                                 row.events, self._ttl_s, len(cleared), *cleared, *values)  # fmt: skip
        pipe.execute()
        return len(newest)

    def jvm_layout(self, view: str, features: Sequence[str], max_batch_rows: int, timeout_ms: int = 10_000) -> str:
        """What the feature job's JVM writer (``streams/jvm`` ``OnlineRowSink``) needs to write ``view``'s rows, whose
        ``features`` come in that order, exactly as :meth:`write` does, as JSON: the connection (Feast's, parsed by
        Feast), the key's bytes around the join keys' values, the fields (base64), each feature's Value kind, the TTL and this
        module's compare-and-set script; and its largest batch (``max_batch_rows`` entities) and ``timeout_ms`` per
        reply."""
        from feast.infra.online_stores.redis import RedisOnlineStore

        online_store = self._config.online_store
        nodes, params = RedisOnlineStore._parse_connection_string(online_store.connection_string)
        layout = self.layout.views[view]
        parts, order = self.layout.key_parts(layout.join_keys)
        kinds = {"int64_val": "int64", "int32_val": "int32", "double_val": "double", "float_val": "float", "string_val": "string",
                 "bool_val": "bool"}  # fmt: skip
        encode = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
        return json.dumps({
            "nodes": [f"{node['host']}:{node['port']}" for node in nodes], "cluster": online_store.redis_type == "redis_cluster",
            "username": params.get("username"), "password": params.get("password"), "ssl": bool(params.get("ssl", False)),
            "db": int(params.get("db", 0)), "timeoutMs": timeout_ms, "keyParts": [encode(part) for part in parts], "keyOrder": order,
            "timestampField": encode(layout.timestamp_field), "orderField": encode(layout.order_field),
            "absorbedField": encode(layout.absorbed_field),
            "featureFields": [encode(layout.fields[name]) for name in features],
            "featureKinds": [kinds[self._kinds[view][name]] for name in features],
            "stepsFields": [encode(steps_field) for steps_field, _ in layout.windows.values()],
            "ttlSeconds": self._ttl_s, "script": _COMPARE_AND_SET, "maxBatchRows": max_batch_rows,
        })  # fmt: skip

    def delete_rows(self) -> list[str]:
        """Delete every online row of the registry's stream feature views (Feast's own ``delete_table``): a stream
        rebuilt from scratch then replaces the old rows instead of leaving its quiet entities' old values beside the
        new ones (a row is only ever overwritten by a newer one). The views whose rows were deleted."""
        for view in self._views.values():
            self._online_store.delete_table(self._config, view)
        return sorted(self._views)
