"""The dynamic batcher's knobs do what Triton's do (pure asyncio: the model is a function that records its batches)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from online.batcher import DynamicBatcher
from online.errors import Overloaded


class RecordingModel:
    """Doubles its inputs and remembers each batch; ``gate`` holds a batch until released, ``entered`` says one came."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, items: list[int]) -> list[int]:
        self.entered.set()
        self.gate.wait(5)
        self.batches.append(items)
        return [2 * item for item in items]


def test_concurrent_requests_share_batches_and_get_their_own_results() -> None:
    model = RecordingModel()

    async def run() -> list:
        batcher = DynamicBatcher(model, max_batch_size=16, max_queue_delay_s=0.01)
        results = await asyncio.gather(*(batcher.submit(i) for i in range(64)))
        await batcher.close()
        return results

    results = asyncio.run(run())
    assert [result for result, _ in results] == [2 * i for i in range(64)]
    assert max(len(batch) for batch in model.batches) == 16
    assert len(model.batches) <= 8, f"64 concurrent requests should fill batches, got {[len(b) for b in model.batches]}"
    assert sorted(timing.batch_size for _, timing in results) == sorted(len(b) for b in model.batches for _ in b)


def test_a_lone_request_waits_at_most_the_queue_delay() -> None:
    model = RecordingModel()

    async def run() -> float:
        batcher = DynamicBatcher(model, max_batch_size=64, max_queue_delay_s=0.05)
        began = time.perf_counter()
        await batcher.submit(1)
        elapsed = time.perf_counter() - began
        await batcher.close()
        return elapsed

    elapsed = asyncio.run(run())
    assert 0.045 <= elapsed < 0.5
    assert model.batches == [[1]]


def test_preferred_size_goes_without_waiting_for_a_full_batch() -> None:
    model = RecordingModel()

    async def run() -> float:
        batcher = DynamicBatcher(model, max_batch_size=64, max_queue_delay_s=5.0, preferred_batch_sizes=(4,))
        began = time.perf_counter()
        await asyncio.gather(*(batcher.submit(i) for i in range(4)))
        elapsed = time.perf_counter() - began
        await batcher.close()
        return elapsed

    assert asyncio.run(run()) < 1.0, "four queued requests form the preferred batch at once"
    assert model.batches == [[0, 1, 2, 3]]


def test_beyond_the_queue_size_requests_fail_fast_and_the_rest_complete() -> None:
    model = RecordingModel()
    model.gate.clear()  # the first batch blocks, so the queue fills behind it

    async def run() -> list:
        batcher = DynamicBatcher(model, max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=3)
        first = asyncio.ensure_future(batcher.submit(0))
        assert await asyncio.to_thread(model.entered.wait, 5), "the first batch never reached the model"
        queued = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 4)]
        await asyncio.sleep(0)
        # Refused at once, while the model still holds its first batch: were it to wait for room, it would wait on the
        # closed gate, and wait_for would raise TimeoutError rather than Overloaded.
        with pytest.raises(Overloaded, match="queue full"):
            await asyncio.wait_for(batcher.submit(99), 2)
        model.gate.set()
        results = await asyncio.wait_for(asyncio.gather(first, *queued), 5)
        await batcher.close()
        return results

    results = asyncio.run(run())
    assert [result for result, _ in results] == [0, 2, 4, 6]


def test_a_failing_batch_fails_its_requests_only() -> None:
    calls = []

    def flaky(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("model exploded")
        return items

    async def run():
        batcher = DynamicBatcher(flaky, max_batch_size=8, max_queue_delay_s=0.0)
        with pytest.raises(RuntimeError, match="exploded"):
            await batcher.submit(1)
        result, _ = await batcher.submit(2)
        await batcher.close()
        return result

    assert asyncio.run(run()) == 2


def test_a_batch_answered_with_too_few_results_fails_its_requests_and_the_batcher_goes_on() -> None:
    def short(items: list[int]) -> list[int]:
        return items[:-1] if len(items) > 1 else items

    async def run():
        batcher = DynamicBatcher(short, max_batch_size=2, max_queue_delay_s=0.2)
        outcomes = await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)
        alone, _ = await asyncio.wait_for(batcher.submit(3), 5)  # the batcher still serves
        await batcher.close()
        return outcomes, alone

    outcomes, alone = asyncio.run(run())
    assert all(isinstance(o, RuntimeError) and "got 1 results" in str(o) for o in outcomes), outcomes
    assert alone == 3


def test_a_coroutine_batch_is_awaited_on_the_loop_and_a_swallowed_cancel_does_not_hang_close() -> None:
    """A coroutine ``run_batch`` (the feature reads) runs on the event loop's own thread. One that turns the close's
    cancellation into an error of its own (redis-py's asyncio read can, when the cancel meets its socket timeout)
    still lets ``close`` return, and a request after it is refused rather than left waiting."""
    threads: list[int] = []
    started = asyncio.Event()

    async def read(items: list[int]) -> list[int]:
        threads.append(threading.get_ident())
        if len(threads) == 1:
            return items
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise TimeoutError("the read's own timeout") from None
        return items

    async def run():
        batcher = DynamicBatcher(read, max_batch_size=4, max_queue_delay_s=0.0)
        first, _ = await batcher.submit(1)
        pending = asyncio.ensure_future(batcher.submit(2))
        await started.wait()
        await asyncio.wait_for(batcher.close(), 5)
        with pytest.raises(Overloaded):
            await asyncio.wait_for(batcher.submit(3), 5)
        return first, threading.get_ident(), await asyncio.gather(pending, return_exceptions=True)

    first, loop_thread, (outcome,) = asyncio.run(run())
    assert first == 1 and set(threads) == {loop_thread}
    assert isinstance(outcome, TimeoutError), outcome
