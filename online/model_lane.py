"""One loaded model version as the scorer serves it: its feature fetch, its batching, its requests in flight.

An ONNX model is batched here, by a dynamic batcher of its own; a vLLM model is batched by its
server (continuous batching), so its requests go straight to its client.

A hot swap puts a new lane in place and retires the old one: requests the old lane took finish
on it (its batcher keeps running until the last of them is answered), then it is closed and its
model released.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict

import numpy as np

from online.batcher import BatchingKnobs, DynamicBatcher
from online.features import FeatureFetcher
from online.metrics import ScorerMetrics
from online.onnx_runtime import OnnxModel
from online.vllm_runtime import VllmModel

#: A loaded model version of any runtime.
ServedModel = OnnxModel | VllmModel


class ModelLane:
    """``model`` serving under ``alias``, reading the features it needs through ``fetcher``; ``infer(row)`` scores one
    input row."""

    def __init__(
        self, alias: str, model: ServedModel, fetcher: FeatureFetcher, knobs: BatchingKnobs, metrics: ScorerMetrics
    ) -> None:
        self.alias = alias
        self.model = model
        self.fetcher = fetcher
        self._batcher: DynamicBatcher[list[float | str], float] | None = None
        if isinstance(model, OnnxModel):
            # On the CPU a batch runs on the event loop (the worker's core); on a GPU on a thread, so the loop serves
            # requests while the device computes.
            on_cpu = model.provider == "CPUExecutionProvider"
            self._batcher = DynamicBatcher(self._run_batch, on_batch=metrics.observe_batch, on_loop=on_cpu, **asdict(knobs))
            self.infer = self._batcher.submit
        else:
            self.infer = model.infer
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def _run_batch(self, rows: list[list[float | str]]) -> list[float]:
        model = self.model
        numbers = np.array([[row[i] for i in model.numbers] for row in rows], dtype=np.float32).reshape(
            len(rows), len(model.numbers)
        )
        texts = np.array([[row[i] for i in model.texts] for row in rows], dtype=object).reshape(len(rows), len(model.texts))
        return model.predict(numbers, texts).tolist()

    def enter(self) -> None:
        """A request starts on this lane."""
        self._in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        """A request this lane took is answered."""
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def retire(self) -> None:
        """Wait for the requests in flight on this lane, then stop its batching and feature reads."""
        await self._idle.wait()
        if self._batcher is not None:
            await self._batcher.close()
        else:
            await self.model.close()
        await self.fetcher.close()
