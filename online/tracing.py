"""Request traces (OpenTelemetry, exported over OTLP/HTTP, e.g. to the local stack's Jaeger): one trace per request.

A request's spans are its stages, under one span for the request as its door served it: ``receive`` (its body
read and decoded), ``feature_fetch`` (with the ``redis round trip`` it shared with the reads batched with it),
``queue_wait`` (in the model's dynamic batcher), ``inference`` (with the size of the batch it rode in),
``log_prediction`` (until the broker has its record: acknowledged, or its transaction committed) and ``respond``.
A caller's W3C ``traceparent`` (an HTTP header, gRPC metadata, a Kafka record header) makes the request a part of
the caller's trace. The prediction record carries the trace id (``trace_id``), and its Kafka record a
``traceparent`` naming the request's span, so whoever reads it can continue the trace.

Which traces are exported: every one the caller sampled (its ``traceparent``'s flag); without a caller, a share
``sample_ratio`` chosen by trace id, as OpenTelemetry's ``TraceIdRatioBased`` chooses (every service keeping the
same share keeps the same traces); and whatever the caller said, every request that failed and every request
slower than ``slow_ms``, up to ``max_tail_per_s`` of those a second (an overloaded scorer's every request is slow,
or refused: building and exporting each one's spans would spend the CPU it lacks). Those last two are known only once
the request is answered, so a request collects its stages as clock readings on its way, and its spans are built then:
a request not exported costs a random id and a few clock readings, never a span.
"""

from __future__ import annotations

import random
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

#: version-traceid-parentid-flags (W3C Trace Context). A later version may append fields after these.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_SAMPLED = 0x01
#: Span kinds by name (opentelemetry.trace.SpanKind's member names).
Kind = str


@dataclass(frozen=True, slots=True)
class Parent:
    """The caller's span, from its ``traceparent``."""

    trace_id: int
    span_id: int
    sampled: bool


def parse_traceparent(value: str | bytes | None) -> Parent | None:
    """The caller's span named by a W3C ``traceparent`` value; None when there is none or it is malformed (the
    request then starts a trace of its own, as the recommendation says a receiver must)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    found = _TRACEPARENT.fullmatch(value.strip())
    if found is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = found.groups()
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    # Version ff is forbidden; version 00 has no further fields; an all-zero id names nothing.
    if version == "ff" or (version == "00" and rest) or not trace_id or not span_id:
        return None
    return Parent(trace_id, span_id, bool(int(flags_hex, 16) & _SAMPLED))


def log_suffix(trace: RequestTrace | None) -> str:
    """The end of a request's log line: `` trace <id>`` when the request is traced, else nothing."""
    return "" if trace is None else f" trace {trace.trace_id_hex}"


def _new_id(bits: int) -> int:
    return random.getrandbits(bits) or 1


