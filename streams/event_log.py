"""The event log read incrementally: the job's verdicts on the events from an event time on, each record decoded once.

The consistency replay needs, for each batch of sampled requests, the events the job accepted over the windows the
batch's features reach back to. Reading and decoding all of them again for every batch costs more the longer the
windows (24 h of events, every minute). An ``EventLogWindow`` keeps the valid events it decoded and its position in
each partition, reads only the records published since, and lets go of the events older than the replays need.

Why letting go of old events changes no verdict. The job's rule (``split_late``): within a partition, in offset order,
an event at time t is late when t < M - B, where M is the newest event time before it in the partition and B >= 0 the
out-of-orderness. Take any floor F and an event at t >= F, and let M_F be the newest time before it among the events at
or after F (M_F <= M). If the newest before it is itself at or after F, M_F = M: the same verdict. If not, M < F <= t,
so t >= M - B: accepted over the whole log; and M_F < M <= t (or no event at all before it), so accepted over the kept
events too. So the verdict on every event at or after F, kept or read later, is the one the whole log gives, whatever
F is: ``events_since`` is the rule, ``split_late`` stays the one judge. (The replay's floor, ``events_needed_since``,
is the earliest time its windows reach back to less the out-of-orderness; the verdicts would not need that margin.)
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from streams.feature_plan import FeaturePlan
from streams.recompute import split_late, valid_events
from streams.topics import read_topic_from


def events_since(events: pd.DataFrame, since_ms: int, time_field: str) -> pd.DataFrame:
    """The events whose event time (``time_field``) is at or after ``since_ms``. ``split_late`` judges each of them
    over these alone as it does over all of ``events`` (module docstring)."""
    return events[events[time_field] >= since_ms]


class EventLogWindow:
    """The valid events of one of ``plan``'s topics from an event time on, read incrementally, judged as the job judges
    them.

    One caller at a time (it keeps positions and events between calls without a lock)."""

    def __init__(
        self,
        plan: FeaturePlan,
        topic: str,
        bootstrap_servers: str,
        client_config: Mapping[str, str] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        """``timeout_s``: the longest one call may take to read the topic to its end."""
        self.plan, self.topic, self.bootstrap_servers, self.client_config, self.timeout_s = (
            plan,
            topic,
            bootstrap_servers,
            client_config,
            timeout_s,
        )
        self.source = plan.source(topic)
        self._positions: dict[int, int] | None = None
        self._since_ms = 0
        self._events = valid_events(plan, topic, [])
        #: Records the last call read and decoded: those published since the call before (all of them on a first read).
        self.records_read = 0

    def events(self, since_ms: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``(accepted, late)`` among the valid events at or after ``since_ms`` in event time: the rows with those event
        times that ``accepted_events(plan, read_topic(..., since_ms=S))`` gives now, S the ``since_ms`` of the read that
        started this window (rows in partition and offset order, with an index of their own).

        The first call reads from each partition's first record whose Kafka timestamp is at or after ``since_ms``, as
        ``read_topic`` does; a later one only what was published since, unless it reaches further back than the call
        before (those events were let go): then it starts again, as a first call."""
        if self._positions is None or since_ms < self._since_ms:
            self._positions = None
        read = read_topic_from(
            self.bootstrap_servers, self.topic, self.client_config, self.timeout_s, since_ms=since_ms, positions=self._positions
        )
        time_field = self.source.time_field
        kept = [] if self._positions is None else [events_since(self._events, since_ms, time_field)]
        new = events_since(valid_events(self.plan, self.topic, read.messages), since_ms, time_field)
        # An empty frame in a concatenation would turn typed columns into objects.
        frames = [frame for frame in (*kept, new) if len(frame)]
        self._events = pd.concat(frames, ignore_index=True) if frames else new
        self._positions, self._since_ms, self.records_read = read.positions, since_ms, len(read.messages)
        return split_late(self._events, self.source.out_of_orderness_ms, time_field)

    @property
    def retained_bytes(self) -> int:
        """What the events kept between calls take in memory (pandas' deep measure)."""
        return int(self._events.memory_usage(deep=True).sum())
