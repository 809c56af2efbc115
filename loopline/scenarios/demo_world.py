"""The demo's synthetic world (the project's, ``streams/world.py``), its recent history first, then live.

A window fills from empty: a feature over the last hour, read a minute after a stream starts, counts a minute of
events. A skew reference taken then and the live distribution later differ by construction, and every such feature
"drifts". So the demo's world starts ``history_s`` in the past: that stretch goes to Kafka at once (events only:
nothing scored them, nobody labels them), the rest in real time with no gap between (``EventProducer``'s wall clock
pacing). Once the feature job has absorbed the history, ``go_live()`` turns scoring on: every scored event from then
on is followed by a score request naming it, and the labels of those events are published as they come.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from loopline.components import project, world
from loopline.scenarios.demo_scoring import DemoScoring
from loopline.settings import Settings
from schemas.topics import SCORE_REQUESTS
from schemas.validation import encode
from streams.producer import EventProducer, PublishStats
from streams.world import Emitted

_LINGER_MS = 20.0


class DemoWorld:
    """Publishes the world in a thread of its own: its history at once, then live until stopped."""

    def __init__(
        self,
        settings: Settings,
        scoring: DemoScoring,
        rate_per_s: float,
        history_s: float,
        malformed_rate: float,
        label_delay_s: tuple[float, float],
    ) -> None:
        """A world of ``rate_per_s`` events (the project's, with the settings' knobs) starting ``history_s`` ago;
        ``malformed_rate`` of its live records are broken on purpose, its labels come ``label_delay_s`` after."""
        self.settings, self.scoring = settings, scoring
        now_ms = int(time.time() * 1000)
        #: The records of this world are published from this time on (Kafka timestamps): where the feature job starts.
        self.published_from_ms = now_ms
        self.history_from_ms = now_ms - int(history_s * 1000)
        self._world = world(
            settings, rate_per_s, now_ms // 1000, self.history_from_ms, malformed_rate, label_delay_s=label_delay_s
        )
        self._labels_topic = project(settings).labels.topic
        self._live = threading.Event()
        self._stop = threading.Event()
        self._scored: set[str] = set()
        self.history_published = 0
        self.published = 0
        self.live_since_ms: int | None = None
        #: How far the world's stream time has got (it reaches the wall clock once its history is out).
        self.stream_time_ms = self.history_from_ms
        self._outcome: list[PublishStats | BaseException] = []
        self._thread = threading.Thread(target=self._publish, name="demo-world", daemon=True)

    def start(self) -> None:
        """Start publishing."""
        self._thread.start()

    def go_live(self) -> None:
        """Score every event the world scores from now on (and publish the labels of those)."""
        self.live_since_ms = int(time.time() * 1000)
        self._live.set()

    def stop(self) -> PublishStats:
        """Stop publishing, wait for every record to be acknowledged, and say what was delivered (DeliveryError if
        something was not; the error the producer stopped on, if it stopped by itself)."""
        self._stop.set()
        self._thread.join(90)
        if not self._outcome:
            raise RuntimeError("the world's producer did not finish within 90 s")
        if isinstance(self._outcome[0], BaseException):
            raise self._outcome[0]
        return self._outcome[0]

    @property
    def running(self) -> bool:
        """Whether the producer is still publishing."""
        return self._thread.is_alive()

    def _publish(self) -> None:
        kafka = self.settings.kafka
        try:
            # At the default linger nearly every record went in a produce request of its own (the broker's largest load in
            # the demo, counted with tshark); 20 ms lets a few share one.
            producer = EventProducer(
                kafka.bootstrap, client_id="loopline-demo-world", client_config=kafka.client_config, linger_ms=_LINGER_MS
            )
            self._outcome.append(producer.publish(self._records(), wall_clock=True, on_progress=self._count))
        except BaseException as err:  # the demo reports it when it stops the world
            self._outcome.append(err)

    def _count(self, published: int) -> None:
        self.published = published

    def _records(self) -> Iterator[Emitted]:
        for emitted in self._world:
            if self._stop.is_set():
                return
            self.stream_time_ms = emitted.emit_at_ms
            # Decide history or live when the record is due, not when the producer asks for the next one (it asks a
            # record ahead, then waits for its time): a transaction due after go_live() is scored.
            if (due_s := emitted.emit_at_ms / 1000 - time.time()) > 0 and self._stop.wait(due_s):
                return
            if not self._live.is_set():
                # History: the events only (no broken records, no labels: nothing scored them).
                if emitted.record is not None and emitted.topic != self._labels_topic:
                    self.history_published += 1
                    yield emitted
                continue
            if emitted.topic == self._labels_topic:
                if emitted.key in self._scored:  # a label is keyed by the event it is about
                    yield emitted
                continue
            yield emitted
            request = self._world.score_request(emitted, f"{self.scoring.run_id}-{len(self._scored)}", self.scoring.skew)
            if request is not None:
                self._scored.add(request.event_id)
                yield Emitted(SCORE_REQUESTS.name, request.request_id, encode(request), emitted.emit_at_ms, request)
