"""The fault drill: kill -9 parts of the loop under load, restart them, and count what it cost.

With the project's world streaming events into the feature job, score requests streaming through a Kafka-door
scorer and HTTP requests hitting a second scorer (the project's first model), the drill kills (SIGKILL) and restarts, in turn
and at random moments, the Kafka broker, Redis, the feature job and the Kafka-door scorer. On a
Kafka cluster the broker killed is the node leading the most partitions; on nodes with hosts of
their own (``infra/netns.py``) the drill can also cut that node off the network (``broker_cut``).
Then it lets everything drain and checks what a user of Kafka and Flink expects:

* every score request has exactly one prediction in the committed log (none lost, none doubled),
  and so has every HTTP request answered 200 (its prediction logged before the answer: ``ack``);
* with the feedback joiner running too, every Kafka request, labeled, has exactly one training example;
* no transaction is left open on any of Loopline's topics (each partition's last stable offset is its end);
* the online features equal the offline recompute for every entity;
* HTTP requests sent while Redis was down were answered within the feature budget, on defaults;
* every process is up and reports itself live, and a fresh request still scores.

For each fault it also measures the time to recover: from the restart until the part works again
(a prediction arrives; a probe event's features are readable; an HTTP answer has real features),
the longest gap between predictions around it, and on a cluster the time until every partition has all
its replicas in sync again.
``tests/loopline/test_fault_drill.py`` runs one fault of each kind; ``benchmarks/faults.py`` runs several.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import requests
from confluent_kafka import Consumer

from infra.kafka import KafkaBroker
from infra.kafka_cluster import KafkaCluster
from infra.kafka_janitor import ABORTED as JANITOR_ABORTED
from infra.netns import NetworkNamespaces
from infra.service import free_port, wait_until
from loopline.components import build_stack, feature_plan, project, world
from loopline.job_processes import start_feature_job, start_joiner, start_scorer, stop_process_group
from loopline.project import write_first_model
from loopline.settings import Settings
from schemas.kafka_config import consumer_settings
from schemas.topics import PREDICTIONS, TOPICS
from streams.flink_job import RERUN_NOTE, STALL_AFTER_S
from streams.producer import EventProducer
from streams.recompute import accepted_events, feature_differences, recompute
from streams.topics import open_transaction_partitions, read_topic
from streams.world import Emitted

FAULT_KINDS = ("broker", "redis", "feature_job", "kafka_scorer")
#: Faults of a Kafka cluster's node: kill -9 it, or cut it off the network (nodes on hosts of their own only).
BROKER_FAULTS = ("broker", "broker_cut")
#: A feature read that falls back takes its budget plus the event loop's turn to notice (the scorer's own timing).
#: On two cores shared with a restarting Flink job, Kafka, Redis and the drill, a single turn has been seen to take up
#: to ~35 ms more (a whole answer then took 0.3-0.4 s): that is the machine, not the budget, so the drill judges the
#: fallback by its median read and every answer by being on defaults, unhung, and reports the slowest read.
FETCH_SLACK_MS = 25.0
#: An HTTP answer measured from the client: beyond this it would have hung, not merely waited for two busy cores.
_HTTP_HANG_S = 1.0
#: The longest a count waits for a reader still making progress: what has not arrived by then counts as lost.
_COUNT_DEADLINE_S = 600.0


def job_restarts(folder: Path, log_stem: str) -> int:
    """How often the Flink job logging to ``folder/<log_stem>.log`` was restarted: by Flink (its mini-cluster's log, in
    ``<log_stem>-flink/``, says RUNNING to RESTARTING) or by its watchdog (``streams/flink_job.run_job`` says so on the
    job's stderr). The mini-cluster's log rolls to ``*.log.1`` and on each time the job's process starts again: those
    count too."""
    logs = [folder / f"{log_stem}.log", *(folder / f"{log_stem}-flink").glob("*.log*")]
    markers = (b"switched from state RUNNING to RESTARTING", RERUN_NOTE.encode())
    count = 0
    for log_file in (path for path in logs if path.exists()):
        with log_file.open("rb") as log:
            count += sum(any(marker in line for marker in markers) for line in log)
    return count


@dataclass(frozen=True)
class FaultOutcome:
    """One injected fault: what was killed, when (s into the drill), how long it stayed down, and how long
    after its restart the part worked again (None: not within the drill)."""

    kind: str
    at_s: float
    down_s: float
    recovered_s: float | None
    #: The longest wait between two Kafka-door predictions from the fault until it recovered (the stall it caused).
    stall_s: float | None = None
    #: Kafka faults on a cluster: seconds from the node's return until every partition had all replicas in sync.
    full_isr_s: float | None = None


@dataclass(frozen=True)
class HttpAnswer:
    """One HTTP request of the drill's load: when it was sent (s into the drill), how long it took, its status,
    whether all its features were defaulted, and how long the scorer's feature read took (ms, its own timing)."""

    sent_s: float
    seconds: float
    status: int
    all_defaulted: bool
    fetch_ms: float | None
    request_id: str = ""

    def on_defaults(self) -> bool:
        """Answered, on default features, without hanging."""
        return self.status == 200 and self.all_defaulted and self.fetch_ms is not None and self.seconds <= _HTTP_HANG_S

    def within(self, budget_s: float) -> bool:
        """Its feature read ended within the budget and the event loop's turn (``FETCH_SLACK_MS``)."""
        return self.fetch_ms is not None and self.fetch_ms <= budget_s * 1000 + FETCH_SLACK_MS


def _median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None (None when there are none)."""
    present = [v for v in values if v is not None]
    return round(float(np.median(present)), 3) if present else None


@dataclass
class DrillReport:
    """What the drill measured."""

    faults: list[FaultOutcome]
    requests_sent: int
    requests_lost: int
    requests_duplicated: int
    http_predictions_lost: int
    http_predictions_duplicated: int
    #: With the joiner: Kafka requests without / with more than one training example (None: no joiner ran).
    examples_lost: int | None
    examples_duplicated: int | None
    open_transactions: list[str]
    feature_mismatches: list[str]
    entities_compared: int
    http_answers: list[HttpAnswer]
    redis_outages: list[tuple[float, float]]
    not_live: list[str]
    seconds: float
    budget_s: float
    #: Transactions a lone broker's crash left hanging that its janitor aborted (``infra/kafka_janitor.py``).
    hanging_transactions_aborted: int = 0
    #: Per Flink job: its restarts (by Flink after a task failed, or by its watchdog after it stalled), so a drill that
    #: lost something says whether a job stopped working on the way.
    job_restarts: dict[str, int] = field(default_factory=dict)

    def http_during_redis_outage(self) -> list[HttpAnswer]:
        """HTTP requests sent while Redis was down."""
        return [a for a in self.http_answers if any(start <= a.sent_s < end for start, end in self.redis_outages)]

    def figures(self) -> dict:
        """The drill's figures (the names the fault benchmark reports)."""
        outage = self.http_during_redis_outage()
        kinds = [kind for kind in (*FAULT_KINDS, "broker_cut") if any(f.kind == kind for f in self.faults)]

        def each(kind: str, attribute: str) -> list[float | None]:
            return [
                None if getattr(f, attribute) is None else round(getattr(f, attribute), 2) for f in self.faults if f.kind == kind
            ]

        return {
            "faults_injected": len(self.faults),
            "requests_sent": self.requests_sent,
            "requests_lost": self.requests_lost,
            "requests_duplicated": self.requests_duplicated,
            "http_predictions_lost": self.http_predictions_lost,
            "http_predictions_duplicated": self.http_predictions_duplicated,
            "examples_lost": self.examples_lost,
            "examples_duplicated": self.examples_duplicated,
            "open_transactions": self.open_transactions,
            "feature_mismatches": len(self.feature_mismatches),
            "entities_compared": self.entities_compared,
            "http_requests": len(self.http_answers),
            "http_statuses": dict(Counter(a.status for a in self.http_answers)),
            "http_during_redis_outage": len(outage),
            "http_during_redis_outage_on_defaults": sum(a.on_defaults() for a in outage),
            "http_during_redis_outage_within_budget": sum(a.within(self.budget_s) for a in outage),
            "http_during_redis_outage_fetch_median_ms": _median(a.fetch_ms for a in outage),
            "http_during_redis_outage_fetch_max_ms": max((a.fetch_ms for a in outage if a.fetch_ms is not None), default=None),
            **{f"{kind}_recovery_s": each(kind, "recovered_s") for kind in kinds},
            **{f"{kind}_stall_s": each(kind, "stall_s") for kind in kinds},
            **{f"{kind}_full_isr_s": each(kind, "full_isr_s") for kind in kinds if kind in BROKER_FAULTS},
            "hanging_transactions_aborted": self.hanging_transactions_aborted,
            **{f"{job.replace('-', '_')}_restarts": count for job, count in self.job_restarts.items()},
            "not_live": self.not_live,
            "drill_s": round(self.seconds, 1),
        }


class _Process:
    """A `loopline` child process (its own process group), restartable."""

    def __init__(self, name: str, start: Callable[[], subprocess.Popen]) -> None:
        self.name, self._start = name, start
        self.process = start()

    def kill(self) -> None:
        with _suppress_lookup():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def restart(self) -> None:
        self.process = self._start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float) -> None:
        """SIGTERM, waited for ``timeout_s`` (beyond a scorer's own bound, ``serving.shutdown_timeout_s``, after which
        it exits at once), then SIGKILL: the drill's figures are in by now, and no process of it outlives it."""
        try:
            stop_process_group(self.process, timeout_s=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


class _suppress_lookup:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, *_) -> bool:
        return kind is ProcessLookupError


