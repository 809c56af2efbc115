"""Online inference: open-loop load against the scorer on a private stack (127.0.0.1 only).

How latency is measured: request i of a round is due ``i / rate`` s after the round starts and is
sent then whatever the earlier ones are doing (open loop). Its latency runs from that scheduled
time to its answer, so time it spent waiting for an event loop (the scorer's, or the load
generator's own) or behind a stalled producer counts: a stall delays every request due meanwhile,
not only the one it hit (no coordinated omission). Every user's feature row is written to Redis
first, so a request answered on the declared defaults is one whose feature read fell back (over
the feature budget, or Redis unavailable); each rate reports that share. A rate counts as *held*
when at least 99 % of its requests were answered, fewer than 1 % on defaults, their p99 is
within 50 ms, and the answers came at 97 % of the rate at least.

1. The scorer core in process (feature fetch from Redis through the fast read path, dynamic
   batcher, ONNX Runtime), open loop, in two modes that differ only in the model batch: dynamic
   batching (max batch 64, max queue delay 2 ms) and batch-1. Feature reads are batched alike in
   both (up to 64 entities per Redis round trip). Each mode's highest held rate is searched for: the
   rate doubled from 250/s until one is not held, then the interval between the two bisected four
   times. Per round: achieved throughput, p50/p99 from the scheduled time, the share answered, the
   share on defaults, p50/p99 of each stage inside the scorer and the mean model batch. The ratios:
   each mode's throughput at its highest held rate, and each mode's peak at any latency. The anchor:
   Triton's published dynamic-batching gain, ~3.7x at equal latency; the goal here is >= 4x at
   p99 <= 50 ms.
2. The front doors of `loopline serve --http --kafka --workers N` in processes of their own (``--workers``:
   default one per core, as `loopline serve`; each worker one Kafka consumer-group member):
   * HTTP: open-loop load from this process (aiohttp, keep-alive); p50/p99 as the client sees
     them. Once per prediction-log mode (``serving.prediction_log``), each in a fresh scorer
     process: ``ack`` (the default: the response waits for the broker's acknowledgement of the
     prediction record) and ``async``; the p99 ratio of the two at the highest rate both held (if
     none was, at the lowest rate, flagged as such).
   * Kafka: requests produced at each rate (with the ``ack`` process); latency from a request's
     scheduled send time, which it carries as ``requested_at_ms``, to its prediction being readable
     by a read_committed consumer (predictions and offsets are committed together in transactions, each
     ``serving.kafka_commit_interval_ms`` after its first scored chunk); ``<door>_<rate>_scored_*`` is the part up to
     its scoring (``scored_at_ms``), the rest is the way out. The same rounds once more in a scorer of its own whose
     transactions close after SHORT_COMMIT_INTERVAL_MS (about one chunk each): the p99 and CPU ratios of the default
     interval over it at the highest rate both held. The requests go through one producer for all rounds, connected by the
     warm-up round (a fresh one holds its first half second of records while it gets its id).
   * Tracing's price, in the default mode's scorer: rounds at the CPU goal's rate whose every request
     carries a caller's ``traceparent`` marked sampled, alternating with rounds marked not sampled (the
     same header, so only the tracing differs; three rounds a side, one in ``--quick``); the difference
     of the two sides' median CPU per request is a traced request's price, and that times
     ``serving.tracing.sample_ratio`` what tracing costs a request on the defaults (failed or slow
     requests are traced alike in both sides).
   Per rate also the scorer's CPU time per request, its supervisor's and every worker's together
   (independent of how busy the shared machine is). Goals (issue 19): HTTP p99 <= 20 ms at 2,000
   requests/s with < 1 % on defaults, held; <= 0.3 ms of scorer CPU per HTTP request at 1,000/s;
   the Kafka door p99 <= 200 ms at 1,000/s exactly once, <= 50 ms at least once
   (``serving.kafka_delivery``, measured in a scorer process of its own).

3. ``--profile``, instead of the above: where the scorer's CPU goes. The default scorer (HTTP, ``--workers``
   processes) under HTTP load at PROFILE_RATE, lower than the CPU goal's rate (with py-spy beside it, a scorer at
   1,000/s was overloaded here, and an overloaded scorer's profile is of its overload: fallbacks, and a trace for
   every slow request; at 250/s a batch holds about one request, so per-batch costs weigh more than at 1,000/s),
   while py-spy samples every worker's Python stacks
   (on CPU only; a native call counts to the Python frame that made it). Printed: the share of samples by the
   innermost frame's package or module (its *self* time), and by each of Loopline's own files on the stack (its
   *inclusive* time). py-spy's own sampling shares the cores, so the profile's run measures no latency.

``--quick`` (within a minute): 1 s rounds, the core's search from 2,000/s without bisections, HTTP at 1,000 and
2,000/s, one tracing round a side, and none of the scorers that are there only to be compared (the ``async``
prediction log, the 5 ms commit interval), so their ratios are not printed.

Every ratio and every goal's met / not met is computed here from this run's figures. The model is
a seeded multi-layer perceptron (11 features + the amount -> 512 -> 512 -> 256 -> 1) written as
ONNX. Machine: the 2-core box this runs on. The last line printed is one JSON object.

    python benchmarks/inference.py [--quick] [--only core|http|kafka ...] [--workers N] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import itertools
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from confluent_kafka import Consumer, TopicPartition
from prometheus_client import Metric
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from feature_store.config import feature_fields, feature_store  # noqa: E402
from feature_store.online_write import FeatureRow, OnlineWriter  # noqa: E402
from harness import percentile, private_stack, report  # noqa: E402  (this folder)
from infra.service import free_port  # noqa: E402
from loopline.components import project  # noqa: E402
from loopline.job_processes import start_scorer  # noqa: E402
from loopline.serving import build_scorer  # noqa: E402
from loopline.settings import Settings  # noqa: E402
from offline_training.onnx_models import write_mlp_model  # noqa: E402
from online.errors import Overloaded  # noqa: E402
from online.scorer import Scorer  # noqa: E402
from online.tracing import RequestTrace  # noqa: E402
from schemas.kafka_config import consumer_settings  # noqa: E402
from schemas.records import PredictionRecord, ScoreRequest  # noqa: E402
from schemas.topics import PREDICTIONS, SCORE_REQUESTS  # noqa: E402
from schemas.validation import decode, encode  # noqa: E402
from streams.producer import EventProducer  # noqa: E402
from streams.world import Emitted  # noqa: E402

#: The fraud project's view of a user's transactions, its join key, and the request field its model takes beside them
#: (``main`` checks them against the project).
VIEW, ENTITY_KEY, REQUEST_FIELD = "user_transaction_features", "user_id", "amount"
USERS = 1000
TRITON_GAIN = 3.7
#: Dynamic batching's gain over batch-1 at p99 <= HELD_P99_MS that the core aims for.
GOAL_GAIN = 4.0
#: The HTTP door's goal: p99 within HTTP_GOAL_P99_MS at HTTP_GOAL_RATE requests/s, held (the Kafka door's are KAFKA_GOAL_*).
HTTP_GOAL_P99_MS, HTTP_GOAL_RATE = 20.0, 2000.0
HTTP_GOAL = f"goal_http_p99_{HTTP_GOAL_P99_MS:.0f}ms_at_{HTTP_GOAL_RATE:.0f}_met"
#: The scorer's CPU per HTTP request at CPU_GOAL_RATE requests/s: at most CPU_GOAL_MS.
CPU_GOAL_MS, CPU_GOAL_RATE = 0.3, 1000.0
#: The Kafka door's goals at KAFKA_GOAL_RATE requests/s, p99 from the scheduled send to a readable prediction.
KAFKA_GOAL_RATE, KAFKA_GOAL_P99_MS = 1000.0, {"exactly_once": 200.0, "at_least_once": 50.0}
#: The HTTP load under which --profile samples the scorer, and for how long (a full run's; --quick: its seconds).
PROFILE_RATE, PROFILE_SECONDS = 250.0, 20.0
#: The exactly-once door's commit interval compared with the default's, at the same rates, and its figures' prefix.
SHORT_COMMIT_INTERVAL_MS = 5.0
SHORT_COMMIT = f"kafka_commit_{SHORT_COMMIT_INTERVAL_MS:g}ms"
#: A rate is held when at least this share is answered, under this share on defaults, and p99 is within bound, with
#: the answers coming at this share of the rate at least (a load generator or scorer that fell behind held nothing).
HELD_ANSWERED, HELD_FALLBACKS, HELD_P99_MS, HELD_THROUGHPUT = 0.99, 0.01, 50.0, 0.97
#: The core's rate search stops doubling here (a scorer holding it would be held as holding this much).
MAX_CORE_RATE = 64_000.0
#: Entities per Redis round trip in both batching modes (the dynamic mode's batch), so only the model batch differs.
FEATURE_BATCH = 64
#: Serving settings per batching mode (the same model either way). The admission bound is as wide as the queues in
#: both, so the core's highest held rate is the batching's, not the default bound's (the doors run on defaults).
MODES = {
    "dynamic": {"max_batch_size": FEATURE_BATCH, "max_queue_delay_ms": 2.0, "max_queue_size": 4096, "max_in_flight": 4096},
    "batch1": {"max_batch_size": 1, "max_queue_delay_ms": 0.0, "max_queue_size": 4096, "max_in_flight": 4096},
}
#: The prediction-log modes measured over HTTP; the first is the default, reported as plain ``http_<rate>``.
LOG_MODES = ("ack", "async")
#: Unmeasured load before a door's rounds: connections opened, the Kafka door's group joined.
WARM_UP_S = 0.5
#: The scorer's count of requests answered on defaults (by reason: over budget, Redis unavailable, ...).
FALLBACKS_METRIC = "loopline_scoring_feature_fallbacks_total"
console = Console()
Result = TypeVar("Result")


def _request(i: int, request_id: str | None = None, requested_at_ms: int | None = None) -> ScoreRequest:
    """Request ``i`` (user ``bench-<i mod USERS>``); a random id and the time now unless given."""
    return ScoreRequest(
        schema_version=1,
        request_id=request_id or str(uuid.uuid4()),
        entity_keys={ENTITY_KEY: f"bench-{i % USERS}"},
        request_fields={REQUEST_FIELD: float(i % 500)},
        requested_at_ms=int(time.time() * 1000) if requested_at_ms is None else requested_at_ms,
    )


async def _open_loop(
    call: Callable[[int], Awaitable[Result]], rate: float, seconds: float
) -> tuple[list[tuple[float, Result]], float]:
    """Start ``call(i)`` at its scheduled time, ``i / rate`` s after the start, regardless of completions.

    Returns (ms from each request's scheduled time until it finished, its result) per request, and the
    seconds until the last finished. Latency counts from the schedule, not from when ``call`` began:
    a request that waited for the event loop (a batch of due requests, a collector pause) waited.
    """
    began, total = time.perf_counter(), int(rate * seconds)
    tasks: list[asyncio.Future[tuple[float, Result]]] = []

    async def timed(i: int) -> tuple[float, Result]:
        result = await call(i)
        return (time.perf_counter() - began - i / rate) * 1000, result

    while len(tasks) < total:
        due = min(total, int((time.perf_counter() - began) * rate) + 1)
        tasks += [asyncio.ensure_future(timed(i)) for i in range(len(tasks), due)]
        await asyncio.sleep(max(0.0, began + len(tasks) / rate - time.perf_counter()))
    results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - began


def _rate_figures(prefix: str, offered: int, latencies: list[float], on_defaults: float, elapsed: float) -> dict:
    """One rate's figures: throughput, the share of ``offered`` answered, p50/p99 of the answered
    ``latencies`` (ms from the scheduled send), and the share of them answered ``on_defaults``."""
    answered = len(latencies)
    return {
        f"{prefix}_throughput_per_s": round(answered / elapsed, 1),
        f"{prefix}_answered_rate": round(answered / offered, 4),
        f"{prefix}_p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        f"{prefix}_p99_ms": round(percentile(latencies, 0.99), 2) if latencies else None,
        f"{prefix}_fallback_rate": round(on_defaults / answered, 4) if answered else None,
    }


def _held(figures: dict, prefix: str, p99_ms: float = HELD_P99_MS) -> bool:
    """Whether the rate of ``prefix`` (``<...>_<rate>``) was held: that rate achieved, enough answered, few enough on
    defaults, p99 within ``p99_ms``."""
    p99, fallbacks = figures.get(f"{prefix}_p99_ms"), figures.get(f"{prefix}_fallback_rate")
    if p99 is None or fallbacks is None:  # not measured, or nothing answered
        return False
    rate = float(prefix.rsplit("_", 1)[1])
    return (
        figures[f"{prefix}_throughput_per_s"] >= HELD_THROUGHPUT * rate
        and figures[f"{prefix}_answered_rate"] >= HELD_ANSWERED
        and fallbacks < HELD_FALLBACKS
        and p99 <= p99_ms
    )


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator`` to two places; None when either is missing or the denominator is zero."""
    return round(numerator / denominator, 2) if numerator is not None and denominator else None


def _fallbacks(families: Iterable[Metric]) -> float:
    """Requests a scorer answered on defaults so far, for any reason, from its metric ``families``."""
    return sum(s.value for family in families for s in family.samples if s.name == FALLBACKS_METRIC)


STAGES = ("feature_fetch", "queue_wait", "inference", "total")


def _stage_figures(prefix: str, latencies: list[tuple[float, ...]], mean_batch: float) -> dict:
    """p50/p99 per stage inside the scorer (one tuple per request, in STAGES order), and the mean model batch."""
    figures = {}
    for index, stage in enumerate(STAGES):
        values = [latency[index] for latency in latencies]
        figures[f"{prefix}_{stage}_p50_ms"] = round(statistics.median(values), 3)
        figures[f"{prefix}_{stage}_p99_ms"] = round(percentile(values, 0.99), 3)
    figures[f"{prefix}_mean_batch"] = round(mean_batch, 1)
    return figures


def _batched(scorer: Scorer) -> tuple[float, float]:
    """(requests, batches) the scorer's model calls have taken so far (its batch-size histogram)."""
    sample = scorer.metrics.collector_registry.get_sample_value
    return sample("loopline_scoring_batch_size_sum") or 0.0, sample("loopline_scoring_batch_size_count") or 0.0


def _core_scorer(settings: Settings, model_path: Path, mode: str) -> Scorer:
    """The scorer core with ``mode``'s model batching and, in either mode, feature reads of up to FEATURE_BATCH
    (so batch-1 is not also charged a Redis round trip per request: only the model batch differs)."""
    serving = settings.serving.model_copy(update={**MODES[mode], "feature_batch_size": FEATURE_BATCH})
    return build_scorer(settings.model_copy(update={"serving": serving}), model_path)


async def _core_round(scorer: Scorer, mode: str, rate: float, seconds: float) -> tuple[str, dict]:
    """One open-loop round of the in-process scorer at ``rate``: its figure prefix and figures."""
    # Made beforehand: building requests is the load generator's work, not the scorer's. Frozen, so the garbage
    # collector does not walk them (nor the earlier rounds' leftovers) in the run.
    prepared = [_request(i) for i in range(int(rate * seconds))]
    gc.collect()
    gc.freeze()

    async def one(i: int) -> tuple[tuple[float, ...], bool] | None:
        """The request's stage latencies and whether it was answered on defaults (only: records kept would grow what
        the collector walks); None when refused."""
        try:
            record = await scorer.score(prepared[i])
        except Overloaded:
            return None
        return tuple(record.stage_latency_ms[stage] for stage in STAGES), bool(record.defaulted_features)

    requests_before, batches_before = _batched(scorer)
    with console.status(f"core, {mode}, {rate:.0f} requests/s"):
        results, elapsed = await _open_loop(one, rate, seconds)
    requests_after, batches_after = _batched(scorer)
    answered = [(ms, result) for ms, result in results if result is not None]
    prefix = f"core_{mode}_{rate:.0f}"
    on_defaults = sum(defaulted for _, (_, defaulted) in answered)
    figures = _rate_figures(prefix, len(results), [ms for ms, _ in answered], on_defaults, elapsed)
    if answered:
        mean_batch = (requests_after - requests_before) / max(1.0, batches_after - batches_before)
        figures |= _stage_figures(prefix, [stages for _, (stages, _) in answered], mean_batch)
    return prefix, figures


async def _highest_held(scorer: Scorer, mode: str, first_rate: float, seconds: float, bisections: int, figures: dict):
    """The highest rate ``scorer`` held (:func:`_held`), the lowest it did not (None: none up to MAX_CORE_RATE) and the
    peak throughput of any round: the rate doubled from ``first_rate`` until one is not held, then ``bisections``
    halvings of the interval between the two. Every round's figures go into ``figures``."""
    held, failed, peak = 0.0, None, 0.0

    async def probe(rate: float) -> bool:
        nonlocal peak
        prefix, measured = await _core_round(scorer, mode, rate, seconds)
        figures.update(measured)
        peak = max(peak, measured[f"{prefix}_throughput_per_s"])
        return _held(figures, prefix)

    rate = first_rate
    while failed is None and rate <= MAX_CORE_RATE:
        if await probe(rate):
            held, rate = rate, rate * 2
        else:
            failed = rate
    for _ in range(bisections if failed is not None else 0):
        middle = float(round((held + failed) / 2))
        if middle in (held, failed):
            break
        if await probe(middle):
            held = middle
        else:
            failed = middle
    return held, failed, peak


async def measure_core(settings: Settings, model_path: Path, first_rate: float, seconds: float, bisections: int) -> dict:
    """Each batching mode's highest held rate (p99 <= HELD_P99_MS), in process, found by :func:`_highest_held`; the
    ratios of dynamic over batch-1 (their throughputs at those rates, and each mode's peak throughput)."""
    figures: dict = {}
    for mode in MODES:
        scorer = _core_scorer(settings, model_path, mode)
        held, failed, peak = await _highest_held(scorer, mode, first_rate, seconds, bisections, figures)
        figures[f"core_{mode}_held_rate_per_s"] = held
        figures[f"core_{mode}_throughput_at_p99_50ms_per_s"] = figures.get(f"core_{mode}_{held:.0f}_throughput_per_s", 0.0)
        figures[f"core_{mode}_first_rate_not_held_per_s"] = failed
        figures[f"core_{mode}_peak_throughput_per_s"] = peak
        await scorer.close()
    for figure, suffix in (
        ("dynamic_over_batch1_at_p99_50ms", "throughput_at_p99_50ms_per_s"),
        ("dynamic_over_batch1_peak", "peak_throughput_per_s"),
    ):
        figures[figure] = _ratio(figures[f"core_dynamic_{suffix}"], figures[f"core_batch1_{suffix}"])
    figures["goal_dynamic_over_batch1_met"] = (figures["dynamic_over_batch1_at_p99_50ms"] or 0.0) >= GOAL_GAIN
    return figures


def _serve(settings: Settings, model_path: Path, doors: list[str], workers: int, **env: str) -> tuple[subprocess.Popen, str]:
    """`loopline serve` with ``doors`` and ``workers`` in processes of their own (and HTTP on a free port, for
    readiness); (its supervisor, or its only process; url)."""
    port = free_port()
    server = start_scorer(
        settings,
        ["--http", *doors],
        settings.home / "serve.log",
        LOOPLINE_SERVING__HTTP_PORT=str(port),
        LOOPLINE_SERVING__MODEL_PATH=str(model_path),
        LOOPLINE_SERVING__WORKERS=str(workers),
        **env,
    )
    return server, f"http://127.0.0.1:{port}"


async def _wait_ready(session, url: str, server: subprocess.Popen) -> None:
    import aiohttp

    deadline = time.monotonic() + 60
    while True:
        try:
            async with session.get(f"{url}/v1/models/ready") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError("the scorer did not become ready; see serve.log")
        await asyncio.sleep(0.2)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process and its children (a supervisor's workers) have used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(_cpu_s(int(child)) for child in children)


def _stop(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(20)


async def _served_fallbacks(session, url: str) -> float:
    """Requests the scorer process at ``url`` answered on defaults so far (its Prometheus metrics)."""
    async with session.get(f"{url}/metrics") as response:
        return _fallbacks(text_string_to_metric_families(await response.text()))


async def measure_http(
    session,
    server: subprocess.Popen,
    url: str,
    rates: list[float],
    seconds: float,
    prefix: str,
    sampled_by_caller: bool | None = None,
) -> dict:
    """Open-loop HTTP load from this process against the scorer's process; figures named ``<prefix>_<rate>_...``.
    ``sampled_by_caller``: each request carries a fresh caller's ``traceparent``, sampled or not (None: none), so the
    scorer traces it, or does not, whatever its own sample ratio (unless it fails or is slow)."""
    figures: dict = {}
    score_url = f"{url}/v1/score"
    for rate in rates:
        # Made beforehand: serialising requests is the load generator's work, and it shares the cores.
        total = int(rate * seconds)
        bodies = [_request(i).model_dump_json().encode() for i in range(total)]
        headers = [
            {"content-type": "application/json"}
            | ({} if sampled_by_caller is None else {"traceparent": RequestTrace(None, 0.0, sampled_by_caller).traceparent()})
            for _ in range(total)
        ]

        async def one(i: int, bodies=bodies, headers=headers) -> int:
            async with session.post(score_url, data=bodies[i % len(bodies)], headers=headers[i % len(headers)]) as response:
                await response.read()
                return response.status

        await _open_loop(one, rate, WARM_UP_S)
        # From the scorer's counter rather than each response: parsing every answer would load the load
        # generator. Every user has a feature row, so each request on defaults is one such fallback.
        cpu_before, fallbacks_before = _cpu_s(server.pid), await _served_fallbacks(session, url)
        with console.status(f"HTTP ({prefix}), {rate:.0f} requests/s"):
            results, elapsed = await _open_loop(one, rate, seconds)
        cpu_s, on_defaults = _cpu_s(server.pid) - cpu_before, await _served_fallbacks(session, url) - fallbacks_before
        ok = [ms for ms, status in results if status == 200]
        figures |= _rate_figures(f"{prefix}_{rate:.0f}", len(results), ok, on_defaults, elapsed)
        figures[f"{prefix}_{rate:.0f}_scorer_cpu_ms_per_request"] = round(cpu_s * 1000 / max(1, len(ok)), 3)
    return figures


def _scheduled_requests(rate: float, run_id: str) -> Iterator[Emitted]:
    """Score requests ``<run_id>-<i>``, request i due ``i / rate`` s after the first and stamped with that time.

    The publisher paces on ``emit_at_ms``, the same due time: however late it gets to a request, the
    request's latency still counts from when it was due.
    """
    began_ms = time.time() * 1000
    for i in itertools.count():
        due_ms = int(began_ms + i * 1000 / rate)
        request = _request(i, f"{run_id}-{i}", due_ms)
        yield Emitted(SCORE_REQUESTS.name, request.request_id, encode(request), due_ms, request)


def _prediction_reader(settings: Settings) -> Consumer:
    """A read_committed reader of the predictions topic, ready before a round's first request goes: assigned each
    partition at its end (a group member would still be joining while the first predictions come), and fetching with
    a short wait (librdkafka's 500 ms default showed in the tail), so that the reader adds as little as it can."""
    group_id, kafka = f"bench-reader-{uuid.uuid4().hex[:8]}", settings.kafka
    reader = Consumer(consumer_settings(kafka.bootstrap, kafka.client_config, group_id, {"fetch.wait.max.ms": 10}))
    topic = PREDICTIONS.name
    partitions = reader.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    reader.assign([TopicPartition(topic, p, end) for p, end in ends.items()])
    return reader


def _kafka_round(
    settings: Settings, producer: EventProducer, rate: float, seconds: float
) -> tuple[list[float], list[float], int, int, float]:
    """Send requests at ``rate`` for ``seconds`` through ``producer``; (ms from each request's due time to its prediction
    being readable, ms from its due time to its scoring, how many were answered on defaults, requests sent, seconds taken).

    ``producer`` is one already connected (it sent the warm-up round): a fresh one holds its first records until it has
    its producer id, half a second here, which the requests' latencies would count as the scorer's.
    """
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    received: dict[str, tuple[float, float, bool]] = {}
    reader = _prediction_reader(settings)
    sent: list[int] = []
    sending = threading.Thread(
        target=lambda: sent.append(producer.publish(_scheduled_requests(rate, run_id), rate_per_s=rate, duration_s=seconds).total)
    )
    began = time.monotonic()
    sending.start()
    try:
        while sending.is_alive() or (len(received) < sent[0] and time.monotonic() - began < seconds + 30):
            first = reader.poll(0.05)  # then what else has arrived: no wait for a full batch
            for message in [first, *reader.consume(1999, 0)] if first is not None else []:
                if message.error() is None and message.key().decode().startswith(run_id):
                    record = decode(PredictionRecord, message.value())
                    latency_ms = time.time() * 1000 - record.requested_at_ms
                    scored_ms = record.scored_at_ms - record.requested_at_ms
                    received[record.request_id] = latency_ms, scored_ms, bool(record.defaulted_features)
    finally:
        reader.close()
        sending.join()
    on_defaults = sum(defaulted for *_, defaulted in received.values())
    latencies, scored = ([row[n] for row in received.values()] for n in (0, 1))
    return latencies, scored, on_defaults, sent[0], time.monotonic() - began


async def measure_kafka(
    settings: Settings, server: subprocess.Popen, rates: list[float], seconds: float, door: str = "kafka"
) -> dict:
    """Score requests produced at each rate; latency from a request's due time to its prediction being
    readable (read_committed); figures named ``<door>_<rate>_...``."""
    figures: dict = {}
    producer = EventProducer(settings.kafka.bootstrap, client_config=settings.kafka.client_config)
    await asyncio.to_thread(_kafka_round, settings, producer, rates[0], WARM_UP_S)
    for rate in rates:
        cpu_before = _cpu_s(server.pid)
        with console.status(f"{door}, {rate:.0f} requests/s"):
            latencies, scored, on_defaults, sent, elapsed = await asyncio.to_thread(
                _kafka_round, settings, producer, rate, seconds
            )
        prefix = f"{door}_{rate:.0f}"
        figures |= _rate_figures(prefix, sent, latencies, on_defaults, elapsed)
        if scored:  # where the time went: before the scorer had scored it (the request's way in), or after (the way out)
            figures[f"{prefix}_scored_p50_ms"] = round(statistics.median(scored), 2)
            figures[f"{prefix}_scored_p99_ms"] = round(percentile(scored, 0.99), 2)
        cpu_s = _cpu_s(server.pid) - cpu_before
        figures[f"{prefix}_scorer_cpu_ms_per_request"] = round(cpu_s * 1000 / max(1, len(latencies)), 3)
    return figures


def _http_prefix(log_mode: str) -> str:
    """The figures' prefix for HTTP with prediction-log mode ``log_mode`` (the default's is plain ``http``)."""
    return "http" if log_mode == LOG_MODES[0] else f"http_{log_mode}"


def _held_by_all(figures: dict, rates: list[float], prefixes: Iterable[str], p99_ms: float = HELD_P99_MS) -> list[float]:
    """The ``rates`` every one of ``prefixes`` (figure prefixes before ``_<rate>``) held (:func:`_held`)."""
    prefixes = list(prefixes)
    return [rate for rate in rates if all(_held(figures, f"{prefix}_{rate:.0f}", p99_ms) for prefix in prefixes)]


def _prediction_log_cost(figures: dict, rates: list[float]) -> dict:
    """What waiting for the broker costs: the p99 ratio of the ``ack`` over the ``async`` prediction log at the
    highest rate both modes held, else (said so) at the lowest rate measured."""
    both = _held_by_all(figures, rates, (_http_prefix(mode) for mode in LOG_MODES))
    rate = max(both) if both else min(rates)
    ack, unacked = (figures[f"{_http_prefix(mode)}_{rate:.0f}_p99_ms"] for mode in LOG_MODES)
    return {
        "prediction_log_ack_over_async_p99": _ratio(ack, unacked),
        "prediction_log_compared_at_per_s": rate,
        "prediction_log_compared_both_held": bool(both),
    }


async def measure_tracing(session, server: subprocess.Popen, url: str, seconds: float, rounds: int) -> dict:
    """What tracing a request costs, in one scorer process: HTTP rounds at CPU_GOAL_RATE whose every request its caller
    sampled, alternating ``rounds`` times with rounds whose every request its caller did not (so both carry the same
    header, and only the tracing differs); the difference of the two arms' median CPU per request. Whether every round
    was held is said beside it (an overloaded round's CPU per request is its overload's)."""
    arms: dict[bool, list[float]] = {True: [], False: []}
    held = True
    for _, sampled in itertools.product(range(rounds), (False, True)):
        prefix = f"tracing_{'sampled' if sampled else 'unsampled'}"
        measured = await measure_http(session, server, url, [CPU_GOAL_RATE], seconds, prefix, sampled_by_caller=sampled)
        arms[sampled].append(measured[f"{prefix}_{CPU_GOAL_RATE:.0f}_scorer_cpu_ms_per_request"])
        held = held and _held(measured, f"{prefix}_{CPU_GOAL_RATE:.0f}")
    sampled_ms, unsampled_ms = (statistics.median(arms[arm]) for arm in (True, False))
    return {
        "tracing_sampled_cpu_ms_per_request": round(sampled_ms, 3),
        "tracing_unsampled_cpu_ms_per_request": round(unsampled_ms, 3),
        "tracing_cpu_ms_per_traced_request": round(sampled_ms - unsampled_ms, 3),
        "tracing_rounds_per_arm": rounds,
        "tracing_rounds_held": held,
    }


async def measure_doors(
    settings: Settings,
    model_path: Path,
    doors: set[str],
    rates: list[float],
    seconds: float,
    workers: int,
    tracing_rounds: int,
    comparisons: bool = True,
) -> dict:
    """A fresh `loopline serve` (``workers`` processes) per prediction-log mode: HTTP at each rate in each; the Kafka
    door exactly once at each rate in the default mode's scorer (its door logs in its own transactions, whatever the
    mode), and at least once in a scorer of its own; tracing's price in the default mode's scorer
    (:func:`measure_tracing`, ``tracing_rounds`` rounds a side). The HTTP scorers serve the same doors, so that only the
    prediction log differs between the HTTP runs. Without ``comparisons`` (``--quick``), the scorers that are there only
    to be compared with the defaults (the ``async`` log, the short commit interval) are not started."""
    import aiohttp

    figures: dict = {}
    served = ["--kafka"] if "kafka" in doors else []
    # One consumer group for all: a later process resumes where the earlier left off, instead of scoring
    # the Kafka rounds' requests again (a fresh group starts from the earliest offset) during its HTTP load.
    group = f"bench-{uuid.uuid4().hex[:8]}"
    # Each scorer process: its settings, the HTTP rounds' figure prefix (None: no HTTP load), the rates of its rounds,
    # and the Kafka door measured in it (None: none).
    runs: list[tuple[dict[str, str], str | None, list[float], str | None]] = [
        (
            {"LOOPLINE_SERVING__PREDICTION_LOG": mode},
            _http_prefix(mode) if "http" in doors else None,
            rates,
            "kafka" if "kafka" in doors and mode == LOG_MODES[0] else None,
        )
        for mode in (LOG_MODES if "http" in doors and comparisons else LOG_MODES[:1])
    ]
    if "kafka" in doors:  # the at-least-once mode, in a process of its own (same group: it resumes where the last left off)
        runs.append(({"LOOPLINE_SERVING__KAFKA_DELIVERY": "at_least_once"}, None, rates, "kafka_at_least_once"))
        # What committing by time costs and saves: exactly once, the same rounds, with a commit interval so short that a
        # transaction holds about one scored chunk (up to 64 requests).
        if comparisons:
            short = {"LOOPLINE_SERVING__KAFKA_COMMIT_INTERVAL_MS": f"{SHORT_COMMIT_INTERVAL_MS:g}"}
            runs.append((short, None, rates, SHORT_COMMIT))
    for env, http_prefix, run_rates, kafka_door in runs:
        server, url = _serve(settings, model_path, served, workers, LOOPLINE_SERVING__KAFKA_GROUP_ID=group, **env)
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
                await _wait_ready(session, url, server)
                if http_prefix is not None:
                    figures |= await measure_http(session, server, url, run_rates, seconds, http_prefix)
                if http_prefix == "http":
                    figures |= await measure_tracing(session, server, url, seconds, tracing_rounds)
            if kafka_door is not None:
                figures |= await measure_kafka(settings, server, run_rates, seconds, kafka_door)
        finally:
            _stop(server)
    figures["workers"] = workers
    if "http" in doors:
        if comparisons:
            figures |= _prediction_log_cost(figures, rates)
        figures[HTTP_GOAL] = _held(figures, f"http_{HTTP_GOAL_RATE:.0f}", HTTP_GOAL_P99_MS)
        cpu = figures.get(f"http_{CPU_GOAL_RATE:.0f}_scorer_cpu_ms_per_request")
        figures["http_cpu_ms_per_request"] = cpu
        # Judged only where the rate was held: a scorer answering on defaults, or behind, spends less per request.
        figures[f"http_{CPU_GOAL_RATE:.0f}_held"] = held = _held(figures, f"http_{CPU_GOAL_RATE:.0f}")
        figures[f"goal_http_cpu_{CPU_GOAL_MS:g}ms_met"] = held and cpu is not None and cpu <= CPU_GOAL_MS
        per_traced = figures["tracing_cpu_ms_per_traced_request"]
        ratio = figures["tracing_sample_ratio"] = settings.serving.tracing.sample_ratio
        if per_traced is not None:
            figures["tracing_cpu_ms_per_request"] = round(per_traced * ratio, 4)
            figures["tracing_cpu_share"] = _ratio(per_traced * ratio, cpu) if cpu else None
    if "kafka" in doors:
        rate = f"{KAFKA_GOAL_RATE:.0f}"
        figures[f"kafka_exactly_once_{rate}_p99_ms"] = figures.get(f"kafka_{rate}_p99_ms")
        figures["kafka_commit_interval_ms"] = settings.serving.kafka_commit_interval_ms
        if comparisons:
            figures |= _commit_interval_cost(figures, rates)
        for mode, goal_ms in KAFKA_GOAL_P99_MS.items():
            # Held like the other goals: enough answered, few on defaults, and the p99.
            measured = f"kafka_{rate}" if mode == "exactly_once" else f"kafka_{mode}_{rate}"
            figures[f"goal_kafka_{mode}_p99_{goal_ms:.0f}ms_met"] = _held(figures, measured, goal_ms)
    return figures


async def profile_scorer(settings: Settings, model_path: Path, seconds: float, workers: int) -> dict:
    """py-spy's samples of the default scorer's workers under HTTP load at PROFILE_RATE: the shares of
    :func:`_profile_shares`, and the round's figures (its CPU per request includes py-spy's reads) beside them."""
    import aiohttp

    raw = settings.home / "scorer-profile.txt"
    server, url = _serve(settings, model_path, [], workers)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
            await _wait_ready(session, url, server)
            await measure_http(session, server, url, [PROFILE_RATE], 1.0, "warm_up")  # connections opened, caches warm
            # Popen starts py-spy and returns at once; the load is measured while it samples.
            spy = subprocess.Popen(  # noqa: ASYNC220
                [
                    str(Path(sys.executable).with_name("py-spy")),
                    "record",
                    "--pid",
                    str(server.pid),
                    "--subprocesses",
                    "--nonblocking",
                    "--rate",
                    "50",
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                    "--duration",
                    f"{seconds:.0f}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            figures = await measure_http(session, server, url, [PROFILE_RATE], seconds, "profiled_http")
            if spy.wait(seconds + 30) != 0:
                raise RuntimeError("py-spy failed (it needs ptrace: run as root or with CAP_SYS_PTRACE)")
    finally:
        _stop(server)
    return figures | _profile_shares(raw.read_text())


def _profile_shares(collapsed: str, top: int = 12) -> dict:
    """From py-spy's collapsed stacks (``frame;frame;... count``, root first, each frame ``function (file:line)``):
    ``profile_self_<area>_share`` for the ``top`` areas (a package or stdlib module) of the innermost frame, and
    ``profile_in_<file>_share`` for the ``top`` files of this repository anywhere on the stack."""
    own_folders = {path.name for path in REPO.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    self_samples: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [frame.rpartition(" (")[2].rpartition(":")[0] for frame in stack.split(";")[1:]]  # [0]: the process
        if not frames:
            continue
        n = int(count)
        total += n
        self_samples[_area(frames[-1], own_folders)] += n
        for file in {f for f in frames if f.split("/", 1)[0] in own_folders}:
            inclusive[file] += n
    share = lambda n: round(n / max(1, total), 3)  # noqa: E731
    key = lambda area: area.removesuffix(".py").replace("/", "_").replace(".", "_")  # noqa: E731
    return (
        {"profile_samples": total}
        | {f"profile_self_{key(area)}_share": share(n) for area, n in self_samples.most_common(top)}
        | {f"profile_in_{key(file)}_share": share(n) for file, n in inclusive.most_common(top)}
    )


def _area(file: str, own_folders: set[str]) -> str:
    """What a frame's ``file`` belongs to: this repository's file itself, else its package or stdlib module."""
    head = file.split("/", 1)[0]
    return file if head in own_folders else head.removesuffix(".py")


def _commit_interval_cost(figures: dict, rates: list[float]) -> dict:
    """What the default commit interval costs against SHORT_COMMIT_INTERVAL_MS: the p99 ratio at the highest rate both
    held with any p99 (enough answered, few on defaults: an overloaded scorer's p99 is its overload's, whatever the
    interval), and the scorer CPU per request of each there; None where no rate was held by both."""
    both = _held_by_all(figures, rates, ("kafka", SHORT_COMMIT), float("inf"))
    if not both:
        return {"kafka_commit_default_over_short_p99": None, "kafka_commit_compared_at_per_s": None}
    rate = f"{max(both):.0f}"
    return {
        "kafka_commit_default_over_short_p99": _ratio(figures[f"kafka_{rate}_p99_ms"], figures[f"{SHORT_COMMIT}_{rate}_p99_ms"]),
        "kafka_commit_default_over_short_cpu": _ratio(
            figures[f"kafka_{rate}_scorer_cpu_ms_per_request"], figures[f"{SHORT_COMMIT}_{rate}_scorer_cpu_ms_per_request"]
        ),
        "kafka_commit_compared_at_per_s": max(both),
    }


def _anchors(figures: dict) -> dict[str, str]:
    """The table's anchor column: each goal with whether this run met it, and what each ratio compares."""
    held = f"held: >= {HELD_ANSWERED:.0%} answered at >= {HELD_THROUGHPUT:.0%} of the rate, < {HELD_FALLBACKS:.0%} on defaults"
    verdict = {True: "met", False: "not met"}
    gain_met = figures.get("goal_dynamic_over_batch1_met", False)
    compared = figures.get("prediction_log_compared_at_per_s", 0.0)
    anchors = {
        "dynamic_over_batch1_at_p99_50ms": (
            f"Triton ~{TRITON_GAIN}x; goal >= {GOAL_GAIN:g}x at p99 <= {HELD_P99_MS:g} ms ({held}) — {verdict[gain_met]}"
        ),
        "dynamic_over_batch1_peak": "(each mode's highest throughput, any latency)",
        "prediction_log_ack_over_async_p99": (
            f"at {compared:.0f}/s: the highest rate both modes held (p99 <= {HELD_P99_MS:g} ms, {held})"
            if figures.get("prediction_log_compared_both_held")
            else f"at {compared:.0f}/s: no rate held by both modes"
        ),
    }
    if HTTP_GOAL in figures:
        anchors[f"http_{HTTP_GOAL_RATE:.0f}_p99_ms"] = f"goal <= {HTTP_GOAL_P99_MS:g} ms ({held}) — {verdict[figures[HTTP_GOAL]]}"
    if "http_cpu_ms_per_request" in figures:
        met = figures[f"goal_http_cpu_{CPU_GOAL_MS:g}ms_met"]
        held_there = "held" if figures[f"http_{CPU_GOAL_RATE:.0f}_held"] else "NOT held"
        anchors["http_cpu_ms_per_request"] = (
            f"at {CPU_GOAL_RATE:.0f}/s ({held_there}), {figures['workers']} workers: goal <= {CPU_GOAL_MS:g} ms held — "
            f"{verdict[met]}"
        )
    if "tracing_cpu_ms_per_request" in figures:
        rounds_held = "every round held" if figures["tracing_rounds_held"] else "NOT every round held"
        anchors["tracing_cpu_ms_per_request"] = (
            f"at {CPU_GOAL_RATE:.0f}/s, one scorer: requests its callers sampled minus unsampled, alternating "
            f"{figures['tracing_rounds_per_arm']} rounds a side (medians), times the sample ratio "
            f"{figures['tracing_sample_ratio']:.0%} ({rounds_held})"
        )
    if figures.get("kafka_commit_compared_at_per_s") is not None:
        anchors["kafka_commit_default_over_short_p99"] = (
            f"{figures['kafka_commit_interval_ms']:g} over {SHORT_COMMIT_INTERVAL_MS:g} ms, at "
            f"{figures['kafka_commit_compared_at_per_s']:.0f}/s: the highest rate both held"
        )
    for mode, goal_ms in KAFKA_GOAL_P99_MS.items():
        name = f"kafka_{mode}_{KAFKA_GOAL_RATE:.0f}_p99_ms"
        if name in figures:
            anchors[name] = f"goal <= {goal_ms:g} ms — {verdict[figures[f'goal_kafka_{mode}_p99_{goal_ms:.0f}ms_met']]}"
    return anchors


def _row_as_the_job_writes(layout, entity: str, event_time_us: int, features: dict) -> FeatureRow:
    """An entity's row as the feature job writes it: its finished values and, for each window, its steps (here one: the
    entity's events all in the newest tile, the window's values holding until that tile leaves it), so a read at
    request time takes the steps of its one round trip, as it does for the job's rows (a row without steps is read from
    its finished values in a second round trip)."""
    at_ms = event_time_us // 1000
    windows = {}
    for key, (_, window) in layout.windows.items():
        bound = at_ms // window.slide_ms + window.window_ms // window.slide_ms  # the head tile the newest one leaves at
        windows[key] = window.encode(at_ms, [(bound, tuple(features[a.name] for a in window.aggregations))])
    return FeatureRow(VIEW, entity, event_time_us, features, 1, windows)


def _check_domain(settings: Settings, view) -> None:
    """The project's ``VIEW`` keyed by ``ENTITY_KEY``, and ``REQUEST_FIELD`` a request field of its scored event, or exit
    saying which is not."""
    join_keys = [column.name for column in view.entity_columns]
    request_fields = project(settings).spec.scored_event.request_fields
    if join_keys != [ENTITY_KEY] or REQUEST_FIELD not in request_fields:
        raise SystemExit(
            f"the benchmark's domain is the fraud template's: {VIEW} keyed by {join_keys} (not [{ENTITY_KEY!r}]), "
            f"request fields {sorted(request_fields)} (without {REQUEST_FIELD!r})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (within a minute)")
    parser.add_argument("--only", choices=["core", "http", "kafka"], action="append", help="run only these parts")
    parser.add_argument(
        "--workers", type=int, default=len(os.sched_getaffinity(0)), help="scorer processes (default: one per core)"
    )
    parser.add_argument("--profile", action="store_true", help="instead: where the scorer's CPU goes, sampled by py-spy")
    args = parser.parse_args()
    parts = set(args.only or ["core", "http", "kafka"])
    first_core_rate, bisections, door_rates, seconds, tracing_rounds = (
        (2000.0, 0, [1000.0, 2000.0], 1.0, 1) if args.quick else (250.0, 4, [250.0, 500.0, 1000.0, 2000.0], 8.0, 3)
    )

    began = time.monotonic()
    with private_stack(console, "loopline-inference-") as settings:
        with console.status("writing a feature row per user"):
            view = feature_store(
                settings.feast_registry_path, settings.redis_connection, settings.repo_path
            ).get_stream_feature_view(VIEW)
            _check_domain(settings, view)
            fields = feature_fields(view)
            names = [f.name for f in fields]
            typed = {f.name: int if f.dtype.to_value_type().name == "INT64" else float for f in fields}
            now_us = int(time.time() * 1_000_000)
            writer = OnlineWriter(settings.feast_registry_path, settings.redis_connection, settings.repo_path)
            layout = writer.layout.views[VIEW]
            rows = [
                _row_as_the_job_writes(layout, f"bench-{u}", now_us, {n: typed[n](u % 7) for n in names}) for u in range(USERS)
            ]
            writer.write(rows)
            model_path = write_mlp_model(
                settings.home / "mlp.onnx", [f"{VIEW}:{n}" for n in names] + [f"request:{REQUEST_FIELD}"], (512, 512, 256)
            )
        figures: dict = {}
        if args.profile:
            figures |= asyncio.run(profile_scorer(settings, model_path, seconds if args.quick else PROFILE_SECONDS, args.workers))
            parts = set()
        if "core" in parts:
            figures |= asyncio.run(measure_core(settings, model_path, first_core_rate, seconds, bisections))
            figures["triton_gain_anchor"] = TRITON_GAIN
        if parts & {"http", "kafka"}:
            figures |= asyncio.run(
                measure_doors(
                    settings,
                    model_path,
                    parts & {"http", "kafka"},
                    door_rates,
                    seconds,
                    args.workers,
                    tracing_rounds,
                    comparisons=not args.quick,
                )
            )
    report(console, "online inference", args.quick, figures, _anchors(figures), began)


if __name__ == "__main__":
    main()
