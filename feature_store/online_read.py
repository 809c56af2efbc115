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

Windows. The HMGET takes, for the windowed features, each window's steps rather than the features' finished values
(``feature_store/window_tiles.py``), and the value is the step valid at the read time: given a read time per entity
(the request's time), as of that time (a binary search; nothing is merged here); without one, as of each entity's
latest event, the first step, which holds exactly the finished values Feast's ``get_online_features`` returns (the
job computes both from the same exact totals). One step field per window is fewer fields to fetch and decode than a
value per feature. Where a window has no steps of the row's own event time (a row written by hand, or views changed
and the job not yet restarted with them), its finished values, as of the entity's latest event, are returned, read in
a second round trip for all such rows.

Generations and progress (``feature_store/view_state.py``). Each stream feature view is read in the generation readers
serve, under its namespace and as its plan defines it (a feature it does not compute reads None), so a view rebuilt
under a changed plan is read in its previous plan until the rebuild has caught up, then in the new one; a row carrying
another plan's identity reads as no row. And where the job lags (stopped, or catching up), a read is as of the view's
progress, never as of a later time its windows have not absorbed yet: a busy entity's count does not read 0 because
the job is down. The serving generations and the progress are read once every ``states_refresh_s`` (one HGETALL),
not per read.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from feature_store.config import feature_store
from feature_store.defaults import declared_defaults
from feature_store.online_layout import OnlineLayout
from feature_store.redis_connection import redis_client
from feature_store.view_state import Generation, ViewStates, read_view_states, views_key
from feature_store.window_tiles import Window

#: Wire tags of Feast's Value proto: field 5 (double_val, 64-bit) and field 4 (int64_val, varint).
_DOUBLE_TAG, _INT64_TAG = (5 << 3) | 1, (4 << 3) | 0
_DOUBLE = struct.Struct("<d")


@dataclass(frozen=True)
class _ReadPlan:
    """How a read of some features of one view goes: the fields its HMGET asks for (the features read as stored, the
    row's event time, absorbed positions and plan, then the steps of each window holding a feature asked), where each
    answer goes among the features asked, and the finished values' fields of the windows, read only where a window has
    no steps of the row's event time. Of the serving ``generation`` when the view has one (None: as the registry
    defines it, under Feast's name); a feature the generation does not compute is not read (it reads None)."""

    join_keys: tuple[str, ...]
    fields: list[bytes]
    direct: list[int]  # positions among the features asked of those read as stored
    windows: list[tuple[Window, list[int | None]]]  # per steps read, the position of each of its values (None: not asked)
    finished_fields: list[bytes]  # every window's features' fields, window after window
    finished_at: list[slice]  # where each window's are among them
    generation: Generation | None


class OnlineRead(NamedTuple):
    """What :meth:`OnlineReader.read_with_row_times` read, per feature or view, one entry per entity row."""

    #: By feature name (and the rows' join keys), as Feast's ``get_online_features(...).to_dict()``.
    values: dict[str, list]
    #: Per view, the event time (ms) of each entity's row, None for none.
    row_times: dict[str, list[int | None]]
    #: Per view, the log positions each row absorbed (``partition:offset,...``), None for none.
    row_absorbed: dict[str, list[str | None]]
    #: Per view whose job lags, for each row read as of its progress instead of the read time, that progress (ms);
    #: None for a row read at its time.
    read_as_of: dict[str, list[int | None]]


