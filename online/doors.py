"""What every front door is to the process that runs it: ``run(stop)``, and whether it is stuck.

A door runs until ``stop`` is set, then finishes what it took and returns. ``stalled_s`` tells the
liveness probe how long the door has held work without finishing any: a process whose door is
stuck (a broker call that never returns, say) should be restarted by its orchestrator rather
than stay "alive" doing nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Protocol


class FrontDoor(Protocol):
    """A way requests reach the scorer (HTTP, gRPC, Kafka)."""

    name: str

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; return once what was taken is finished."""

    def stalled_s(self) -> float:
        """Seconds this door has held work without finishing any (0 when it is idle or progressing)."""


class Progress:
    """A door's progress: when it last finished work, and since when it has held unfinished work."""

    def __init__(self) -> None:
        self._last_progress = time.monotonic()
        self._held_since: float | None = None

    def holding(self) -> None:
        """The door took work it has not finished."""
        if self._held_since is None:
            self._held_since = time.monotonic()

    def progressed(self, still_holding: bool) -> None:
        """The door finished some work; ``still_holding`` says whether it holds more."""
        self._last_progress = time.monotonic()
        if not still_holding:
            self._held_since = None

    def stalled_s(self) -> float:
        """Seconds of holding work since the last progress (0 when holding none)."""
        if self._held_since is None:
            return 0.0
        return time.monotonic() - max(self._held_since, self._last_progress)


async def serve_doors(doors: Sequence[FrontDoor], stop: asyncio.Event, beside: Sequence[Awaitable] = ()) -> None:
    """Run ``doors`` until ``stop`` is set or one of them fails, with ``beside`` (e.g. a model watcher) running too.

    Then every door is stopped and awaited; a door's failure is raised after the others have stopped.
    """
    running = [asyncio.ensure_future(door.run(stop)) for door in doors]
    others = [asyncio.ensure_future(work) for work in beside]
    stopped = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait([*running, stopped], return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    await asyncio.gather(*running, *others, stopped, return_exceptions=True)
    for task in done:
        if task is not stopped:
            task.result()


def stalled_doors(doors: Sequence[FrontDoor], after_s: float) -> dict[str, float]:
    """The doors stalled for longer than ``after_s``, with their seconds."""
    return {door.name: round(s, 1) for door in doors if (s := door.stalled_s()) > after_s}