class RequestTrace:
    """One request's trace as it is served: its ids, and its stages as ``time.perf_counter`` readings."""

    __slots__ = ("trace_id", "span_id", "parent", "began", "sampled", "stages")

    def __init__(self, parent: Parent | None, began: float, sampled: bool) -> None:
        self.trace_id = parent.trace_id if parent is not None else _new_id(128)
        #: The request's own span: the parent of its stages, and what its prediction record's traceparent names.
        self.span_id = _new_id(64)
        self.parent, self.began, self.sampled = parent, began, sampled
        #: (name, start, end, the stage it is part of or None, kind, attributes)
        self.stages: list[tuple[str, float, float, str | None, Kind, dict[str, Any]]] = []

    @property
    def trace_id_hex(self) -> str:
        """The trace id as W3C and Jaeger write it (32 lower-case hex digits)."""
        return f"{self.trace_id:032x}"

    def stage(
        self, name: str, start: float, end: float, *, part_of: str | None = None, kind: Kind = "INTERNAL", **attributes: Any
    ) -> None:
        """Record a stage that ran from ``start`` to ``end`` (perf_counter seconds), a part of stage ``part_of``
        (else of the request)."""
        self.stages.append((name, start, end, part_of, kind, attributes))

    def traceparent(self) -> str:
        """A ``traceparent`` naming this request's span, for the records it leads to."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"


class RequestTracer:
    """Starts a ``RequestTrace`` per request and exports the ones kept (see the module's doc) to ``endpoint``.

    ``endpoint``: an OTLP/HTTP traces URL (``http://host:4318/v1/traces``). ``service`` names the scorer in the
    traces; ``attributes`` are added to its resource (e.g. the worker)."""

    def __init__(
        self,
        endpoint: str,
        *,
        service: str,
        sample_ratio: float,
        slow_ms: float,
        max_tail_per_s: float = 20.0,
        attributes: dict[str, str] | None = None,
    ) -> None:
        # The SDK is imported only when tracing is on.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        if not 0.0 <= sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio must be within [0, 1], got {sample_ratio}")
        self.endpoint = endpoint
        self.slow_s = slow_ms / 1000
        # A token bucket for the traces kept for failing or being slow (not sampled): a second's worth at most, and
        # room for one whole trace however low the rate (below one a second, a bucket of a second's worth never fills).
        self._tail_per_s = max_tail_per_s
        self._tail_capacity = max(1.0, max_tail_per_s) if max_tail_per_s > 0 else 0.0
        self._tail_tokens, self._tail_at = self._tail_capacity, time.monotonic()
        self._tail_lock = threading.Lock()
        #: A trace whose id's lower 64 bits are below this is in the sampled share (TraceIdRatioBased's rule).
        self._ratio_bound = round(sample_ratio * 2**64)
        self._resource = Resource.create({"service.name": service, **(attributes or {})})
        self._scope = InstrumentationScope("loopline.online")
        # Exported each second (not the SDK's 5 s) so a slow request is findable while its user still looks; a
        # backend that does not answer delays the exports, never a request, and at shutdown at most ~2 s.
        self._processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, timeout=2), max_queue_size=8192, schedule_delay_millis=1000
        )

    def _tail_token(self) -> bool:
        """Whether another failed or slow request may be traced now (``max_tail_per_s``)."""
        with self._tail_lock:
            now = time.monotonic()
            self._tail_tokens = min(self._tail_capacity, self._tail_tokens + (now - self._tail_at) * self._tail_per_s)
            self._tail_at = now
            if self._tail_tokens < 1.0:
                return False
            self._tail_tokens -= 1.0
            return True

    def begin(self, traceparent: str | bytes | None, began: float) -> RequestTrace:
        """The trace of a request that arrived at ``began`` (perf_counter), with its caller's ``traceparent``."""
        parent = parse_traceparent(traceparent)
        if parent is not None:
            return RequestTrace(parent, began, parent.sampled)
        trace = RequestTrace(None, began, False)
        trace.sampled = (trace.trace_id & 0xFFFF_FFFF_FFFF_FFFF) < self._ratio_bound
        return trace

    def finish(
        self, trace: RequestTrace, name: str, kind: Kind, ended: float, error: str | None = None, **attributes: Any
    ) -> bool:
        """The request is answered at ``ended``: export its spans if it is kept (``error`` says why it failed).
        Whether it was. Thread-safe."""
        if not (trace.sampled or ((error is not None or ended - trace.began > self.slow_s) and self._tail_token())):
            return False
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        flags = TraceFlags(TraceFlags.SAMPLED)
        to_ns = time.time_ns() - time.perf_counter_ns()  # perf_counter readings → Unix time

        def context(span_id: int, remote: bool = False) -> SpanContext:
            return SpanContext(trace.trace_id, span_id, is_remote=remote, trace_flags=flags)

        def ns(reading: float) -> int:
            return to_ns + int(reading * 1e9)

        own = context(trace.span_id)
        parent = None if trace.parent is None else context(trace.parent.span_id, remote=True)
        status = Status(StatusCode.ERROR, error) if error is not None else Status(StatusCode.UNSET)
        if error is not None:
            attributes["error.type"] = error
        spans = [
            ReadableSpan(
                name,
                own,
                parent,
                self._resource,
                attributes,
                kind=SpanKind[kind],
                status=status,
                start_time=ns(trace.began),
                end_time=ns(ended),
                instrumentation_scope=self._scope,
            )
        ]
        stage_ids: dict[str, SpanContext] = {}
        for stage, start, end, part_of, stage_kind, stage_attributes in trace.stages:
            stage_context = context(_new_id(64))
            stage_ids[stage] = stage_context
            spans.append(
                ReadableSpan(
                    stage,
                    stage_context,
                    stage_ids.get(part_of, own),
                    self._resource,
                    stage_attributes,
                    kind=SpanKind[stage_kind],
                    start_time=ns(start),
                    end_time=ns(end),
                    instrumentation_scope=self._scope,
                )
            )
        for span in spans:
            self._processor.on_end(span)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Export what is queued (waiting at most ``timeout_s``), then stop."""
        self._processor.force_flush(int(timeout_s * 1000))
        self._processor.shutdown()
