"""A project's synthetic world: the events, labels and score requests its demo, tests and benchmarks publish.

A project declares its world in its project file (``world: world.py:ClassName``); the engine knows it only by this
interface, so a demo, a fault drill or a benchmark runs on any project that ships one:

* ``World(project, config, seed, start_ms)``: iterated, the world's records in emission order (``emit_at_ms`` never
  decreases): its events on the project's topics (now and then out of order, late, or broken on purpose, as the
  ``config`` says), and the labels of scored events, later, each keyed by the id of the event it labels;
* ``score_request(emitted, request_id, skew)``: the score request a live event gets when it happens (None for an
  event nobody scores: a location ping, a label), naming the event (labels join its prediction by it), its request
  fields multiplied by ``skew`` (the demo's injected skew, by field);
* ``requests(rate_per_s, run_id, event_ids)``: a paced stream of score requests for the world's entities (a load);
* ``label(event_id, n)``: a label of the scored event ``event_id`` on the project's label topic, with a made-up
  outcome that varies with ``n`` (a fault drill labels its own requests).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from schemas.records import ScoreRequest


@dataclass(frozen=True)
class Emitted:
    """One record to publish: where, with which key, the bytes, and when in stream time.

    ``record`` is None for a deliberately malformed payload.
    """

    topic: str
    key: str
    value: bytes
    emit_at_ms: int
    record: BaseModel | None


@dataclass(frozen=True)
class WorldConfig:
    """Knobs every world takes (rates per event), and the world's own (``knobs``: how many customers, shops or vehicles
    it has, as the world defines them)."""

    rate_per_s: float = 1_000.0
    out_of_order_rate: float = 0.05
    max_out_of_order_s: float = 5.0
    late_rate: float = 0.005
    late_by_s: tuple[float, float] = (60.0, 600.0)
    malformed_rate: float = 0.0
    label_delay_s: tuple[float, float] = (5.0, 120.0)
    knobs: Mapping[str, Any] = field(default_factory=dict)

    def event_time(self, rng: random.Random, now_ms: int) -> int:
        """An event's time as producers stamp it: usually now, sometimes a little behind (out of order, up to
        ``max_out_of_order_s``), rarely far behind (late, by ``late_by_s``)."""
        draw = rng.random()
        if draw < self.late_rate:
            return now_ms - int(rng.uniform(*self.late_by_s) * 1000)
        if draw < self.late_rate + self.out_of_order_rate:
            return now_ms - int(rng.uniform(0, self.max_out_of_order_s) * 1000)
        return now_ms


class Later:
    """Records a world publishes later than it makes them (labels, a burst's next events), in emission order."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Emitted]] = []
        self._sequence = itertools.count()

    def add(self, emitted: Emitted) -> None:
        heapq.heappush(self._heap, (emitted.emit_at_ms, next(self._sequence), emitted))

    def due(self, now_ms: int) -> Iterator[Emitted]:
        """The records due by ``now_ms``, earliest first (in the order added, at the same time)."""
        while self._heap and self._heap[0][0] <= now_ms:
            yield heapq.heappop(self._heap)[2]


class World(Protocol):
    """What the engine asks of a project's synthetic world (the module docstring)."""

    def __iter__(self) -> Iterator[Emitted]: ...

    def score_request(self, emitted: Emitted, request_id: str, skew: Mapping[str, float]) -> ScoreRequest | None: ...

    def requests(self, rate_per_s: float, run_id: str, event_ids: bool = False) -> Iterator[Emitted]: ...

    def label(self, event_id: str, n: int) -> Emitted: ...
