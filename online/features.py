"""Feature fetch for scoring: the fast online read under a per-request budget, defaults on a miss.

A request never fails for want of features: a feature Redis has no value for, a read that
overruns the budget, or a Redis that is down all give the defaults declared with the features
(``feature_store/defaults.py``), and the response says which ones were defaulted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from prometheus_client import Gauge

from feature_store.online_read import OnlineReader
from online.batcher import BatchTiming, DynamicBatcher

log = logging.getLogger(__name__)
#: At most one warning per this many seconds about reads that fell back for an unexpected error.
_WARN_EVERY_S = 10.0


@dataclass
class _Read:
    """One request's read: its join keys and time, and the values with the moment the read finished (set by the
    worker)."""

    keys: dict[str, str]
    at_ms: int
    values: list | None = None
    row_times_ms: dict[str, int | None] | None = None
    row_absorbed: dict[str, str | None] | None = None
    read_as_of: dict[str, int] | None = None
    finished_at: float | None = None


@dataclass(frozen=True)
class FetchedFeatures:
    """The values to score with, by feature reference ("view:feature"), and those that were defaulted."""

    values: dict[str, float | int | str | bool | None]
    defaulted: list[str]
    #: Why each defaulted feature was: "missing" (the store has no value for it), or the read's ``fallback``.
    reasons: dict[str, str] = field(default_factory=dict)
    #: Why every feature fell back to its default, if the read itself failed: "over_budget",
    #: "unavailable" (Redis down, reads queue full) or "no_entity" (the request lacks a join key).
    fallback: str | None = None
    #: Per feature view, the event time (ms) of the row the values came from (views with no row left out).
    row_times_ms: dict[str, int] = field(default_factory=dict)
    #: Per feature view, the log positions behind that row (``partition:offset,...``; views whose row has none left out).
    row_absorbed: dict[str, str] = field(default_factory=dict)
    #: Features read as of their view's progress instead of the request's time, the job lagging (``stale``), and per
    #: such view that progress (ms).
    stale: list[str] = field(default_factory=list)
    read_as_of_ms: dict[str, int] = field(default_factory=dict)
    #: The pipelined Redis read the request's entities went in (its wait, its length, how many entities it read), when
    #: the request waited for it.
    read: BatchTiming | None = None


class FeatureFetcher:
    """Reads the features a model needs for each request's entities, within ``budget_s``.

    Concurrent requests share Redis round trips: their reads are batched (the same dynamic
    batcher as the model's, with no added delay) into one pipelined read of up to
    ``max_batch_size`` entities, sent and answered on the event loop (redis-py's asyncio client), which serves
    other requests meanwhile. (On a thread, the read waited for the interpreter's lock at each of its steps while
    the loop was busy: reads ran over budget on a busy scorer, and each was two thread hand-offs.)
    The budget is judged by when the read's answer was decoded: on the event loop, so a loop busy with other
    requests delays that too (on a Redis Cluster, where it is decoded on the read's thread, a read done in time
    is used even if the loop picks it up late).
    """

    def __init__(
        self,
        reader: OnlineReader,
        features: list[str],
        budget_s: float = 0.020,
        max_batch_size: int = 64,
        view_lag: Gauge | None = None,
    ) -> None:
        """``view_lag``: a gauge by view, set to how far (s) each view's job is behind the clock, as the reader last
        read it."""
        self.reader = reader
        self.features = features
        self.budget_s = budget_s
        self.defaults = {ref: reader.defaults.get(ref) for ref in features}
        self.join_keys = reader.join_keys(features)
        self._names = [ref.split(":", 1)[1] for ref in features]
        self._views = sorted({ref.split(":", 1)[0] for ref in features})
        self._view_lag, self._states_seen = view_lag, None
        # On a Redis Cluster the reads stay on a thread: through redis-py's asyncio cluster client, the failover test's
        # reads to a killed master never failed as unavailable (why is not known yet), where the blocking client's do.
        self._batcher: DynamicBatcher[_Read, list] = DynamicBatcher(
            self._read_batch if reader.redis_cluster else self._read_batch_async,
            max_batch_size=max_batch_size,
            max_queue_delay_s=0.0,
            max_queue_size=16 * max_batch_size,
        )
        self._warned_at = -_WARN_EVERY_S
        self._unwarned = 0

    async def _read_batch_async(self, reads: list[_Read]) -> list[list]:
        read = await self.reader.read_with_row_times_async(self.features, [r.keys for r in reads], [r.at_ms for r in reads])
        return self._took(reads, read)

    def _read_batch(self, reads: list[_Read]) -> list[list]:
        read = self.reader.read_with_row_times(self.features, [r.keys for r in reads], [r.at_ms for r in reads])
        return self._took(reads, read)

    def _took(self, reads: list[_Read], read) -> list[list]:
        """Each request's share of the batch's ``read``."""
        found, row_times, absorbed, read_as_of = read
        finished = time.perf_counter()
        for i, read in enumerate(reads):
            read.values = [found[name][i] for name in self._names]
            read.row_times_ms = {view: times[i] for view, times in row_times.items()}
            read.row_absorbed = {view: positions[i] for view, positions in absorbed.items()}
            read.read_as_of = {view: at[i] for view, at in read_as_of.items() if at[i] is not None}
            read.finished_at = finished  # set last: once the event loop sees it, the values are there
        if self._view_lag is not None:
            self._observe_lag()
        return [read.values for read in reads]

    def _observe_lag(self) -> None:
        """Each view's lag behind the clock, once per reading of the views' states (not per batch)."""
        states = self.reader.states_read
        if states is self._states_seen:
            return
        self._states_seen, now_ms = states, time.time() * 1000
        for view in self._views:
            progress = self.reader.progress_ms(view, states)
            if progress is not None:
                self._view_lag.labels(view).set(max(0.0, (now_ms - progress) / 1000))

    def _all_defaults(self, fallback: str) -> FetchedFeatures:
        return FetchedFeatures(dict(self.defaults), list(self.features), dict.fromkeys(self.features, fallback), fallback)

    async def fetch(self, entity_keys: dict[str, str], at_ms: int) -> FetchedFeatures:
        """The features for ``entity_keys`` (join key -> value), windows as of ``at_ms`` (the request's time, epoch
        ms); defaults for whatever is missing or late."""
        if not self.join_keys <= entity_keys.keys():
            return self._all_defaults("no_entity")
        read = _Read({k: entity_keys[k] for k in self.join_keys}, at_ms)
        began = time.perf_counter()
        try:
            async with asyncio.timeout(self.budget_s):  # unlike wait_for, no extra task per request
                found, timing = await self._batcher.submit(read)
        except TimeoutError:
            finished_at = read.finished_at
            if finished_at is None or finished_at - began > self.budget_s:
                return self._all_defaults("over_budget")
            found, timing = read.values, None
        except Exception as err:  # Redis down, reads queue full: all degrade to the defaults
            self._warn(err)
            return self._all_defaults("unavailable")
        values, defaulted = {}, []
        for ref, value in zip(self.features, found, strict=True):
            if value is None:
                value = self.defaults[ref]
                defaulted.append(ref)
            values[ref] = value
        row_times = {view: ms for view, ms in (read.row_times_ms or {}).items() if ms is not None}
        absorbed = {view: positions for view, positions in (read.row_absorbed or {}).items() if positions}
        read_as_of = read.read_as_of or {}
        stale = [ref for ref in self.features if ref.split(":", 1)[0] in read_as_of] if read_as_of else []
        return FetchedFeatures(
            values,
            defaulted,
            dict.fromkeys(defaulted, "missing"),
            row_times_ms=row_times,
            row_absorbed=absorbed,
            stale=stale,
            read_as_of_ms=read_as_of,
            read=timing,
        )

    def _warn(self, err: Exception) -> None:
        """Log a read that fell back for an error, at most once per ``_WARN_EVERY_S`` (an outage would
        otherwise write a line per request)."""
        now = time.monotonic()
        if now - self._warned_at < _WARN_EVERY_S:
            self._unwarned += 1
            return
        log.warning("feature reads fall back to defaults: %r (%d more since the last warning)", err, self._unwarned)
        self._warned_at, self._unwarned = now, 0

    async def close(self) -> None:
        """Stop the reads."""
        await self._batcher.close()
