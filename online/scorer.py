"""The scorer core: request → feature fetch (budgeted) → dynamic batcher → model → prediction record.

Every front door (HTTP, Kafka, gRPC) is a thin adapter over ``Scorer.score``; the record it
returns is what the feature + prediction log carries: the exact inputs used, which features were
defaulted, the model version that scored it and each stage's latency.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import numpy as np

from feature_store.online_read import OnlineReader
from online.batcher import BatchingKnobs, BatchTiming
from online.errors import InvalidRequest, ModelNotReady, Overloaded, ScoringError, ScoringFailed, UnknownModel
from online.features import FeatureFetcher, FetchedFeatures
from online.metrics import ScorerMetrics
from online.model_lane import ModelLane, ServedModel
from online.result_cache import ResultCache
from online.tracing import RequestTrace
from schemas.model_registry import CANARY_ALIAS, PROD_ALIAS, routes_to_canary
from schemas.records import PredictionRecord, ScoreRequest

log = logging.getLogger(__name__)
#: A scorer that refused a request for want of room this recently is overloaded (see ``Scorer.score``).
_OVERLOAD_MEMORY_S = 1.0
#: Models take 32-bit floats: a larger magnitude would reach them as infinity.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class Scorer:
    """Scores requests with the models installed under the aliases ``prod`` and (optionally) ``canary``.

    Each installed model has a lane of its own (``online/model_lane.py``): concurrent requests for
    the same model are batched into single model calls. ``canary_share`` of the requests, chosen by
    a hash of their request id (``schemas/model_registry.py``), go to the canary.
    """

    def __init__(
        self,
        reader: OnlineReader,
        budget_s: float,
        knobs: BatchingKnobs,
        metrics: ScorerMetrics,
        cache: ResultCache | None = None,
        model: ServedModel | None = None,
        feature_batch_size: int = 64,
        max_in_flight: int = 64,
    ) -> None:
        """``model``, when given, serves as ``prod`` from the start (else ``install`` one). Concurrent feature
        reads share pipelined Redis round trips of up to ``feature_batch_size`` entities, whatever the model's
        batch size. At most ``max_in_flight`` requests are scored at once (admission control: :meth:`score`)."""
        self.reader = reader
        self.budget_s = budget_s
        self.knobs = knobs
        self.feature_batch_size = feature_batch_size
        self.metrics = metrics
        self.cache = cache
        #: The share of requests the canary scores (when one is installed).
        self.canary_share = 0.0
        self._lanes: dict[str, ModelLane] = {}
        self._ready = asyncio.Event()
        self.max_in_flight = max_in_flight
        self._room = asyncio.Semaphore(max_in_flight)
        self._full_at = -math.inf  # when a request was last refused for want of room (time.monotonic())
        if model is not None:
            self._put(PROD_ALIAS, model)

    @property
    def models(self) -> dict[str, ServedModel]:
        """The model serving under each alias."""
        return {alias: lane.model for alias, lane in self._lanes.items()}

    @property
    def ready(self) -> bool:
        """A prod model is loaded and warmed up."""
        return self._ready.is_set()

    async def wait_ready(self) -> None:
        """Return once a prod model is installed."""
        await self._ready.wait()

    async def install(self, alias: str, model: ServedModel) -> None:
        """Serve ``model`` (loaded and warm) under ``alias`` from now on.

        The switch is atomic (one assignment on the event loop); requests the previous model took
        finish on it, and then it is released. Returns once it is. A new canary restarts the per-version
        metrics (``ScorerMetrics.start_comparison``).
        """
        if alias == CANARY_ALIAS:
            # A new canary: its requests and prod's are counted from here on, in the same step that routes to it.
            self.metrics.start_comparison()
        previous = self._put(alias, model)
        if previous is not None:
            self.metrics.model_swaps.labels(alias).inc()
            log.info("%s: swapped %s v%s → v%s", alias, model.name, previous.model.version, model.version)
            await previous.retire()

    def _put(self, alias: str, model: ServedModel) -> ModelLane | None:
        """Route ``alias`` to a new lane for ``model``; the lane it replaces, if any."""
        features = [spec.name for spec in model.inputs if not spec.from_request]
        fetcher = FeatureFetcher(
            self.reader, features, self.budget_s, max_batch_size=self.feature_batch_size, view_lag=self.metrics.feature_view_lag
        )
        previous = self._lanes.get(alias)
        self._lanes[alias] = ModelLane(alias, model, fetcher, self.knobs, self.metrics)
        self.metrics.model.labels(alias).info({"name": model.name, "version": model.version, "provider": model.provider})
        if alias == PROD_ALIAS:
            self._ready.set()
        if previous is None:
            log.info("%s: serving %s v%s on %s", alias, model.name, model.version, model.provider)
        return previous

    async def remove(self, alias: str) -> None:
        """Stop serving under ``alias`` (e.g. the canary ended); its requests in flight finish first."""
        lane = self._lanes.pop(alias, None)
        if lane is not None:
            self.metrics.model_removed(alias)
            log.info("%s: stopped serving %s v%s", alias, lane.model.name, lane.model.version)
            await lane.retire()

    async def close(self) -> None:
        """Stop serving: requests in flight finish first, then every model's batching and fetching stop."""
        for alias in list(self._lanes):
            await self._lanes.pop(alias).retire()
        await self.reader.aclose()
        if self.cache is not None:
            await self.cache.close()

    def _route(self, request: ScoreRequest) -> ModelLane:
        """The lane that scores ``request``; UnknownModel when it names a model not served here."""
        prod = self._lanes.get(PROD_ALIAS)
        if prod is None:
            raise ModelNotReady("no model is loaded yet; retry when /v1/models/ready says so")
        if request.model_name is not None and request.model_name != prod.model.name:
            raise UnknownModel(request.model_name, prod.model.name)
        canary = self._lanes.get(CANARY_ALIAS)
        if canary is not None and routes_to_canary(request.request_id, self.canary_share):
            return canary
        return prod

    @staticmethod
    def _request_inputs(model: ServedModel, request: ScoreRequest) -> dict[str, float | int | str]:
        """The model's request-time inputs by input name; InvalidRequest naming a field that is missing, or not what
        the model takes there: a number (within a 32-bit float) or a text (checked before any feature is read or
        model run)."""
        values = {}
        for spec in model.inputs:
            if not spec.from_request:
                continue
            field = f"request_fields.{spec.request_field}"
            value = request.request_fields.get(spec.request_field)
            if value is None:
                raise InvalidRequest(field, f"required by model {model.name} v{model.version}")
            if spec.kind == "text":
                if not isinstance(value, str):
                    raise InvalidRequest(
                        field, f"must be a text for model {model.name}, got {type(value).__name__} {value!r:.40}"
                    )
            elif isinstance(value, (bool, str)):
                raise InvalidRequest(field, f"must be a number for model {model.name}, got {type(value).__name__} {value!r:.40}")
            elif abs(value) > _FLOAT32_MAX:
                raise InvalidRequest(field, f"{value:.4g} is beyond the model's 32-bit float range")
            values[spec.name] = value
        return values

    @staticmethod
    def _vector(model: ServedModel, request_inputs: dict, features: dict) -> tuple[list[float | str], dict]:
        """The model's input row (numbers as floats, texts as strings), and the values used by input name (a missing
        number is NaN, a missing text the empty string)."""
        used, row = {}, []
        for spec in model.inputs:
            value = request_inputs[spec.name] if spec.name in request_inputs else features.get(spec.name)
            used[spec.name] = value
            if spec.kind == "text":
                row.append("" if value is None else str(value))
            else:
                row.append(math.nan if value is None or isinstance(value, str) else float(value))
        return row, used

    async def _infer(self, lane: ModelLane, row: list[float | str]) -> tuple[float, BatchTiming | None]:
        """The score for one input row, and its wait and its batch's run (None: from the result cache)."""
        key = None
        if self.cache is not None:
            key = self.cache.key(lane.model.name, lane.model.version, row)
            cached = await self.cache.get(key)
            self.metrics.cache_requests.labels("miss" if cached is None else "hit").inc()
            if cached is not None:
                return cached, None
        score, timing = await lane.infer(row)
        if key is not None:
            await self.cache.put(key, score)
        return score, timing

    async def score(self, request: ScoreRequest, trace: RequestTrace | None = None, *, paced: bool = False) -> PredictionRecord:
        """Score one request on the model its route names; its stages are recorded on ``trace`` when given.

        Admission: with ``max_in_flight`` requests being scored, another is refused at once (Overloaded). A
        ``paced`` caller (the Kafka door, whose requests wait in the log and which submits a chunk of at most
        ``max_in_flight`` at a time) is outside that bound: its chunks would otherwise take every permit and turn the
        HTTP and gRPC doors' requests away. A scorer that refused a request within the last
        :data:`_OVERLOAD_MEMORY_S` is overloaded, and a read of an admitted request that runs over budget is a symptom
        of that: the request is refused too rather than answered on defaults. Defaults stay for what they are for: a
        missing value, Redis unavailable, or a read over budget on a scorer that is not refusing work (and every
        read of a paced caller: were its reads refused, a Redis slower than the budget would stall the door).

        Raises a ScoringError (``online/errors.py``): ModelNotReady before a model is loaded,
        Overloaded at the admission bound or when a batcher's queue is full, InvalidRequest or UnknownModel for a
        request the model cannot score, ScoringFailed when the model gives no finite score.
        """
        if paced:
            return await self._score(request, trace, refuse_over_budget=False)
        if self._room.locked():
            self._full_at = time.monotonic()
            raise Overloaded(f"{self.max_in_flight} requests are being scored (serving.max_in_flight); retry later")
        async with self._room:
            return await self._score(request, trace, refuse_over_budget=True)

    async def _score(self, request: ScoreRequest, trace: RequestTrace | None, *, refuse_over_budget: bool) -> PredictionRecord:
        began = time.perf_counter()
        lane = self._route(request)
        request_inputs = self._request_inputs(lane.model, request)
        counted = self.metrics.version(lane.alias, lane.model.version)
        lane.enter()
        try:
            fetched = await lane.fetcher.fetch(request.entity_keys, request.requested_at_ms)
            if refuse_over_budget and fetched.fallback == "over_budget" and time.monotonic() - self._full_at < _OVERLOAD_MEMORY_S:
                raise Overloaded("the features' read ran over budget while the scorer is at serving.max_in_flight; retry later")
            fetched_at = time.perf_counter()
            row, used = self._vector(lane.model, request_inputs, fetched.values)
            submitted_at = time.perf_counter()
            score, timing = await self._infer(lane, row)
        except ScoringError as err:
            if not err.retriable:
                counted.error.inc()
            raise
        except Exception:
            counted.error.inc()
            raise
        finally:
            lane.leave()
        if not math.isfinite(score):
            counted.error.inc()
            raise ScoringFailed(f"model {lane.model.name} v{lane.model.version} gave score {score} for inputs {used}")
        scored_at = time.perf_counter()
        total = scored_at - began
        counted.ok.inc()
        counted.latency.observe(total)
        queue_wait_s, inference_s = (0.0, 0.0) if timing is None else (timing.queue_wait_s, timing.run_s)
        stages = {"feature_fetch": fetched_at - began, "queue_wait": queue_wait_s, "inference": inference_s, "total": total}
        for stage, seconds in stages.items():
            self.metrics.stages[stage].observe(seconds)
        self.metrics.features.inc(len(lane.fetcher.features))
        self.metrics.defaulted_features.inc(len(fetched.defaulted))
        if fetched.stale:
            self.metrics.stale_features.inc(len(fetched.stale))
        if fetched.fallback is not None:
            self.metrics.feature_fallbacks.labels(fetched.fallback).inc()
        if trace is not None:
            self._trace_stages(trace, lane, fetched, began, fetched_at, submitted_at, scored_at, timing)
        return PredictionRecord(
            schema_version=PredictionRecord.SCHEMA_VERSION,
            request_id=request.request_id,
            entity_keys=request.entity_keys,
            features=used,
            defaulted_features=fetched.defaulted,
            defaulted_reasons=fetched.reasons,
            model_name=lane.model.name,
            model_version=lane.model.version,
            score=score,
            stage_latency_ms={stage: round(seconds * 1000, 3) for stage, seconds in stages.items()},
            requested_at_ms=request.requested_at_ms,
            scored_at_ms=int(time.time() * 1000),
            event_id=request.event_id,
            feature_row_times_ms=fetched.row_times_ms,
            feature_row_absorbed=fetched.row_absorbed,
            stale_features=fetched.stale,
            feature_read_as_of_ms=fetched.read_as_of_ms,
            trace_id=None if trace is None else trace.trace_id_hex,
        )

    @staticmethod
    def _trace_stages(
        trace: RequestTrace,
        lane: ModelLane,
        fetched: FetchedFeatures,
        began: float,
        fetched_at: float,
        submitted_at: float,
        scored_at: float,
        timing: BatchTiming | None,
    ) -> None:
        """The scorer's stages of one request, on its trace: the batches' own timings place them exactly."""
        trace.stage(
            "feature_fetch",
            began,
            fetched_at,
            features=len(lane.fetcher.features),
            defaulted=len(fetched.defaulted),
            **({"fallback": fetched.fallback} if fetched.fallback else {}),
        )
        if fetched.read is not None:
            read_at = began + fetched.read.queue_wait_s
            trace.stage(
                "redis round trip",
                read_at,
                read_at + fetched.read.run_s,
                part_of="feature_fetch",
                kind="CLIENT",
                **{"db.system": "redis", "loopline.entities_in_read": fetched.read.batch_size},
            )
        model = {"loopline.model": lane.model.name, "loopline.model_version": lane.model.version, "loopline.alias": lane.alias}
        if timing is None:
            trace.stage("inference", submitted_at, scored_at, **model, **{"loopline.result_cache": "hit"})
            return
        run_at = submitted_at + timing.queue_wait_s
        trace.stage("queue_wait", submitted_at, run_at)
        trace.stage("inference", run_at, run_at + timing.run_s, **model, **{"loopline.batch_size": timing.batch_size})
