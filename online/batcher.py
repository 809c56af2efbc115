"""A dynamic batcher with Triton's knobs: requests wait briefly so the model sees whole batches.

* ``max_batch_size``: the most requests in one model call.
* ``max_queue_delay_s``: the longest the oldest queued request waits for a batch to fill.
* ``max_queue_size``: queued requests beyond this are refused at once with ``Overloaded``
  (a clear error instead of unbounded memory and latency).
* ``preferred_batch_sizes``: when the queue holds at least one of these sizes, a batch of the
  largest such size goes at once instead of waiting for ``max_batch_size``.

One batch runs at a time, so requests that arrive during a batch queue up for the next one: under load batches
fill by themselves. A ``run_batch`` that is a coroutine function (I/O on the event loop: the feature reads) is awaited
on the loop; any other runs on a worker thread of its own (model runtimes release the GIL), or with ``on_loop`` on the
loop itself (a model on the CPU: a worker has one core, so a thread would only add two hand-offs per batch).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from online.errors import Overloaded

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(frozen=True)
class BatchingKnobs:
    """Triton's dynamic batcher knobs, as ``DynamicBatcher`` takes them."""

    max_batch_size: int = 64
    max_queue_delay_s: float = 0.002
    max_queue_size: int = 1024
    preferred_batch_sizes: tuple[int, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class BatchTiming:
    """How long a request waited in the queue and how long its batch took, in seconds, and the batch size."""

    queue_wait_s: float
    run_s: float
    batch_size: int


class DynamicBatcher(Generic[Item, Result]):
    """Collects submitted items into batches for ``run_batch(items) -> results`` (one result per item)."""

    def __init__(
        self,
        run_batch: Callable[[list[Item]], Sequence[Result] | Awaitable[Sequence[Result]]],
        max_batch_size: int = 64,
        max_queue_delay_s: float = 0.002,
        max_queue_size: int = 1024,
        preferred_batch_sizes: Sequence[int] = (),
        on_batch: Callable[[int, int], None] | None = None,
        on_loop: bool = False,
    ) -> None:
        """``on_batch(batch_size, queue_depth_left)`` is called as each batch starts (for metrics); ``on_loop``: a
        blocking ``run_batch`` is called on the event loop rather than on a worker thread."""
        if max_batch_size < 1 or max_queue_size < 1 or max_queue_delay_s < 0:
            raise ValueError("max_batch_size and max_queue_size must be ≥ 1, max_queue_delay_s ≥ 0")
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue_size = max_queue_size
        self.preferred_batch_sizes = sorted(s for s in preferred_batch_sizes if 1 <= s <= max_batch_size)
        self.on_batch = on_batch
        self._queue: deque[tuple[Item, float, asyncio.Future]] = deque()
        self._arrived = asyncio.Event()
        self._awaited = inspect.iscoroutinefunction(run_batch)
        self._inline = on_loop and not self._awaited
        threaded = not (self._awaited or self._inline)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch") if threaded else None
        self._loop_task: asyncio.Task | None = None
        self._closing = False

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a batch."""
        return len(self._queue)

    async def submit(self, item: Item) -> tuple[Result, BatchTiming]:
        """Queue ``item`` and wait for its result; Overloaded at once when the queue is full or the batcher closed."""
        if self._closing:
            raise Overloaded("the scorer is shutting down")
        if len(self._queue) >= self.max_queue_size:
            raise Overloaded(f"scoring queue full ({self.max_queue_size} waiting); retry later")
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.append((item, time.perf_counter(), future))
        self._arrived.set()
        return await future

    def _batch_size_now(self) -> int | None:
        """How many to take now, or None to keep waiting for more."""
        depth = len(self._queue)
        if depth >= self.max_batch_size:
            return self.max_batch_size
        fitting = [size for size in self.preferred_batch_sizes if size <= depth]
        if fitting:
            return fitting[-1]
        if time.perf_counter() - self._queue[0][1] >= self.max_queue_delay_s:
            return depth
        return None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            size = self._batch_size_now()
            if size is None:
                waited = time.perf_counter() - self._queue[0][1]
                self._arrived.clear()
                # Woken by the next arrival or when the delay is up (a timer, not a task per wait as wait_for makes).
                delay_up = loop.call_later(max(0.0, self.max_queue_delay_s - waited), self._arrived.set)
                await self._arrived.wait()
                delay_up.cancel()
                continue
            batch = [self._queue.popleft() for _ in range(size)]
            if self.on_batch:
                self.on_batch(size, len(self._queue))
            started = time.perf_counter()
            try:
                taken = [item for item, _, _ in batch]
                if self._inline:
                    results = self.run_batch(taken)
                elif self._awaited:
                    results = await self.run_batch(taken)
                else:
                    results = await loop.run_in_executor(self._worker, self.run_batch, taken)
                if len(results) != len(batch):
                    raise RuntimeError(f"the batch of {len(batch)} requests got {len(results)} results")
            except Exception as err:  # the batch's requests fail; the batcher goes on
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                continue
            run_s = time.perf_counter() - started
            for (_, queued_at, future), result in zip(batch, results, strict=True):
                if not future.done():  # its caller may have given up
                    future.set_result((result, BatchTiming(started - queued_at, run_s, size)))
            if self._inline:  # the loop's other work (this batch's callers among it) goes before the next batch
                await asyncio.sleep(0)

    async def close(self) -> None:
        """Stop batching; queued requests fail with Overloaded."""
        # The flag as well as the cancel: a run_batch that swallows a cancellation (redis-py's asyncio read can, when
        # the cancel meets its own timeout) would leave the loop waiting for the next arrival, and close with it.
        self._closing = True
        self._arrived.set()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        while self._queue:
            _, _, future = self._queue.popleft()
            if not future.done():
                future.set_exception(Overloaded("the scorer is shutting down"))
        if self._worker is not None:
            self._worker.shutdown(wait=False)
