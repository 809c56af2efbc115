"""The demo's feedback half: the loop closed once while the producer and the scorer run.

The feedback joiner (PyFlink, a process of its own) joins the scorer's predictions with the labels
as they arrive; once enough are labeled, ``DemoLoop`` snapshots them, trains a model on exactly
the features the scorer used (DeepSpeed on the CPU), evaluates it against ``prod`` on the same
holdout rows, registers it when it is not worse, releases it as a canary, and lets the release
controller promote or roll it back by the policy. ``table()`` shows each step as it happens and
the labeled quality of each model version, before and after.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from rich.table import Table

from loopline.components import project
from loopline.job_processes import start_joiner, stop_process_group
from loopline.settings import Settings
from offline_training.evaluation import Quality
from offline_training.launch import stop_training
from schemas.records import TrainingExample
from streams.topic_follower import TopicFollower

#: Enough labels to train on and hold out from: labeled examples, and of a binary label's, positives.
MIN_LABELED, MIN_POSITIVE = 400, 30
#: Training processes in the demo: one, since the demo's two cores also run two Flink jobs, Kafka, Redis, the scorer
#: and the producer (two gloo processes took ~2x as long to start there; the tests train with two).
TRAIN_PROCESSES = 1
#: The demo trains on a few hundred labeled rows: the default config's 4 epochs under-fit them (the fraud project's holdout
#: AUC 0.73-0.77 on three demo snapshots, against 0.82-0.84 with 40 epochs); 40 epochs of 400 rows take about a second.
DEMO_EPOCHS = 40
#: The trained model's share of requests while the controller watches it (half: evidence comes fast).
CANARY_PERCENT = 50.0
#: The step that trains (the heaviest moment on the demo's cores).
TRAINING_STEP = "train, evaluate, release"
#: Who the demo is in the alias history.
ACTOR = "loopline demo"
#: The CPU niceness of the demo's background work (the joiner, training, the monitor, the dashboard): on two cores shared
#: with the scorer, a nice 10 process yields them when the scorer (nice 0) wakes, so a feature read is not kept waiting
#: for its turn behind a training step. In production these run on other machines.
BACKGROUND_NICENESS = 10
#: The controller looks this often.
_CONTROLLER_POLL_S = 2.0


@dataclass
class Step:
    """One step of closing the loop: its name, state (waiting, running, done, skipped, failed) and what it found."""

    name: str
    state: str = "waiting"
    detail: str = ""
    began: float | None = None
    seconds: float | None = None


@dataclass
class LoopOutcome:
    """What closing the loop produced, for the demo's summary."""

    snapshot_id: str | None = None
    snapshot_rows: int | None = None
    candidate_version: str | None = None
    #: The holdout's headline metric (AUC, RMSE) of the candidate and of prod.
    holdout_quality: dict[str, float] = field(default_factory=dict)
    release: str | None = None