class OnlineReader:
    """Reads feature vectors of registered feature views from the Redis online store."""

    def __init__(
        self,
        feast_registry_path: Path | None,
        redis_connection: str,
        repo_path: Path,
        timeout_s: float | None = None,
        *,
        redis_cluster: bool = False,
        stale_after_s: float = 5.0,
        states_refresh_s: float = 0.5,
    ) -> None:
        """``timeout_s`` bounds connecting and each reply (None: wait as long as Redis takes); ``redis_cluster``: the
        connection names a Redis Cluster's nodes. A read at a time more than ``stale_after_s`` past a view's progress,
        while the job is that far behind the clock too, is read as of the progress (:meth:`read_with_row_times`); the
        views' serving generations and progress are read again at most every ``states_refresh_s``."""
        from feast.protos.feast.types.Value_pb2 import Value

        store = feature_store(feast_registry_path, redis_connection, repo_path, redis_cluster=redis_cluster)
        self._value = Value
        views = [*store.list_feature_views(), *store.list_stream_feature_views()]
        #: The default each feature declares ("view:feature" -> value or None), for callers that fall back.
        self.defaults = declared_defaults(views)
        #: Where each view's rows are in Redis (the writer's layout too).
        self.layout = OnlineLayout(store.config, views)
        self._views, self._redis_key = self.layout.views, self.layout.redis_key
        self._plans: dict[tuple[str, tuple[str, ...], str | None], _ReadPlan] = {}
        online_store = store.config.online_store
        self._redis_args = (online_store.connection_string, timeout_s, online_store.redis_type == "redis_cluster")
        self._redis = redis_client(*self._redis_args[:2], cluster=self._redis_args[2])
        self._async_client = None
        self._project = store.config.project
        self._stale_after_ms, self._states_refresh_s = int(stale_after_s * 1000), states_refresh_s
        self._states, self._states_read_at = ViewStates(), -1.0  # negative: never read
        self._states_refreshing = threading.Lock()
        self._states_refresh: asyncio.Future | None = None  # the asyncio refresh in flight

    def join_keys(self, features: list[str]) -> set[str]:
        """The entity join keys a read of ``features`` needs in each row."""
        return {key for reference in features for key in self._views[reference.split(":", 1)[0]].join_keys}

    def hash_fields(self, view: str, names: list[str]) -> list[bytes]:
        """The fields of an entity's hash a read of ``names`` of ``view`` asks for (its one HMGET)."""
        return list(self._plan(view, tuple(names)).fields)

    def view_states(self) -> ViewStates:
        """The views' serving generations and progress, as last read (again when older than ``states_refresh_s``).

        One thread refreshes at a time; the others keep the states last read meanwhile (before the first read, they
        wait for it). Two refreshes in flight on two connections could land out of order, the older HGETALL's answer
        replacing the newer one: readers would go back to a generation they had already left (a view read in its new
        plan, then in its old one again)."""
        now = time.monotonic()
        never_read = self._states_read_at < 0
        if not never_read and now - self._states_read_at < self._states_refresh_s:
            return self._states
        if self._states_refreshing.acquire(blocking=never_read):
            try:
                if not (never_read and self._states_read_at >= 0):
                    self._states, self._states_read_at = read_view_states(self._redis, self._project), now
            finally:
                self._states_refreshing.release()
        return self._states

    def progress_ms(self, view: str, states: ViewStates | None = None) -> int | None:
        """How far in event time the rows readers serve of ``view`` have absorbed their topic, as the job last said (in
        ``states``, default the views' states as last read); None when the view has no serving generation (rows written
        by hand) or its job has published none yet."""
        states = self.view_states() if states is None else states
        generation = states.serving.get(view)
        progress = None if generation is None else states.progress.get(generation.namespace)
        return None if progress is None else progress[0]

    def get_online_features(self, features: list[str], entity_rows: list[dict[str, str]]) -> dict[str, list]:
        """Like Feast's ``get_online_features(features, entity_rows).to_dict()`` (without full feature names)."""
        return self.read_with_row_times(features, entity_rows).values

    def read_with_row_times(
        self, features: list[str], entity_rows: list[dict[str, str]], at_ms: Sequence[int] | None = None
    ) -> OnlineRead:
        """:meth:`get_online_features`, and per view the event time (ms) of each entity's row as read and the log
        positions it absorbed, in the same round trip, so they are those of the values returned. With ``at_ms`` (a read
        time per row, epoch ms), windowed features are as of those times (the module's docstring); but where the job
        lags (a view's progress more than ``stale_after_s`` behind both the read time and the clock: stopped, or
        catching up), as of the progress, and said so (``read_as_of``): its windows hold no event after it yet (a row
        written by hand, of no plan, is read at its time). Each view is read in its serving generation; a row of
        another plan reads as no row."""
        read = _Reading(self, features, entity_rows, at_ms, self.view_states())
        again = read.take(self._hmgets(read.commands))
        if again:
            read.take_finished(self._hmgets(again))
        return read.result()

    async def read_with_row_times_async(
        self, features: list[str], entity_rows: list[dict[str, str]], at_ms: Sequence[int] | None = None
    ) -> OnlineRead:
        """:meth:`read_with_row_times` on the running event loop: the same read, its round trips (and the views'
        states, when due) through redis-py's asyncio client, so the caller's loop serves other requests meanwhile and
        no thread waits for the interpreter to hand the read its turn."""
        read = _Reading(self, features, entity_rows, at_ms, await self.view_states_async())
        again = read.take(await self._hmgets_async(read.commands))
        if again:
            read.take_finished(await self._hmgets_async(again))
        return read.result()

    def _hmgets(self, commands: list[tuple[bytes, list[bytes]]]) -> list:
        """One pipelined round trip of an HMGET per (key, fields)."""
        pipe = self._redis.pipeline(transaction=False)
        for key, fields in commands:
            pipe.hmget(key, fields)
        return pipe.execute()

    async def _hmgets_async(self, commands: list[tuple[bytes, list[bytes]]]) -> list:
        pipe = self._async_redis().pipeline(transaction=False)
        for key, fields in commands:
            pipe.hmget(key, fields)
        return await pipe.execute()

    def _async_redis(self):
        """The asyncio client, made on first use (its connections belong to the event loop that first reads)."""
        if self._async_client is None:
            self._async_client = redis_client(*self._redis_args[:2], cluster=self._redis_args[2], asynchronous=True)
        return self._async_client

    async def aclose(self) -> None:
        """Close the asyncio client's connections (the blocking client's close with the process)."""
        if self._async_client is not None:
            await self._async_client.aclose()
            self._async_client = None

    @property
    def redis_cluster(self) -> bool:
        """Whether the store is a Redis Cluster."""
        return self._redis_args[2]

    @property
    def states_read(self) -> ViewStates:
        """The views' states as last read, not read again however old."""
        return self._states

    async def view_states_async(self) -> ViewStates:
        """:meth:`view_states` on the running event loop: one refresh in flight at a time (so they land in order); the
        other readers keep the states last read meanwhile, and before the first read wait for it."""
        if self._states_read_at >= 0 and time.monotonic() - self._states_read_at < self._states_refresh_s:
            return self._states
        if self._states_refresh is not None:
            if self._states_read_at < 0:
                await asyncio.shield(self._states_refresh)
                if self._states_read_at < 0:  # the first refresh failed: no states to read by
                    raise ConnectionError("the views' serving generations could not be read from Redis")
            return self._states
        self._states_refresh = asyncio.get_running_loop().create_future()
        try:
            now = time.monotonic()
            fields = await self._async_redis().hgetall(views_key(self._project))
            self._states, self._states_read_at = ViewStates.parse(fields), now
        finally:
            refresh, self._states_refresh = self._states_refresh, None
            refresh.set_result(None)
        return self._states

    def _lagging_progress(self, plan: _ReadPlan, states: ViewStates, now_ms: int) -> int | None:
        """The progress of ``plan``'s generation where its job lags the clock by more than ``stale_after_s``; None
        where it does not, or has published none."""
        if plan.generation is None:
            return None
        progress = states.progress.get(plan.generation.namespace)
        return progress[0] if progress is not None and now_ms > progress[0] + self._stale_after_ms else None

    def _plan(self, view: str, names: tuple[str, ...], states: ViewStates | None = None) -> _ReadPlan:
        """How a read of ``names`` of ``view`` goes (``_ReadPlan``) in its serving generation (of ``states``, default
        the views' states as last read), computed once per view, names and generation."""
        generation = (self.view_states() if states is None else states).serving.get(view)
        key = (view, names, None if generation is None else generation.namespace)
        plan = self._plans.get(key)
        if plan is None:
            layout = self._views[view] if generation is None else self.layout.generation(generation)
            where = {name: i for i, name in enumerate(names)}
            windows = []  # (steps field, window, position of each of its values among the names)
            for steps_field, window in layout.windows.values():
                positions = [where.get(a.name) for a in window.aggregations]
                if any(p is not None for p in positions):
                    windows.append((steps_field, window, positions))
            stepped = {p for *_, positions in windows for p in positions if p is not None}
            direct = [i for i in range(len(names)) if i not in stepped and names[i] in layout.fields]
            finished_fields: list[bytes] = []
            finished_at = []
            for _, window, _ in windows:
                finished_at.append(slice(len(finished_fields), len(finished_fields) + len(window.aggregations)))
                finished_fields += [layout.fields[a.name] for a in window.aggregations]
            plan = self._plans[key] = _ReadPlan(
                join_keys=layout.join_keys,
                fields=[
                    *(layout.fields[names[i]] for i in direct),
                    layout.timestamp_field,
                    layout.absorbed_field,
                    layout.plan_field,
                    *(steps_field for steps_field, *_ in windows),
                ],
                direct=direct,
                windows=[(window, positions) for _, window, positions in windows],
                finished_fields=finished_fields,
                finished_at=finished_at,
                generation=generation,
            )
        return plan

    def _layout(self, view: str):
        """Where the rows of ``view``'s serving generation are (as the registry defines the view, without one)."""
        generation = self.view_states().serving.get(view)
        return self._views[view] if generation is None else self.layout.generation(generation)

    def row_timestamps_us(self, view: str, entities: list[dict[str, str]]) -> list[int | None]:
        """When each entity's row (``entities``: join key -> value) was computed (its event time, in microseconds), or
        None if it has none (in the generation readers serve)."""
        from google.protobuf.timestamp_pb2 import Timestamp

        layout = self._layout(view)
        pipe = self._redis.pipeline(transaction=False)
        for entity in entities:
            pipe.hget(self._redis_key(layout.join_keys, tuple(entity[key] for key in layout.join_keys)), layout.timestamp_field)
        stamps = [None if raw is None else Timestamp.FromString(raw) for raw in pipe.execute()]
        return [None if s is None else s.seconds * 1_000_000 + s.nanos // 1_000 for s in stamps]

    def _decode(self, raw: bytes):
        """A Feast ValueProto's Python value; doubles and int64s (most features) are read directly."""
        if len(raw) == 9 and raw[0] == _DOUBLE_TAG:
            return _DOUBLE.unpack_from(raw, 1)[0]
        if raw and raw[0] == _INT64_TAG and 1 < len(raw) <= 10:
            return raw[1] if len(raw) == 2 else _varint_int64(raw, 1)  # one byte: below 128
        value = self._value.FromString(raw)
        kind = value.WhichOneof("val")
        return None if kind is None or kind == "null_val" else getattr(value, kind)


class _Reading:
    """One read in progress: the HMGETs it sends (``commands``), then what it makes of their replies; the I/O is the
    reader's (a blocking pipeline, or an asyncio one), the rest is the same for both."""

    def __init__(
        self,
        reader: OnlineReader,
        features: list[str],
        entity_rows: list[dict[str, str]],
        at_ms: Sequence[int] | None,
        states: ViewStates,
    ) -> None:
        self.reader, self.entity_rows, self.at_ms, self.states = reader, entity_rows, at_ms, states
        self.by_view: dict[str, list[str]] = {}
        for reference in features:
            view, feature = reference.split(":", 1)
            self.by_view.setdefault(view, []).append(feature)
        self.plans = {view: reader._plan(view, tuple(names), states) for view, names in self.by_view.items()}
        redis_key = reader._redis_key
        self.commands = [
            (redis_key(plan.join_keys, _join_values(row, plan.join_keys, view)), plan.fields)
            for view, plan in self.plans.items()
            for row in entity_rows
        ]
        self.values: dict[str, list] = {}
        self.row_times: dict[str, list[int | None]] = {}
        self.row_absorbed: dict[str, list[str | None]] = {}
        self.read_as_of: dict[str, list[int | None]] = {}
        self._unstepped: list[tuple[_ReadPlan, list[list], int, list[int]]] = []  # (plan, columns, row, windows)

    def take(self, replies: list) -> list[tuple[bytes, list[bytes]]]:
        """Decode the first round trip's ``replies``; the HMGETs of a second one, for the finished values of windows
        that had no steps of their row's event time (rows written by hand, or by a job of other views): often none."""
        from google.protobuf.timestamp_pb2 import Timestamp

        reader, entity_rows, at_ms, states = self.reader, self.entity_rows, self.at_ms, self.states
        replies = iter(replies)
        result = self.values
        now_ms = int(time.time() * 1000)
        for row in entity_rows:
            for key, value in row.items():
                result.setdefault(key, []).append(value)
        decode, unpack_double, count = reader._decode, _DOUBLE.unpack_from, len(entity_rows)
        for view, names in self.by_view.items():
            plan = self.plans[view]
            columns = [[None] * count for _ in names]
            for name, column in zip(names, columns, strict=True):
                result[name] = column
            times = self.row_times[view] = [None] * count
            absorbed = self.row_absorbed[view] = [None] * count
            identity = None if plan.generation is None else plan.generation.identity.encode()
            # Without read times, as of each entity's latest event: any time before it reads as of it (the first step).
            read_at = [0] * count if at_ms is None else at_ms
            lagging = None if at_ms is None else reader._lagging_progress(plan, states, now_ms)
            as_of = None
            direct, stamp_at = plan.direct, len(plan.direct)
            for i in range(count):
                reply = next(replies)
                stamp, positions_read, row_plan = reply[stamp_at], reply[stamp_at + 1], reply[stamp_at + 2]
                if identity is not None and row_plan is not None and row_plan != identity:
                    continue  # a row of another plan: never read as this one's
                at = read_at[i]
                # A row the lagging job wrote holds no event after its progress: read as of it, and say so. (A row of no
                # plan, written by hand, is not the job's to lag.)
                if lagging is not None and row_plan is not None and at > lagging + reader._stale_after_ms:
                    if as_of is None:
                        as_of = self.read_as_of[view] = [None] * count
                    at = as_of[i] = lagging
                for position, raw in zip(direct, reply, strict=False):
                    if raw is not None:  # a double inline (most features): the call costs more than the decode
                        columns[position][i] = (
                            unpack_double(raw, 1)[0] if len(raw) == 9 and raw[0] == _DOUBLE_TAG else decode(raw)
                        )
                time_ms = times[i] = None if stamp is None else _millis(Timestamp.FromString(stamp))
                absorbed[i] = None if positions_read is None else positions_read.decode()
                missing = []
                for w, (window, positions) in enumerate(plan.windows):
                    steps = reply[stamp_at + 3 + w]
                    if steps and window.latest_ms(steps) == time_ms:
                        for position, value in zip(positions, window.values_at(steps, at), strict=True):
                            if position is not None:
                                columns[position][i] = value
                    else:
                        missing.append(w)
                if missing and time_ms is not None:
                    self._unstepped.append((plan, columns, i, missing))
        return [
            (reader._redis_key(plan.join_keys, tuple(entity_rows[i][key] for key in plan.join_keys)), plan.finished_fields)
            for plan, _, i, _ in self._unstepped
        ]

    def take_finished(self, replies: list) -> None:
        """Decode the second round trip's ``replies`` (the finished values :meth:`take` asked for)."""
        for (plan, columns, i, missing), reply in zip(self._unstepped, replies, strict=True):
            for w in missing:
                for position, raw in zip(plan.windows[w][1], reply[plan.finished_at[w]], strict=True):
                    if position is not None:
                        columns[position][i] = None if raw is None else self.reader._decode(raw)

    def result(self) -> OnlineRead:
        return OnlineRead(self.values, self.row_times, self.row_absorbed, self.read_as_of)


def _join_values(row: dict[str, str], join_keys: tuple[str, ...], view: str) -> tuple[str, ...]:
    """The values of ``join_keys`` in the entity row ``row``; ValueError naming the one it lacks (a row read under an
    empty key would read another entity's features, or none, silently)."""
    try:
        return tuple(row[key] for key in join_keys)
    except KeyError as missing:
        raise ValueError(f"the entity row {row} has no {missing.args[0]!r}, a join key of the view {view}") from None


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
