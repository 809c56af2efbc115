"""The scorer core: request → feature fetch (budgeted) → dynamic batcher → model → prediction record.

Every front door (HTTP, Kafka, gRPC) is a thin adapter over ``Scorer.score``; the record it
returns is what the feature + prediction log carries: the exact inputs used, which features were
defaulted, the model version that scored it and each stage's latency.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from online.batcher import DynamicBatcher
from online.features import FeatureFetcher
from online.metrics import ScorerMetrics
from online.onnx_runtime import OnnxModel
from online.result_cache import ResultCache
from schemas.model_contract import REQUEST_PREFIX
from schemas.records import PredictionRecord, ScoreRequest

log = logging.getLogger("loopline.scoring")


class RequestError(ValueError):
    """A request the model cannot score as it is (e.g. a request field the model needs is missing)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


@dataclass(frozen=True)
class BatchingKnobs:
    """Triton's dynamic batcher knobs (see ``online/batcher.py``)."""

    max_batch_size: int = 64
    max_queue_delay_s: float = 0.002
    max_queue_size: int = 1024
    preferred_batch_sizes: tuple[int, ...] = field(default_factory=tuple)


class Scorer:
    """Scores requests with one model; batches concurrent requests into single model calls."""

    def __init__(
        self,
        model: OnnxModel,
        fetcher: FeatureFetcher,
        knobs: BatchingKnobs,
        metrics: ScorerMetrics,
        cache: ResultCache | None = None,
    ) -> None:
        self.model = model
        self.fetcher = fetcher
        self.metrics = metrics
        self.cache = cache
        self.batcher: DynamicBatcher[list[float], float] = DynamicBatcher(
            self._run_batch,
            max_batch_size=knobs.max_batch_size,
            max_queue_delay_s=knobs.max_queue_delay_s,
            max_queue_size=knobs.max_queue_size,
            preferred_batch_sizes=knobs.preferred_batch_sizes,
            on_batch=metrics.observe_batch,
        )
        metrics.model.info({"name": model.name, "version": model.version, "provider": model.provider})

    @property
    def ready(self) -> bool:
        """A model is loaded and warmed up."""
        return self.model.warm

    async def close(self) -> None:
        """Stop batching and fetching; requests still queued fail with Overloaded."""
        await self.batcher.close()
        await self.fetcher.close()
        if self.cache is not None:
            await self.cache.close()

    def _run_batch(self, rows: list[list[float]]) -> list[float]:
        return self.model.predict(np.asarray(rows, dtype=np.float32)).tolist()

    def _vector(self, request: ScoreRequest, features: dict) -> tuple[list[float], dict]:
        """The model's input row, and the values used by input name; RequestError for a missing request field."""
        used, row = {}, []
        for name in self.model.inputs:
            if name.startswith(REQUEST_PREFIX):
                field = name[len(REQUEST_PREFIX):]
                if field not in request.request_fields:
                    raise RequestError(f"request_fields.{field}", f"required by model {self.model.name} v{self.model.version}")
                value = request.request_fields[field]
            else:
                value = features.get(name)
            used[name] = value
            row.append(math.nan if value is None or isinstance(value, str) else float(value))
        return row, used

    async def _infer(self, row: list[float]) -> tuple[float, float, float]:
        """(score, queue wait s, inference s) for one input row, from the result cache when it has it."""
        key = None
        if self.cache is not None:
            key = self.cache.key(self.model.name, self.model.version, row)
            cached = await self.cache.get(key)
            self.metrics.cache_requests.labels("miss" if cached is None else "hit").inc()
            if cached is not None:
                return cached, 0.0, 0.0
        score, timing = await self.batcher.submit(row)
        if key is not None:
            await self.cache.put(key, score)
        return score, timing.queue_wait_s, timing.run_s

    async def score(self, request: ScoreRequest) -> PredictionRecord:
        """Score one request. Raises Overloaded when the batcher's queue is full, RequestError for a bad request."""
        began = time.perf_counter()
        fetched = await self.fetcher.fetch(request.entity_keys)
        fetched_at = time.perf_counter()
        row, used = self._vector(request, fetched.values)
        score, queue_wait_s, inference_s = await self._infer(row)
        total = time.perf_counter() - began
        stages = {"feature_fetch": fetched_at - began, "queue_wait": queue_wait_s, "inference": inference_s, "total": total}
        for stage, seconds in stages.items():
            self.metrics.stage_seconds.labels(stage).observe(seconds)
        self.metrics.features.inc(len(self.fetcher.features))
        self.metrics.defaulted_features.inc(len(fetched.defaulted))
        return PredictionRecord(
            schema_version=PredictionRecord.SCHEMA_VERSION,
            request_id=request.request_id,
            entity_keys=request.entity_keys,
            features=used,
            defaulted_features=fetched.defaulted,
            model_name=self.model.name,
            model_version=self.model.version,
            score=score,
            stage_latency_ms={stage: round(seconds * 1000, 3) for stage, seconds in stages.items()},
            requested_at_ms=request.requested_at_ms,
            scored_at_ms=int(time.time() * 1000),
        )
