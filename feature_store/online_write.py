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
events it holds, exactly, however an entity's events spread over partitions (the consistency replay reads them). A
row written by Feast itself (no such field) is replaced only by a row of a later event time. The keys and fields
come from ``feature_store/online_layout.py``, the layout the reader uses too.

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

import redis

from feature_store.config import feature_fields, feature_store
from feature_store.online_layout import OnlineLayout
from feature_store.redis_connection import redis_client
from feature_store.view_state import Generation, read_view_states

#: Feast value-proto field for each feature dtype Loopline declares.
_VALUE_FIELDS = {
    "INT64": "int64_val",
    "INT32": "int32_val",
    "DOUBLE": "double_val",
    "FLOAT": "float_val",
    "STRING": "string_val",
    "BOOL": "bool_val",
}

#: KEYS[1]: the entity's hash. ARGV: the ``_ts`` field, its new Timestamp, the new seconds and nanos, the order
#: field, the new event time (µs) and events, a TTL in seconds (0: none), the number d of fields to delete (steps the
#: row has none of), those d fields, then the feature (and steps) fields and values. The stored Timestamp is decoded
#: here (protobuf varints: field 1 seconds, field 2 nanos) to compare times.
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
    #: The identity of the plan that computed the row (``FeaturePlan.identity``), as the feature job writes it; empty
    #: for a row of no plan (written by hand).
    plan: str = ""

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


def _key_ttls(store, layout: OnlineLayout, key_ttl_seconds: int | None) -> dict[str, int]:
    """Per stream feature view, how long (s) its entity's hash lives after each write of a row (Redis EXPIRE; 0: for
    ever): the online store's ``key_ttl_seconds`` where set (Feast's own setting), else its views' ``ttl``: the longest
    of every feature view (stream or batch) stored in the same hash (the same join keys), none where one of them keeps
    its values for ever (``ttl`` 0). An entity whose events stop so leaves Redis a ttl after its last row, as it leaves
    the job's state once its windows are empty (``SlidingWindows``)."""
    if key_ttl_seconds:
        return dict.fromkeys(layout.views, key_ttl_seconds)
    horizons: dict[tuple[str, ...], int] = {}
    for view in [*store.list_feature_views(), *store.list_stream_feature_views()]:
        keys = tuple(sorted(view.join_keys))
        seconds = int(view.ttl.total_seconds()) if view.ttl else 0
        known = horizons.get(keys)
        horizons[keys] = 0 if seconds == 0 or known == 0 else max(seconds, known or 0)
    return {name: horizons[tuple(sorted(view.join_keys))] for name, view in layout.views.items()}


class ReplicaAckError(RuntimeError):
    """Rows a master took but fewer of its replicas than asked acknowledged in time (``OnlineWriter`` with
    ``replica_acks``): they are in Redis, but a failover of that master may lose them."""