class DemoLoop:
    """The joiner, a reader of its examples, and the thread that closes the loop once."""

    def __init__(
        self,
        settings: Settings,
        run_id: str,
        min_labeled: int = MIN_LABELED,
        min_positive: int = MIN_POSITIVE,
        on_step: Callable[[Step], None] | None = None,
    ) -> None:
        """The loop over ``settings``' stack, for the score requests whose ids start with ``run_id``; it trains once
        ``min_labeled`` of them have their labels (of a binary label, ``min_positive`` positives among them). ``on_step``
        is called as each step starts and ends."""
        self.settings, self.run_id, self.on_step = settings, run_id, on_step
        self.quality = Quality(project(settings).labels.kind)
        self.min_labeled, self.min_positive = min_labeled, min_positive if self.quality.kind == "binary" else 0
        self.started_ms = int(time.time() * 1000)
        self.steps = {name: Step(name) for name in ("labels", "snapshot", TRAINING_STEP, "controller")}
        self.outcome = LoopOutcome()
        self._examples: list[TrainingExample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._joiner = None
        #: The training run's launcher while it runs (stopped with the loop: it must not outlive the demo).
        self._training = None
        self._follower: TopicFollower | None = None

    def start(self, log_file: Path) -> None:
        """Start the joiner (from scratch: an earlier demo's state is not this run's) and the reader of its examples."""
        self._joiner = start_joiner(self.settings, log_file, restore=False, niceness=BACKGROUND_NICENESS)
        kafka = self.settings.kafka
        self._follower = TopicFollower(
            kafka.bootstrap,
            self.settings.feedback.examples_topic,
            TrainingExample,
            self._keep_example,
            keep=lambda message, example: example.request_id.startswith(self.run_id),
            client_config=kafka.client_config,
        ).start()

    def close_once(self, deadline: float) -> None:
        """Close the loop in the background, giving up on steps that cannot finish before ``deadline`` (monotonic)."""
        self._thread(self._close, deadline)

    def _thread(self, target, *args) -> None:
        self._threads.append(threading.Thread(target=target, args=args, daemon=True))
        self._threads[-1].start()

    def _keep_example(self, message, example: TrainingExample) -> None:
        with self._lock:
            self._examples.append(example)

    def settled(self) -> bool:
        """Whether closing the loop has ended: every step done, failed or skipped."""
        return all(step.state in ("done", "failed", "skipped") for step in self.steps.values())

    def labeled(self) -> list[TrainingExample]:
        """This run's labeled examples so far."""
        with self._lock:
            return [e for e in self._examples if e.label is not None]

    def _run(self, name: str, action: Callable[[], str]) -> bool:
        step = self.steps[name]
        step.state, step.began = "running", time.monotonic()
        if self.on_step is not None:
            self.on_step(step)
        try:
            step.detail = action()
            step.state = "done"
        except Exception as err:  # the demo goes on and says what failed
            step.state, step.detail = "failed", f"{type(err).__name__}: {err}"[:300]
        step.seconds = time.monotonic() - step.began
        if self.on_step is not None:
            self.on_step(step)
        return step.state == "done"

    def _close(self, deadline: float) -> None:
        from loopline.components import release_controller
        from loopline.retraining import create_snapshot, retrain

        def enough_labels() -> str:
            while not self._stop.is_set():
                labeled = self.labeled()
                positives = sum(bool(e.label) for e in labeled) if self.quality.kind == "binary" else 0
                need = f"need {self.min_labeled}" + (f", {self.min_positive} positive" if self.min_positive else "")
                self.steps["labels"].detail = (
                    f"{len(labeled):,} labeled examples joined"
                    + (f", {positives} positive" if self.min_positive else "")
                    + f" ({need})"
                )
                if len(labeled) >= self.min_labeled and positives >= self.min_positive:
                    return self.steps["labels"].detail
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not enough labels before the time budget ran out ({self.steps['labels'].detail})")
                time.sleep(0.5)
            raise InterruptedError("stopped")

        def snapshot() -> str:
            manifest = create_snapshot(self.settings, self.started_ms, None, model_name=self.settings.serving.model_name)
            self.outcome.snapshot_id, self.outcome.snapshot_rows = manifest.snapshot_id, manifest.rows
            return f"{manifest.snapshot_id}: {manifest.rows:,} examples, labels {manifest.label_balance}"

        def train_and_release() -> str:
            self.steps[TRAINING_STEP].detail = (
                f"DeepSpeed on the CPU ({TRAIN_PROCESSES} process, {DEMO_EPOCHS} epochs), ONNX export, evaluation against"
                " prod, registration"
            )
            outcome = retrain(
                self._small_data_settings(),
                self.outcome.snapshot_id,
                processes=TRAIN_PROCESSES,
                canary_percent=CANARY_PERCENT,
                actor=ACTOR,
                reason="trained on this run's feedback",
                echo=None,
                on_start=lambda process: setattr(self, "_training", process),
            )
            report = outcome.report
            comparison, headline = report.comparison, self.quality.headline
            measured = {"candidate": comparison.candidate[headline]}
            if comparison.prod is not None:
                measured[f"prod v{comparison.prod_version}"] = comparison.prod[headline]
            self.outcome.candidate_version, self.outcome.holdout_quality = report.version, measured
            on_holdout = f"holdout ({comparison.holdout_rows:,} latest rows): " + ", ".join(
                f"{k} {self.quality.describe(v)}" for k, v in measured.items()
            )
            if report.version is None:
                raise RuntimeError(f"not registered ({report.verdict.reason}); {on_holdout}")
            return f"v{report.version} registered and released as the canary on {CANARY_PERCENT:g} % of requests; {on_holdout}"

        def control() -> str:
            controller = release_controller(self.settings)
            while not self._stop.is_set():
                outcome = controller.step()
                if outcome is None:
                    raise RuntimeError("the canary is gone")
                decision, _, _ = outcome
                self.steps["controller"].detail = f"{decision.action}: {decision.reason}"
                if decision.action != "wait":
                    self.outcome.release = decision.action
                    return self.steps["controller"].detail
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no verdict before the time budget ran out ({decision.reason})")
                time.sleep(_CONTROLLER_POLL_S)
            raise InterruptedError("stopped")

        for step_name, action in (
            ("labels", enough_labels),
            ("snapshot", snapshot),
            (TRAINING_STEP, train_and_release),
            ("controller", control),
        ):
            if not self._run(step_name, action):
                for later in list(self.steps.values())[list(self.steps).index(step_name) + 1 :]:
                    later.state = "skipped"
                return

    def _small_data_settings(self) -> Settings:
        """The settings with the training config's epochs raised to ``DEMO_EPOCHS`` (written beside the stack's data),
        training at ``BACKGROUND_NICENESS``."""
        from offline_training.retraining import DEFAULT_TRAIN_CONFIG
        from offline_training.train_config import load_train_config

        config = load_train_config(self.settings.feedback.train_config or DEFAULT_TRAIN_CONFIG).model_copy(
            update={"epochs": DEMO_EPOCHS}
        )
        path = self.settings.home / "demo-train-config.yaml"
        path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
        feedback = self.settings.feedback.model_copy(
            update={"train_config": path.absolute(), "train_niceness": BACKGROUND_NICENESS}
        )
        return self.settings.model_copy(update={"feedback": feedback})

    def quality_by_version(self) -> dict[str, tuple[int, float | None]]:
        """Per model version: (labeled examples, the headline metric of its scores) over this run's feedback."""
        by_version: dict[str, list[TrainingExample]] = {}
        for example in self.labeled():
            by_version.setdefault(example.model_version, []).append(example)
        quality = {}
        for version, examples in sorted(by_version.items(), key=lambda kv: int(kv[0])):
            labels = np.array([float(e.label) for e in examples])
            value = self.quality.metrics(np.array([e.score for e in examples]), labels)[self.quality.headline]
            quality[version] = (len(examples), value if self.quality.measurable(value) else None)
        return quality

    def table(self) -> Table:
        """The loop's steps, and each version's quality on the labels that came back."""
        table = Table(title="closing the loop — predictions ⋈ labels → snapshot → train → canary → controller")
        for column in ("step", "state", "", "what happened"):
            table.add_column(column, justify="right" if column == "" else "left")
        for step in self.steps.values():
            running = time.monotonic() - step.began if step.state == "running" and step.began else None
            seconds = step.seconds if step.seconds is not None else running
            table.add_row(step.name, step.state, "" if seconds is None else f"{seconds:.0f} s", step.detail)
        for version, (labeled, value) in self.quality_by_version().items():
            table.add_row(f"v{version} on feedback", "", "", f"{labeled:,} labeled: {self.quality.describe(value)}")
        return table

    def stop(self) -> None:
        """Stop the joiner, a training run still going, and the threads (a step still running is abandoned)."""
        self._stop.set()
        if self._training is not None and self._training.poll() is None:
            stop_training(self._training)
        if self._joiner is not None:
            stop_process_group(self._joiner)
        if self._follower is not None:
            self._follower.stop()
        for thread in self._threads:
            thread.join(30)
