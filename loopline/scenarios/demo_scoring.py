"""The demo's scoring half: a model released through the model registry, scoring every scored event over Kafka.

While the feature job and the producer run, ``DemoScoring`` registers the project's hand-set first model as ``prod``
and serves it with `loopline serve --kafka --http` in a process of its own, as in production
(``scoring.requests`` → ``scoring.predictions``, exactly once). Every live scored event of the demo's world is
followed by a score request naming it (the world's ``score_request``, ``demo_world.py``), so its label, when it
comes, meets the prediction in the feedback joiner. A reader of the prediction log (and of the scorer's
/metrics) reports requests/s, latency, batch size, model versions, the defaulted-feature rate and the
share of reads over budget.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests
from prometheus_client.parser import text_string_to_metric_families

from infra.errors import StackError
from infra.service import wait_until
from loopline.components import model_release, project
from loopline.job_processes import start_scorer
from loopline.project import write_first_model
from loopline.settings import Settings
from schemas.model_registry import PROD_ALIAS
from schemas.records import PredictionRecord
from schemas.topics import PREDICTIONS
from streams.topic_follower import TopicFollower

_WINDOW_S = 5.0


#: Scorer counters the table reads (mean batch size, share of requests over the feature budget).
_COUNTERS = (
    ("loopline_scoring_batch_size_sum", {}),
    ("loopline_scoring_batch_size_count", {}),
    ("loopline_scoring_feature_fallbacks_total", {"reason": "over_budget"}),
    ("loopline_scoring_requests_total", {"door": "kafka", "status": "200"}),
)


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


@dataclass(frozen=True)
class ScoringStats:
    """What the prediction log shows over a stretch of time."""

    requests_per_s: float
    scorer_p50_ms: float
    scorer_p99_ms: float
    end_to_end_p50_ms: float
    end_to_end_p99_ms: float
    versions: dict[str, int]
    defaulted_rate: float
    mean_batch: float | None
    over_budget_rate: float | None

    @classmethod
    def of(cls, logged: Iterable[_Logged], seconds: float, counted: list[float]) -> ScoringStats | None:
        """The figures of the predictions ``logged`` over ``seconds``, and of the scorer's counters (``_COUNTERS``)
        over that time; None without predictions."""
        rows = list(logged)
        if not rows:
            return None
        scorer, end_to_end = np.array([r.scorer_ms for r in rows]), np.array([r.end_to_end_ms for r in rows])
        return cls(
            requests_per_s=len(rows) / max(seconds, 1e-9),
            scorer_p50_ms=float(np.percentile(scorer, 50)),
            scorer_p99_ms=float(np.percentile(scorer, 99)),
            end_to_end_p50_ms=float(np.percentile(end_to_end, 50)),
            end_to_end_p99_ms=float(np.percentile(end_to_end, 99)),
            versions=dict(sorted(Counter(r.version for r in rows).items(), key=lambda kv: int(kv[0]))),
            defaulted_rate=sum(r.defaulted for r in rows) / max(sum(r.features for r in rows), 1),
            mean_batch=_ratio(counted[0], counted[1]),
            over_budget_rate=_ratio(counted[2], counted[3]),
        )


@dataclass(frozen=True)
class _Logged:
    """What the figures need of one prediction (the records themselves are not kept: a run logs tens of thousands)."""

    at: float
    scorer_ms: float
    end_to_end_ms: float
    version: str
    defaulted: int
    features: int

    @classmethod
    def of(cls, record: PredictionRecord) -> _Logged:
        return cls(
            time.monotonic(),
            record.stage_latency_ms["total"],
            record.scored_at_ms - record.requested_at_ms,
            record.model_version,
            len(record.defaulted_features),
            len(record.features),
        )


def _samples(metrics_text: str, wanted: Sequence[tuple[str, dict[str, str]]]) -> list[float]:
    """The values of the samples ``wanted`` (name, labels) in a Prometheus exposition (0 when absent), parsed once."""
    values = [0.0] * len(wanted)
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            for index, (name, labels) in enumerate(wanted):
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    values[index] = sample.value
    return values


class DemoScoring:
    """The scorer (a process of its own), its request stream and a reader of its prediction log."""

    def __init__(self, settings: Settings, models_dir: Path) -> None:
        serving = settings.serving.model_copy(update={"model_registry_poll_s": 1.0, "kafka_group_id": "loopline-demo-scorer"})
        self.settings = settings.model_copy(update={"serving": serving})
        self.run_id = f"demo-{int(time.time())}"
        self._release = model_release(self.settings)
        declared = project(settings)
        self._first_model = write_first_model(declared, models_dir / f"{declared.name}-hand-set.onnx")
        self._scorer: subprocess.Popen | None = None
        self._logged: list[_Logged] = []
        self._follower: TopicFollower | None = None
        #: What the score requests' fields are multiplied by, by field: the demo's injected skew, once it injects it.
        self.skew: dict[str, float] = {}
        self._counted: deque[tuple[float, list[float]]] = deque()
        self._started = time.monotonic()
        self._baseline = [0.0] * len(_COUNTERS)
        self.url = f"http://{serving.host}:{serving.http_port}"

    def _release_first_model(self) -> None:
        name = self.settings.serving.model_name
        version = self._release.register(name, self._first_model, description=f"hand-set demo model ({self.run_id})")
        # A canary an earlier demo left out (its controller had no time for a verdict) would take half of this run's traffic.
        self._release.end_canary(name, "loopline demo", "a new demo starts")
        self._release.set_alias(name, PROD_ALIAS, version, "loopline demo", "the demo's first model")

    def start_serving(self, log_file: Path) -> None:
        """Release version 1 and start `loopline serve --kafka --http` (it joins its consumer group once the model is warm)."""
        self._release_first_model()
        self._scorer = start_scorer(self.settings, ["--kafka", "--http"], log_file)
        # From the start of the topic, keys filtered by this run's prefix: a reader that joined late would miss the first.
        kafka = self.settings.kafka
        self._follower = TopicFollower(
            kafka.bootstrap,
            PREDICTIONS.name,
            PredictionRecord,
            lambda message, record: self._logged.append(_Logged.of(record)),
            wanted=lambda message: (message.key() or b"").startswith(self.run_id.encode()),
            client_config=kafka.client_config,
        ).start()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until the scorer serves a model (StackError, naming its log, if it does not)."""

        def ready() -> bool:
            try:
                return requests.get(f"{self.url}/v1/models/ready", timeout=1).ok
            except requests.RequestException:
                return False

        if not wait_until(lambda: ready() or self._scorer.poll() is not None, timeout_s, 0.2) or self._scorer.poll() is not None:
            raise StackError(f"the scorer at {self.url} did not get ready", "see its log (scorer.log under the stack's logs)")

    def over_budget_counts(self) -> tuple[float, float] | None:
        """(reads over the feature budget, requests answered) since counting started, from the scorer's /metrics; None
        when it did not answer in three tries (a busy moment: the training run starting)."""
        for _ in range(3):
            counted = self._counters()
            if counted is not None:
                return counted[2], counted[3]
            time.sleep(0.5)
        return None

    def _counters(self) -> list[float] | None:
        """The scorer's counters of ``_COUNTERS`` since counting started (``start_counting``), from its /metrics; None
        when it does not answer."""
        try:
            text = requests.get(f"{self.url}/metrics", timeout=1).text
        except requests.RequestException:
            return None
        return [value - base for value, base in zip(_samples(text, _COUNTERS), self._baseline, strict=True)]

    def start_counting(self) -> None:
        """Start the figures' clock (requests per second) and the scorer's counters now: scoring starts (what it scored
        before, an earlier demo's leftover requests, is not this run's)."""
        self._started = time.monotonic()
        self._baseline = [0.0] * len(_COUNTERS)
        self._baseline = self._counters() or self._baseline

    def stats(self) -> tuple[ScoringStats | None, ScoringStats | None]:
        """(the last few seconds, the whole run)."""
        now = time.monotonic()
        # The scorer's counters now and a window ago: their change over the window (a moment it did not answer is left out).
        counted = self._counters()
        if counted is not None or not self._counted:
            self._counted.append((now, counted or [0.0] * len(_COUNTERS)))
        while len(self._counted) > 2 and self._counted[1][0] <= now - _WINDOW_S:
            self._counted.popleft()
        first, last = self._counted[0][1], self._counted[-1][1]
        logged = self._logged[:]
        recent = itertools.takewhile(lambda r: r.at >= now - _WINDOW_S, reversed(logged))
        return (
            ScoringStats.of(recent, min(_WINDOW_S, now - self._started), [b - a for a, b in zip(first, last, strict=True)]),
            ScoringStats.of(logged, now - self._started, last),
        )

    def stop(self) -> None:
        """Stop serving (SIGTERM: the scorer commits what it scored and leaves its group) and reading."""
        if self._scorer is not None and self._scorer.poll() is None:
            self._scorer.send_signal(signal.SIGTERM)
            self._scorer.wait(60)
        if self._follower is not None:
            self._follower.stop()