class FaultDrill:
    """One drill on the stack of ``settings`` (up, topics and feature definitions applied), logging under ``folder``.

    ``kafka``: the Kafka the settings name, when it is not the stack's own (a cluster on hosts of its own); ``network``:
    those hosts, for ``broker_cut`` (node i of ``kafka`` on host i). With ``joiner`` the feedback joiner runs as well,
    and each Kafka request is labeled (its event id is its request id) a moment after it is sent. Before each fault the
    load runs steadily for a random ``steady_s`` (low, high) seconds, and a killed part stays down for a random
    ``down_s``: a test that counts what was lost needs little of either, a benchmark of many faults the longer ones."""

    def __init__(
        self,
        settings: Settings,
        folder: Path,
        *,
        faults_per_kind: int = 1,
        kinds: Sequence[str] = FAULT_KINDS,
        events_per_s: float = 300.0,
        requests_per_s: float = 100.0,
        http_per_s: float = 20.0,
        seed: int = 7,
        on_progress: Callable[[str], None] = lambda _: None,
        kafka: KafkaCluster | None = None,
        network: NetworkNamespaces | None = None,
        joiner: bool = False,
        steady_s: tuple[float, float] = (3.0, 8.0),
        down_s: tuple[float, float] = (2.0, 4.0),
    ) -> None:
        self.settings = settings.model_copy(
            update={"stream": settings.stream.model_copy(update={"checkpoint_interval_ms": 1000})}
        )
        self.folder = folder
        self.faults_per_kind, self.kinds = faults_per_kind, list(kinds)
        self.events_per_s, self.requests_per_s, self.http_per_s = events_per_s, requests_per_s, http_per_s
        self.rng = random.Random(seed)
        self.steady_s, self.down_s = steady_s, down_s
        self.say = on_progress
        self.run_id = f"drill-{uuid.uuid4().hex[:8]}"
        self._kafka_prefix = f"{self.run_id}-kafka"
        self._http_prefix = f"{self.run_id}-http"
        self.stack = build_stack(settings)
        self.kafka = kafka or self.stack.kafka
        self.network = network
        self.joiner = joiner
        self.plan = feature_plan(self.settings)
        self._examples: list[str] = []
        if "broker_cut" in self.kinds and network is None:
            raise ValueError("broker_cut needs the Kafka nodes on hosts of their own (network=)")
        self._began = time.monotonic()
        self._arrivals: list[tuple[float, str]] = []
        self._http: list[HttpAnswer] = []
        self._stop = threading.Event()
        self._load_done = threading.Event()

    def _now(self) -> float:
        return time.monotonic() - self._began

    # The processes ------------------------------------------------------------------------------

    def _serve(self, name: str, doors: list[str], model: Path, http_port: int, **env: str) -> Callable[[], subprocess.Popen]:
        return lambda: start_scorer(
            self.settings,
            ["--http", *doors],
            self.folder / f"{name}.log",
            LOOPLINE_SERVING__MODEL_PATH=str(model),
            LOOPLINE_SERVING__HTTP_PORT=str(http_port),
            LOOPLINE_SERVING__STALL_AFTER_S="20",
            **env,
        )

    def _live(self, port: int) -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/v1/health/live", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _ready(self, port: int) -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/v1/models/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    # The load -----------------------------------------------------------------------------------

    def _until_stopped(self, records: Iterable[Emitted]) -> Iterator[Emitted]:
        return itertools.takewhile(lambda _: not self._load_done.is_set(), records)

    def _produce_events(self) -> None:
        """The world's events on the topics the feature job reads (its labels are not: the drill labels its own)."""
        topics = set(self.plan.topics)
        events = (e for e in world(self.settings, self.events_per_s, 11, int(time.time() * 1000), 0.0) if e.topic in topics)
        producer = EventProducer(self.settings.kafka.bootstrap, client_config=self.settings.kafka.client_config)
        producer.publish(self._until_stopped(events), rate_per_s=self.events_per_s)

    def _produce_requests(self, sent: list[int]) -> None:
        producer = EventProducer(self.settings.kafka.bootstrap, client_config=self.settings.kafka.client_config)
        load = world(self.settings, 1.0, 12, int(time.time() * 1000)).requests(
            self.requests_per_s, self._kafka_prefix, self.joiner
        )
        sent.append(producer.publish(self._until_stopped(load), rate_per_s=self.requests_per_s).total)

    def _produce_labels(self, sent: list[int]) -> None:
        """A label for each Kafka request (event id = request id), a second or so after it was sent."""
        producer = EventProducer(self.settings.kafka.bootstrap, client_config=self.settings.kafka.client_config)
        labeler = world(self.settings, 1.0, 13, int(time.time() * 1000))

        def labels() -> Iterator[Emitted]:
            for n in itertools.count():
                while not sent and n >= self.requests_per_s * max(0.0, self._now() - 1.0):
                    time.sleep(0.05)
                if sent and n >= sent[0]:
                    return
                yield labeler.label(f"{self._kafka_prefix}-{n}", n)

        producer.publish(labels())

    def _read_examples(self) -> None:
        kafka = self.settings.kafka
        consumer = Consumer(consumer_settings(kafka.bootstrap, kafka.client_config, f"{self.run_id}-examples"))
        consumer.subscribe([self.settings.feedback.examples_topic])
        prefix = self._kafka_prefix.encode()
        seen: set[tuple[int, int]] = set()
        try:
            while not self._stop.is_set():
                for message in consumer.consume(1000, timeout=0.2):
                    key = message.key() if message.error() is None else None
                    if key and key.startswith(prefix) and _first_reading(message, seen):
                        self._examples.append(key.decode())
        finally:
            consumer.close()

    def _read_predictions(self) -> None:
        kafka = self.settings.kafka
        consumer = Consumer(consumer_settings(kafka.bootstrap, kafka.client_config, f"{self.run_id}-reader"))
        consumer.subscribe([PREDICTIONS.name])
        seen: set[tuple[int, int]] = set()
        try:
            while not self._stop.is_set():
                for message in consumer.consume(1000, timeout=0.2):
                    key = message.key() if message.error() is None else None
                    if key and key.startswith(self.run_id.encode()) and _first_reading(message, seen):
                        self._arrivals.append((self._now(), key.decode()))
        finally:
            consumer.close()

    def _http_load(self, port: int) -> None:
        session = requests.Session()
        url = f"http://127.0.0.1:{port}/v1/score"
        load = world(self.settings, 1.0, 14, int(time.time() * 1000)).requests(self.http_per_s, self._http_prefix)
        features = sum(not name.startswith("request:") for name in project(self.settings).spec.model.inputs)

        def one(n: int) -> None:
            request = next(load).record.model_copy(update={"requested_at_ms": int(time.time() * 1000)})
            sent = self._now()
            status, defaulted, fetch_ms = 0, False, None
            try:
                answer = session.post(url, data=request.model_dump_json(), timeout=10)
                status = answer.status_code
                if status == 200:
                    record = answer.json()
                    defaulted = len(record["defaulted_features"]) == features
                    fetch_ms = record["stage_latency_ms"]["feature_fetch"]
            except requests.RequestException:
                pass
            self._http.append(HttpAnswer(sent, self._now() - sent, status, defaulted, fetch_ms, request.request_id))

        with ThreadPoolExecutor(8) as pool:
            n = 0
            while not self._load_done.is_set():
                pool.submit(one, n)
                n += 1
                time.sleep(max(0.0, n / self.http_per_s - self._now()))

    # Faults -------------------------------------------------------------------------------------

    def _schedule(self) -> list[str]:
        """The faults in turn: every kind once per round, each round in a random order."""
        return [kind for _ in range(self.faults_per_kind) for kind in self.rng.sample(self.kinds, len(self.kinds))]

    def _probe_features(self, timeout_s: float) -> float | None:
        """Seconds until a fresh event's features are readable online (the feature job works), or None: an event of the
        world, of an entity of its own, now."""
        from feature_store.online_read import OnlineReader

        view = self.plan.views[0]
        now = int(time.time() * 1000)
        model = next(e for e in world(self.settings, 1.0, 15, now) if e.topic == view.topic and e.record is not None).record
        keys = {key: f"{self.run_id}-probe-{uuid.uuid4().hex[:6]}" for key in view.entity_keys}
        event = model.model_copy(update={**keys, view.time_field: now})
        began = time.monotonic()
        declared = project(self.settings)
        EventProducer(self.settings.kafka.bootstrap, client_config=self.settings.kafka.client_config).publish(
            [Emitted(view.topic, "probe", declared.encode(view.topic, event), now, event)]
        )
        settings = self.settings
        reader = OnlineReader(
            settings.feast_registry_path,
            settings.redis_connection,
            settings.repo_path,
            timeout_s=1.0,
            redis_cluster=settings.redis_cluster,
        )

        def visible() -> bool:
            try:
                return reader.row_timestamps_us(view.name, [keys])[0] is not None
            except Exception:
                return False

        return time.monotonic() - began if wait_until(visible, timeout_s, 0.2) else None

    def _recovery(self, kind: str, restarted_s: float) -> float | None:
        """Seconds from ``restarted_s`` until the killed part works again; None if not within 180 s. A lone broker's
        crash may leave transactions hanging, which its janitor aborts once they are a minute old
        (``infra/kafka_janitor.py``); a feature job restarted on two cores under the drill's load took ~100 s before
        its first checkpoint on a slow day (its JVM, Python workers and restored state)."""
        timeout_s = 180.0
        if kind == "feature_job":
            probe = self._probe_features(timeout_s)
            return None if probe is None else self._now() - restarted_s
        if kind == "redis":
            found = wait_until(
                lambda: any(a.sent_s >= restarted_s and a.status == 200 and not a.all_defaulted for a in self._http),
                timeout_s,
                0.1,
            )
            first = min(
                (a.sent_s + a.seconds for a in self._http if a.sent_s >= restarted_s and a.status == 200 and not a.all_defaulted),
                default=None,
            )
            return first - restarted_s if found and first is not None else None
        prefix = self._kafka_prefix

        def after() -> list[float]:
            return [at for at, key in self._arrivals[-500:] if at >= restarted_s and key.startswith(prefix)]

        return min(after()) - restarted_s if wait_until(lambda: bool(after()), timeout_s, 0.1) else None

    def _target_node(self) -> KafkaBroker:
        """The Kafka node a broker fault hits: the one leading the most partitions (the only one, alone)."""
        if len(self.kafka.nodes) == 1:
            return self.kafka.nodes[0]
        return self.kafka.node(self.kafka.busiest_leader())

    def _inject(self, kind: str, processes: dict[str, _Process]) -> tuple[float, float, float]:
        """Kill ``kind`` (SIGKILL) or cut it off, leave it down a few seconds (a cut node, long enough for the cluster
        to fence it), bring it back; (killed at, down for until the restart began, restarted (up again) at)."""
        killed = self._now()
        if kind == "broker_cut":
            node = self._target_node()
            host = self.kafka.nodes.index(node)
            self.network.cut(host)
            time.sleep(self.rng.uniform(12.0, 15.0))
            restarting = self._now()
            self.network.restore(host)
            return killed, restarting - killed, self._now()
        if kind in ("broker", "redis"):
            service = self._target_node() if kind == "broker" else self.stack.redis
            os.kill(service.pid(), signal.SIGKILL)
            wait_until(lambda: service.pid() is None, 10, 0.05)
        else:
            processes[kind].kill()
        time.sleep(self.rng.uniform(*self.down_s))
        restarting = self._now()
        if kind in ("broker", "redis"):
            service.start()
        else:
            processes[kind].restart()
        return killed, restarting - killed, self._now()

    def _log_sizes(self) -> dict[Path, int]:
        """Each broker log's size now: the drill counts only what its brokers write from here on."""
        return {node.log_file: node.log_file.stat().st_size if node.log_file.exists() else 0 for node in self.kafka.nodes}

    def _janitor_aborts(self, since: dict[Path, int]) -> int:
        """How many hanging transactions the brokers' janitors aborted since ``since`` (one broker log line each)."""
        count = 0
        for log_file, offset in since.items():
            if not log_file.exists():
                continue
            with log_file.open("rb") as log:
                log.seek(offset)
                count += sum(line.startswith(JANITOR_ABORTED.encode()) for line in log)
        return count

    def _full_isr(self, kind: str, restarted_s: float, timeout_s: float = 120.0) -> float | None:
        """Seconds from ``restarted_s`` until every partition has all its replicas in sync (Kafka faults on a
        cluster; None otherwise, or not within ``timeout_s``)."""
        if kind not in BROKER_FAULTS or len(self.kafka.nodes) == 1:
            return None
        return self._now() - restarted_s if wait_until(lambda: self.kafka.under_replicated() == 0, timeout_s, 0.5) else None

    def _stall(self, since_s: float, until_s: float) -> float | None:
        """The longest wait between Kafka-door predictions in [since_s, until_s] (its ends count as arrivals)."""
        times = sorted(at for at, key in self._arrivals if since_s <= at <= until_s and key.startswith(self._kafka_prefix))
        marks = [since_s, *times, until_s]
        return max(b - a for a, b in itertools.pairwise(marks)) if times else None

    # The drill ----------------------------------------------------------------------------------

    def run(self) -> DrillReport:
        """Run the drill; stop every process it started before returning."""
        settings = self.settings
        model = write_first_model(project(settings), self.folder / "drill.onnx")
        kafka_port, http_port = free_port(), free_port()
        group = f"{self.run_id}-scorer"
        logs_at_start = self._log_sizes()
        self.say("starting the feature job and two scorers (Kafka door; HTTP door)")
        processes = {
            "feature_job": _Process("feature_job", lambda: start_feature_job(settings, self.folder / "feature-job.log")),
            "kafka_scorer": _Process(
                "kafka_scorer",
                self._serve(
                    "kafka-scorer",
                    ["--kafka"],
                    model,
                    kafka_port,
                    LOOPLINE_SERVING__KAFKA_GROUP_ID=group,
                    LOOPLINE_SERVING__PREDICTION_LOG="off",
                ),
            ),
            "http_scorer": _Process("http_scorer", self._serve("http-scorer", [], model, http_port)),
        }
        if self.joiner:
            processes["joiner"] = _Process("joiner", lambda: start_joiner(settings, self.folder / "joiner.log", restore=False))
        try:
            assert wait_until(lambda: self._ready(kafka_port) and self._ready(http_port), 120, 0.2), "the scorers did not start"
            if self._probe_features(180) is None:
                raise RuntimeError(f"the feature job did not start; see {self.folder / 'feature-job.log'}")
            self._began = time.monotonic()
            sent: list[int] = []
            load = [
                threading.Thread(target=t, args=a, daemon=True)
                for t, a in (
                    (self._produce_events, ()),
                    (self._produce_requests, (sent,)),
                    (self._read_predictions, ()),
                    (self._http_load, (http_port,)),
                    *(((self._produce_labels, (sent,)), (self._read_examples, ())) if self.joiner else ()),
                )
            ]
            for thread in load:
                thread.start()
            faults, redis_outages = [], []
            for kind in self._schedule():
                time.sleep(self.rng.uniform(*self.steady_s))  # a random moment of steady load
                self.say(f"{self._now():5.1f} s: {'cut off the network:' if kind == 'broker_cut' else 'kill -9'} {kind}")
                killed, down_s, restarted = self._inject(kind, processes)
                if kind == "redis":
                    redis_outages.append((killed, killed + down_s))
                # Replicas catch up while the part recovers: both are timed from its return.
                with ThreadPoolExecutor(1) as isr_watch:
                    isr = isr_watch.submit(self._full_isr, kind, restarted)
                    recovered = self._recovery(kind, restarted)
                    full_isr = isr.result()
                self.say(
                    f"{self._now():5.1f} s: {kind} back after {down_s:.1f} s down, working again "
                    f"{recovered if recovered is None else round(recovered, 1)} s after restart"
                )
                stall = self._stall(killed, self._now() if recovered is None else restarted + recovered)
                faults.append(FaultOutcome(kind, killed, down_s, recovered, stall, full_isr))
            time.sleep(self.steady_s[1])  # load after the last fault, too
            self._load_done.set()
            for thread in (*load[:2], load[3]):  # the producers and the HTTP load (its requests in flight answered)
                thread.join()
            self.say("load done; waiting for every request's prediction and the features to settle")
            lost, duplicated = self._count_predictions(sent[0])
            http_lost, http_duplicated = self._count_http_predictions()
            examples_lost, examples_duplicated = self._count_examples(sent[0]) if self.joiner else (None, None)
            open_transactions = self._open_transactions()
            mismatches, compared = self._compare_features()
            not_live = [name for name, p in processes.items() if not p.alive()]
            not_live += [
                name for name, port in (("kafka_scorer", kafka_port), ("http_scorer", http_port)) if not self._live(port)
            ]
            return DrillReport(
                faults,
                sent[0],
                lost,
                duplicated,
                http_lost,
                http_duplicated,
                examples_lost,
                examples_duplicated,
                open_transactions,
                mismatches,
                compared,
                list(self._http),
                redis_outages,
                not_live,
                self._now(),
                settings.serving.feature_budget_ms / 1000,
                self._janitor_aborts(logs_at_start),
                {name: job_restarts(self.folder, name) for name in ("feature-job", *(("joiner",) if self.joiner else ()))},
            )
        finally:
            # A drill that raised mid-way stops its load too: left running, its clients kept calling the cluster's
            # addresses for the rest of the suite (seen in CI, answered by the next module's services there).
            self._load_done.set()
            self._stop.set()
            for process in processes.values():
                process.stop(settings.serving.shutdown_timeout_s + 15.0)

    @staticmethod
    def _exactly_once(expected: set[str], arrived: Callable[[], Iterable[str]], idle_s: float, grace_s: float) -> tuple[int, int]:
        """(lost, duplicated) of ``expected`` keys among those ``arrived()`` names, once every one has arrived (or
        none more for ``idle_s``: a reader still catching up is not losing anything; or, at the latest,
        :data:`_COUNT_DEADLINE_S`) and ``grace_s`` more, in which a stray duplicate, if the design allowed one, would
        come."""

        def counts() -> Counter:
            return Counter(key for key in arrived() if key in expected)

        progress = {"seen": -1, "at": time.monotonic()}

        def all_arrived_or_idle() -> bool:
            seen = len(counts())
            if seen != progress["seen"]:
                progress.update(seen=seen, at=time.monotonic())
            return seen >= len(expected) or time.monotonic() - progress["at"] > idle_s

        wait_until(all_arrived_or_idle, _COUNT_DEADLINE_S, 0.5)
        time.sleep(grace_s)
        seen = counts()
        return len(expected) - len(seen), sum(n - 1 for n in seen.values())

    def _count_predictions(self, sent: int) -> tuple[int, int]:
        """(lost, duplicated) predictions of the drill's Kafka requests, once the log has settled."""
        expected = {f"{self._kafka_prefix}-{n}" for n in range(sent)}
        return self._exactly_once(expected, lambda: (key for _, key in self._arrivals), 120.0, 2.0)

    def _count_examples(self, sent: int) -> tuple[int, int]:
        """(lost, duplicated) training examples of the drill's labeled Kafka requests, once the joiner has caught up:
        its examples commit with its checkpoints, so a duplicate would come within one more interval. A joiner left
        doing nothing by a failed task restart is run again by its watchdog (``streams/flink_job.run_job``) within
        STALL_AFTER_S: the wait for the next example outlasts that, its start and its replay."""
        expected = {f"{self._kafka_prefix}-{n}" for n in range(sent)}
        interval_s = self.settings.feedback.checkpoint_interval_ms / 1000
        return self._exactly_once(expected, lambda: self._examples, STALL_AFTER_S + 60.0, interval_s + 2.0)

    def _count_http_predictions(self) -> tuple[int, int]:
        """(lost, duplicated) predictions of HTTP requests answered 200 (each logged before its answer)."""
        answered = {a.request_id for a in self._http if a.status == 200}
        return self._exactly_once(answered, lambda: (key for _, key in self._arrivals), 30.0, 0.0)

    def _open_transactions(self, timeout_s: float = 60.0) -> list[str]:
        """Partitions of Loopline's topics whose last stable offset still lags their end ``timeout_s`` after the load
        stopped: a transaction left open (none of ours stays open that long)."""
        bootstrap, config = self.settings.kafka.bootstrap, self.settings.kafka.client_config
        names = [spec.name for spec in TOPICS]
        found: list[str] = []

        def settled() -> bool:
            found[:] = open_transaction_partitions(bootstrap, names, config)
            return not found

        wait_until(settled, timeout_s, 1.0)
        return found

    def _compare_features(self, timeout_s: float = 180.0) -> tuple[list[str], int]:
        """Online features against the offline recompute of every event in the log: (mismatches, entities)."""
        from feature_store.online_read import OnlineReader

        plan, kafka = self.plan, self.settings.kafka
        accepted = {
            topic: accepted_events(plan, topic, read_topic(kafka.bootstrap, topic, kafka.client_config))[0]
            for topic in plan.topics
        }
        expected = {view.name: recompute(view, accepted[view.topic]) for view in plan.views}
        reader = OnlineReader(
            self.settings.feast_registry_path,
            self.settings.redis_connection,
            self.settings.repo_path,
            redis_cluster=self.settings.redis_cluster,
        )

        def read(view, offline):
            rows = [
                dict(zip(view.entity_keys, key if len(view.entity_keys) > 1 else (key,), strict=True))
                for key in offline[view.entity_key]
            ]
            values = reader.get_online_features([f"{view.name}:{f}" for f in view.feature_names], rows)
            return pd.DataFrame({view.entity_key: offline[view.entity_key], **{f: values[f] for f in view.feature_names}})

        problems: list[str] = []

        def agrees() -> bool:
            problems[:] = feature_differences(plan, expected, read)
            return not problems

        wait_until(agrees, timeout_s, 1.0)
        return problems, sum(len(frame) for frame in expected.values())


def _first_reading(message, seen: set[tuple[int, int]]) -> bool:
    """Whether this reader meets ``message``'s log position (partition, offset) for the first time, remembering it in
    ``seen``. A reader whose group rejoins after the broker's restart resumes from its last committed offset and reads
    records again: the log holds each once, so only a second record of a key is a duplicate."""
    position = (message.partition(), message.offset())
    if position in seen:
        return False
    seen.add(position)
    return True