class OnlineWriter:
    """Writes FeatureRows of the registry's views to the online store configured in the repo."""

    def __init__(
        self,
        feast_registry_path: Path | None,
        redis_connection: str | None,
        repo_path: Path,
        *,
        redis_cluster: bool = False,
        replica_acks: int = 0,
        replica_ack_timeout_ms: int = 2_000,
    ) -> None:
        """``redis_cluster``: the connection names a Redis Cluster's nodes (each entity's row is one hash, so each
        write names one key and goes to the master of its slot). ``replica_acks``: replicas each node's rows must
        reach (Redis WAIT, within ``replica_ack_timeout_ms``) before :meth:`write` returns, as the feature job's
        writer does (``redis.write_acks``)."""
        from feast.infra.online_stores.helpers import get_online_store_from_config

        store = feature_store(feast_registry_path, redis_connection, repo_path, redis_cluster=redis_cluster)
        self._config = store.config
        self._online_store = get_online_store_from_config(store.config.online_store)
        self._views = {view.name: view for view in store.list_stream_feature_views()}
        #: Where each view's rows are in Redis (the reader's layout too).
        self.layout = OnlineLayout(store.config, self._views.values())
        #: Each view's Value proto field of each feature.
        self._kinds = {
            name: {f.name: _VALUE_FIELDS[f.dtype.to_value_type().name] for f in feature_fields(view)}
            for name, view in self._views.items()
        }
        self._ttl_s = _key_ttls(store, self.layout, store.config.online_store.key_ttl_seconds)
        self._replica_acks, self._replica_ack_timeout_ms = replica_acks, replica_ack_timeout_ms

    @cached_property
    def _redis(self):
        """The client, made at the first write (a cluster client connects when made; building a job needs no Redis)."""
        online_store = self._config.online_store
        return redis_client(online_store.connection_string, cluster=online_store.redis_type == "redis_cluster")

    def write(self, rows: list[FeatureRow]) -> int:
        """Write the newest row of each entity where it is newer than the stored one, in the generation of its view
        that readers serve (``feature_store/view_state.py``); return how many rows were sent."""
        from feast.protos.feast.types.Value_pb2 import Value
        from google.protobuf.timestamp_pb2 import Timestamp

        newest = latest_per_entity(rows)
        serving = read_view_states(self._redis, self.project).serving
        calls = []
        for row in newest:
            generation, kinds = serving.get(row.view), self._kinds[row.view]
            layout = self.layout.views[row.view] if generation is None else self.layout.generation(generation)
            if not row.features.keys() <= layout.fields.keys():
                raise ValueError(
                    f"{row.view}: the rows readers serve ({layout.stored_name}) hold no "
                    f"{sorted(row.features.keys() - layout.fields.keys())}"
                )
            stamp = Timestamp()
            stamp.FromMicroseconds(row.event_time_us)
            values, cleared = [layout.absorbed_field, row.absorbed.encode()], []
            if row.plan:
                values += [layout.plan_field, row.plan.encode()]
            for name, value in row.features.items():
                values += [layout.fields[name], (Value() if value is None else Value(**{kinds[name]: value})).SerializeToString()]
            for key, (steps_field, _) in layout.windows.items():
                if key in row.windows:
                    values += [steps_field, row.windows[key]]
                else:
                    cleared.append(steps_field)
            entity = (row.entity,) if isinstance(row.entity, str) else row.entity
            calls.append(
                (
                    self.layout.redis_key(layout.join_keys, entity),
                    [
                        layout.timestamp_field,
                        stamp.SerializeToString(),
                        stamp.seconds,
                        stamp.nanos,
                        layout.order_field,
                        row.event_time_us,
                        row.events,
                        self._ttl_s[row.view],
                        len(cleared),
                        *cleared,
                        *values,
                    ],
                )
            )
        try:
            self._send(calls)
        except redis.exceptions.ResponseError as err:  # a slot moved (a failover): look the cluster up again, once
            moved = isinstance(err, redis.exceptions.MovedError) or str(err).startswith("MOVED")
            if not (moved and self._config.online_store.redis_type == "redis_cluster"):
                raise
            self._redis.nodes_manager.initialize()
            self._send(calls)
        return len(newest)

    def _send(self, calls: list[tuple[bytes, list]]) -> None:
        """The compare-and-sets, pipelined per node (each master's, on a cluster), each node's pipeline ending in WAIT
        where ``replica_acks`` asks for it; ReplicaAckError where a node's replicas acknowledged fewer in time."""
        if self._config.online_store.redis_type == "redis_cluster":
            nodes: dict[str, list] = {}
            for call in calls:
                nodes.setdefault(self._redis.get_node_from_key(call[0]).name, []).append(call)
            by_node = [
                (self._redis.get_redis_connection(self._redis.get_node(node_name=name)), name, node_calls)
                for name, node_calls in nodes.items()
            ]
        else:
            by_node = [(self._redis, "Redis", calls)]
        for client, name, node_calls in by_node:
            pipe = client.pipeline(transaction=False)
            for key, args in node_calls:
                pipe.execute_command("EVAL", _COMPARE_AND_SET, 1, key, *args)
            if self._replica_acks:
                pipe.execute_command("WAIT", self._replica_acks, self._replica_ack_timeout_ms)
            replies = pipe.execute()
            if self._replica_acks and replies[-1] < self._replica_acks:
                raise ReplicaAckError(
                    f"{len(node_calls)} online rows on {name} reached {replies[-1]} of {self._replica_acks} "
                    f"replica(s) within {self._replica_ack_timeout_ms} ms: a failover may lose them; write them again"
                )

    def jvm_connection(self, timeout_ms: int = 10_000) -> dict:
        """The online store's connection as the JVM writers take it (``streams/jvm`` ``RedisConnection``): Feast's
        connection string, parsed by Feast, with ``timeout_ms`` per reply."""
        from feast.infra.online_stores.redis import RedisOnlineStore

        online_store = self._config.online_store
        nodes, params = RedisOnlineStore._parse_connection_string(online_store.connection_string)
        return {
            "nodes": [f"{node['host']}:{node['port']}" for node in nodes],
            "cluster": online_store.redis_type == "redis_cluster",
            "username": params.get("username"),
            "password": params.get("password"),
            "ssl": bool(params.get("ssl", False)),
            "db": int(params.get("db", 0)),
            "timeoutMs": timeout_ms,
        }

    @property
    def project(self) -> str:
        """The Feast project the rows belong to."""
        return self._config.project

    @property
    def redis(self):
        """The writer's Redis client (made at first use)."""
        return self._redis

    def jvm_layout(
        self,
        generation: Generation,
        features: Sequence[str],
        max_batch_rows: int,
        timeout_ms: int = 10_000,
        *,
        replica_acks: int = 0,
        replica_ack_timeout_ms: int = 2_000,
        marks: tuple[str, str] | None = None,
    ) -> str:
        """What the feature job's JVM writer (``streams/jvm`` ``OnlineRowSink``) needs to write the rows of a view's
        ``generation``, whose ``features`` come in that order, exactly as :meth:`write` does, as JSON: the connection,
        the key's bytes around the join keys' values, the fields of the generation's namespace (base64), each feature's
        Value kind, the plan identity, the TTL and this module's compare-and-set script; and its largest batch
        (``max_batch_rows`` entities), ``timeout_ms`` per reply, and the replicas each batch must reach (Redis WAIT)
        within ``replica_ack_timeout_ms``. With ``marks`` (a hash and a field prefix: ``view_state.py``'s ``written``)
        each subtask of the writer records there the read marks its rows reached Redis behind."""
        layout = self.layout.generation(generation)
        parts, order = self.layout.key_parts(layout.join_keys)
        kinds = {
            "int64_val": "int64",
            "int32_val": "int32",
            "double_val": "double",
            "float_val": "float",
            "string_val": "string",
            "bool_val": "bool",
        }
        encode = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
        return json.dumps(
            {
                "connection": self.jvm_connection(timeout_ms),
                "keyParts": [encode(part) for part in parts],
                "keyOrder": order,
                "timestampField": encode(layout.timestamp_field),
                "orderField": encode(layout.order_field),
                "absorbedField": encode(layout.absorbed_field),
                "planField": encode(layout.plan_field),
                "plan": generation.identity,
                "featureFields": [encode(layout.fields[name]) for name in features],
                "featureKinds": [kinds[self._kinds[generation.view][name]] for name in features],
                "stepsFields": [encode(steps_field) for steps_field, _ in layout.windows.values()],
                "ttlSeconds": self._ttl_s[generation.view],
                "script": _COMPARE_AND_SET,
                "maxBatchRows": max_batch_rows,
                "replicaAcks": replica_acks,
                "replicaAckTimeoutMs": replica_ack_timeout_ms,
                "marksKey": marks[0] if marks else None,
                "marksField": marks[1] if marks else None,
            }
        )

    def delete_rows(self) -> list[str]:
        """Delete every online row of the registry's stream feature views (Feast's own ``delete_table``): a stream
        rebuilt from scratch then replaces the old rows instead of leaving its quiet entities' old values beside the
        new ones (a row is only ever overwritten by a newer one). The views whose rows were deleted."""
        for view in self._views.values():
            self._online_store.delete_table(self._config, view)
        return sorted(self._views)
