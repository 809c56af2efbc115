"""Counting a request once when its prediction is logged twice (the at-least-once Kafka door after a crash).

A scorer that crashes between acknowledging predictions and committing their offsets scores those requests again:
the same request id, a second record a little later in the log. Readers that count requests keep the ids of the
last ``capacity`` records and skip a record whose id they hold; a duplicate comes within a restart of the first,
far inside that memory at any rate a monitor reads.
"""

from __future__ import annotations

from collections import OrderedDict


class RecentRequests:
    """The request ids of the last ``capacity`` records seen."""

    def __init__(self, capacity: int = 200_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def first_time(self, request_id: str) -> bool:
        """Whether ``request_id`` is new (then it is remembered); False for one seen within the last ``capacity``."""
        if request_id in self._ids:
            return False
        self._ids[request_id] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
        return True
