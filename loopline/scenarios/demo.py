"""``make demo`` (the fraud template) and ``loopline demo --template NAME``: the whole loop of a project, end to end
on the local stack, closed in every run.

Stack up → `feast apply` + topics → the streaming feature job (embedded Flink, in its own process) reads the demo's
world (the project's, ``streams/world.py``) from its first record: the recent history of the world at once, so every
window the model reads is full, then live (``loopline/scenarios/demo_world.py``) → once the job has absorbed the
history, every scored event is followed by a score request naming it, scored over Kafka by the project's hand-set first
model from the model registry (``demo_scoring.py``) → the loop closes (``demo_loop.py``): the feedback joiner meets
predictions with their labels, a snapshot is made, a model trained on it, evaluated against prod, released as a canary,
and the release controller promotes or rolls it back while the scorer hot-swaps; the skew monitor watches the
prediction log against the loop's snapshot, one skew is injected on purpose (the project's ``demo.skew``: the fraud
project's amounts in cents) and exactly that feature alerts (``demo_skew.py``) → every record validated (bad ones
dead-lettered) → a summary, and a check of each promise. The demo goes on past its budget (bounded) until the loop and
the skew alert have had their verdicts; a step that fails is named, and the demo exits non-zero. The stack stays up.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from feature_store.online_read import OnlineReader
from feature_store.online_write import OnlineWriter
from loopline.components import apply_loopline_topics, build_stack, feature_plan, project
from loopline.job_processes import start_feature_job, stop_process_group
from loopline.scenarios.demo_loop import TRAINING_STEP, DemoLoop, Step
from loopline.scenarios.demo_scoring import DemoScoring
from loopline.scenarios.demo_skew import SKEW_ALERT, DemoSkew
from loopline.scenarios.demo_world import DemoWorld
from loopline.settings import Settings
from loopline.tables import counts_table, scoring_table, stack_table, topics_table
from schemas.records import DeadLetterRecord
from schemas.topics import DEAD_LETTERS, TOPICS
from schemas.validation import decode
from streams.producer import PublishStats
from streams.topics import topic_sizes
from streams.validating_consumer import ValidatingConsumer

#: The demo's producer sends a few broken records on purpose, to show dead-lettering.
_DEMO_MALFORMED_RATE = 0.002
#: The feature job's start (a mini-cluster) and its reading of the world's history, at most.
_HISTORY_TIMEOUT_S = 300.0
#: The job has absorbed the history when its rows are this close behind the world's stream time.
_CAUGHT_UP_MS = 3_000
#: Labels come days late in life; in the demo they come within seconds, so the loop closes while you watch.
_DEMO_LABEL_DELAY_S = (2.0, 20.0)
#: The steady state (outside the training run) should have fewer feature reads over budget than this.
_STEADY_OVER_BUDGET_GOAL = 0.05
#: How long the demo's release controller watches the canary before it may promote it.
_CANARY_WATCH_S = 15.0
_CANARY_MIN_REQUESTS = 500
#: Past its budget, the demo goes on at most this long for the loop's verdict and the skew alert.
OVERTIME_S = 240.0
_REFRESH_S = 1.0


@dataclass(frozen=True)
class _Watched:
    """What the live table shows: some entities of one view (the project's ``demo.watch``, its busiest), and the
    features of it the model reads."""

    view: str
    features: tuple[str, ...]
    entities: tuple[dict[str, str], ...]

    @classmethod
    def of(cls, settings: Settings) -> _Watched:
        declared = project(settings)
        watch = declared.spec.demo.get("watch", {})
        view = next(v for v in feature_plan(settings).views if v.name == watch["view"])
        features = tuple(name.split(":", 1)[1] for name in declared.spec.model.inputs if name.startswith(f"{view.name}:"))
        entities = tuple(e if isinstance(e, dict) else {view.entity_keys[0]: str(e)} for e in watch.get("entities", ()))
        return cls(view.name, features or view.feature_names, entities)

    def label(self, entity: dict[str, str]) -> str:
        return " × ".join(entity.values())


def _features_table(reader: OnlineReader, watched: _Watched, title: str) -> Table:
    now_us = time.time() * 1e6
    values = reader.get_online_features([f"{watched.view}:{f}" for f in watched.features], list(watched.entities))
    stamps = reader.row_timestamps_us(watched.view, list(watched.entities))
    table = Table(title=title)
    for column in ("entity", *watched.features, "row age"):
        table.add_column(column, justify="left" if column == "entity" else "right")
    for index, entity in enumerate(watched.entities):
        cells = [values[f][index] for f in watched.features]
        age = "—" if stamps[index] is None else f"{(now_us - stamps[index]) / 1e6:.1f} s"
        table.add_row(
            watched.label(entity), *("—" if v is None else f"{v:,.2f}" if isinstance(v, float) else str(v) for v in cells), age
        )
    return table


def _newest_row_ms(reader: OnlineReader, watched: _Watched) -> int | None:
    """The event time of the newest row among the watched entities (the busiest: their rows follow the stream closely)."""
    stamps = [s for s in reader.row_timestamps_us(watched.view, list(watched.entities)) if s is not None]
    return int(max(stamps) / 1000) if stamps else None


def _absorb_history(world: DemoWorld, job, reader: OnlineReader, watched: _Watched, console: Console) -> float:
    """Wait, showing progress, until the feature job has read the world's history and follows it live; its seconds."""
    began = time.monotonic()
    # Transient: the line printed after it says how it ended (off a terminal, a kept last frame ran into that line).
    with Live(console=console, refresh_per_second=2, transient=True) as live:
        while True:
            if job.poll() is not None:
                raise RuntimeError(
                    "the feature job stopped while reading the history; see feature-job.log under the stack's logs"
                )
            if not world.running:
                world.stop()  # raises what stopped it
            newest = _newest_row_ms(reader, watched)
            behind_s = None if newest is None else (world.stream_time_ms - newest) / 1000
            history_out = world.stream_time_ms >= time.time() * 1000 - 1000
            live.update(
                f"history: {world.history_published:,} events of the world's last "
                f"{(world.published_from_ms - world.history_from_ms) / 60_000:.0f} min published"
                f"{' (all of it)' if history_out else ''}; the feature job is "
                + (
                    "starting (a mini-cluster takes ~20 s)"
                    if behind_s is None
                    else f"{max(behind_s, 0):,.0f} s of stream time behind"
                )
                + f" — {time.monotonic() - began:.0f} s"
            )
            if history_out and newest is not None and world.stream_time_ms - newest <= _CAUGHT_UP_MS:
                return time.monotonic() - began
            if time.monotonic() - began > _HISTORY_TIMEOUT_S:
                raise TimeoutError(
                    f"the feature job had not read the history after {_HISTORY_TIMEOUT_S:.0f} s"
                    f" ({behind_s} s behind); see feature-job.log under the stack's logs"
                )
            time.sleep(0.5)


@dataclass
class _Run:
    """The live part's moving pieces."""

    world: DemoWorld
    scoring: DemoScoring
    loop: DemoLoop
    skew: DemoSkew
    reader: OnlineReader
    watched: _Watched


def _run_live(run: _Run, budget_end: float, console: Console) -> None:
    """Score live until the budget is spent and the loop and the skew have their verdicts (at most OVERTIME_S more)."""
    started = time.monotonic()
    run.loop.close_once(deadline=budget_end + OVERTIME_S)

    def tables() -> Group:
        now = time.monotonic()
        recent, whole = run.scoring.stats()
        versions = " → ".join(f"v{v}" for v in (whole.versions if whole else {}))
        over = (
            f" — budget spent {now - budget_end:.0f} s ago: going on (at most {OVERTIME_S:.0f} s) for "
            + " and ".join(
                what
                for what, done in (("the loop's verdict", run.loop.settled()), ("the skew alert", run.skew.settled()))
                if not done
            )
            if now > budget_end
            else ""
        )
        title = f"live features in Redis — {run.world.published:,} records published, live for {now - started:.0f} s{over}"
        return Group(
            _features_table(run.reader, run.watched, title),
            scoring_table(
                recent, whole, title=f"scoring every scored event over Kafka, p50/p99 — model versions {versions or '—'}"
            ),
            run.loop.table(),
            run.skew.table(),
        )

    with Live(console=console, refresh_per_second=1) as live:
        while True:
            run.skew.step(release_decided=run.loop.settled())
            live.update(tables())
            now = time.monotonic()
            if not run.world.running:
                break
            if now >= budget_end and run.loop.settled() and run.skew.settled():
                break
            if now >= budget_end + OVERTIME_S:
                break
            time.sleep(_REFRESH_S)


def _stop_all(stops: Sequence[Callable[[], object]], quiet: bool = False) -> None:
    """Run every stop, whatever an earlier one raised; then raise the first error unless ``quiet`` (the demo is already
    ending on another)."""
    errors = []
    for stop in stops:
        try:
            stop()
        except Exception as err:
            errors.append(err)
    if errors and not quiet:
        raise errors[0]


def _over_budget_split(final: tuple[float, float] | None, around_training: dict[str, tuple[float, float] | None]) -> dict:
    """The share of reads over budget while the model trained, and in the steady state (the rest of the run); None
    where the scorer's counters were not read (then the split is unknown, not guessed)."""

    def share(over: float, answered: float) -> float | None:
        return round(over / answered, 3) if answered > 0 else None

    unknown = {"over_feature_budget_rate_steady": None, "over_feature_budget_rate_while_training": None}
    if final is None:
        return unknown
    if "start" not in around_training:
        return {**unknown, "over_feature_budget_rate_steady": share(*final)}
    start, end = around_training["start"], around_training.get("end", final)
    if start is None or end is None:
        return unknown
    training = (end[0] - start[0], end[1] - start[1])
    return {
        "over_feature_budget_rate_steady": share(final[0] - training[0], final[1] - training[1]),
        "over_feature_budget_rate_while_training": share(*training),
    }


def _validate(settings: Settings, console: Console) -> tuple[dict, list[DeadLetterRecord]]:
    """Validate every record of the run (bad ones dead-lettered); the counts per topic and a few dead letters."""
    bootstrap, client = settings.kafka.bootstrap, settings.kafka.client_config
    dead_letters: list[DeadLetterRecord] = []
    declared = project(settings)
    events = {topic: declared.decoder(topic) for topic in declared.contracts}
    validator = ValidatingConsumer(bootstrap, "loopline-demo-validator", events, DEAD_LETTERS.name, client_config=client)
    try:
        counts = validator.run_until_caught_up(timeout_s=120.0)
    finally:
        validator.close()
    letters = {DEAD_LETTERS.name: lambda payload: decode(DeadLetterRecord, payload)}
    dlq = ValidatingConsumer(bootstrap, "loopline-demo-dlq-reader", letters, DEAD_LETTERS.name, client_config=client)
    try:
        counts |= dlq.run_until_caught_up(
            timeout_s=30.0,
            on_valid=lambda _topic, record: dead_letters.append(record),  # type: ignore[arg-type]
        )
    except TimeoutError as err:
        # Seen on a second demo over the same stack: a dead-letter transaction a stopped job left open holds
        # read_committed readers back until the broker times it out. The records above are counted; say so and go on.
        console.print(
            f"[yellow]events.dlq not read to its end ({err}): a transaction a stopped job left open holds"
            " read_committed readers back until it times out[/yellow]",
            highlight=False,
        )
    finally:
        dlq.close()
    return counts, dead_letters


def unkept_promises(summary: dict, loop: DemoLoop) -> list[str]:
    """What the demo promised and did not happen, one line each (empty when everything did)."""
    unfinished = {"failed": "failed", "running": "was still running when the demo's time ran out", "waiting": "never started"}
    failures = [
        f"the loop's step '{step.name}' {unfinished[step.state]}" + (f": {step.detail}" if step.detail else "")
        for step in loop.steps.values()
        if step.state in unfinished
    ]
    if summary["release"] not in ("promote", "rollback") and not failures:
        failures.append(f"the release controller gave no verdict on the trained model ({summary['release']})")
    if not summary["skew_injected"]:
        failures.append("the skew was never injected (the monitor had no reference snapshot, or measured nothing)")
    elif not summary["prometheus_answered"]:
        failures.append("Prometheus did not answer: which skew alerts fired is unknown")
    elif summary["skew_alerting_features"] != summary["skew_injected_features"]:
        failures.append(
            f"skew alerts fired for {summary['skew_alerting_features'] or 'no feature'}, the skew was injected into "
            f"{summary['skew_injected_features']}"
        )
    others_pending = sorted(set(summary["skew_pending_features"]) - set(summary["skew_injected_features"]))
    if summary["skew_injected"] and others_pending:
        failures.append(f"skew alerts are pending for {others_pending}, which nobody skewed")
    return failures


def run_demo(settings: Settings, seconds: float, rate: float, console: Console) -> list[str]:
    """The loop end to end within about ``seconds`` (longer, bounded, until the loop and the skew have their verdicts),
    at ``rate`` events per second of the project's world. Prints live tables and a summary; returns the promises not kept
    (empty when every one was)."""
    from feature_store.config import apply_definitions

    began = time.monotonic()
    stack = build_stack(settings)
    console.rule("1. local stack")
    reports = stack.up()
    console.print(stack_table(stack.status(), reports))

    console.rule("2. feature definitions and topics")
    bootstrap = settings.kafka.bootstrap
    views = apply_definitions(
        settings.feast_registry_path, settings.redis_connection, settings.repo_path, redis_cluster=settings.redis_cluster
    )
    console.print(f"feast apply: {', '.join(views)}")
    # This run's world is a new one: an earlier run's rows must not stand in for its quiet users' features.
    cleared = OnlineWriter(
        settings.feast_registry_path, settings.redis_connection, settings.repo_path, redis_cluster=settings.redis_cluster
    ).delete_rows()
    console.print(f"online rows of an earlier run deleted: {', '.join(cleared)}")
    console.print(topics_table(apply_loopline_topics(settings)))
    history_s = feature_plan(settings).history_ms(project(settings).spec.model.inputs) / 1000
    watched = _Watched.of(settings)

    console.rule(
        f"3. the world's last {history_s / 60:.0f} min at once: every window the model reads is full before anything is scored"
    )
    # The demo watches its canary for seconds, not the policy's default minute: the verdict comes while you watch. Each
    # arm's p99 is judged over 500 requests (~10 s at half the rate each): over 100 it was their slowest one or two,
    # which on two busy cores is the scheduler's doing, not the model's.
    demo_policy = settings.release.model_copy(update={"min_watch_s": _CANARY_WATCH_S, "min_requests": _CANARY_MIN_REQUESTS})
    scoring = DemoScoring(settings.model_copy(update={"release": demo_policy}), settings.home / "models")
    world = DemoWorld(scoring.settings, scoring, rate, history_s, _DEMO_MALFORMED_RATE, _DEMO_LABEL_DELAY_S)
    # The scorer's counts as training starts and ends: the steady state's over-budget share is the rest of the run.
    around_training: dict[str, tuple[float, float] | None] = {}
    skew = DemoSkew(settings, scoring, settings.resolved_logs_dir)
    console.print(
        f"the skew alert dashboard: {skew.dashboard_url} (Prometheus: http://{settings.prometheus.host}:"
        f"{settings.prometheus.port}/alerts)",
        highlight=False,
    )

    def note_step(step: Step) -> None:
        if step.name == TRAINING_STEP:
            around_training["end" if step.state != "running" else "start"] = scoring.over_budget_counts()
        if step.name == "snapshot" and step.state == "done" and loop.outcome.snapshot_id:
            skew.start_monitor(loop.outcome.snapshot_id)

    loop = DemoLoop(scoring.settings, scoring.run_id, on_step=note_step)
    reader = OnlineReader(
        settings.feast_registry_path, settings.redis_connection, settings.repo_path, redis_cluster=settings.redis_cluster
    )
    jobs: list = []
    published: list[PublishStats] = []
    # In this order: the world first (the scorer commits what it scored of it), the feature job last.
    stops = (
        lambda: published.append(world.stop()),
        loop.stop,
        skew.stop,
        scoring.stop,
        lambda: [stop_process_group(job) for job in jobs],
    )
    try:
        # The job builds its state from this run's world alone: no checkpoint, no earlier demo's events.
        jobs.append(
            start_feature_job(
                settings, settings.resolved_logs_dir / "feature-job.log", restore=False, from_ms=world.published_from_ms
            )
        )
        skew.start_dashboard()
        # While the job starts and reads the history: the scorer (its own process, as in production) loads its
        # model and warms up, and the joiner starts.
        scoring.start_serving(settings.resolved_logs_dir / "scorer.log")
        loop.start(settings.resolved_logs_dir / "joiner.log")
        world.start()
        history_took_s = _absorb_history(world, jobs[0], reader, watched, console)
        console.print(
            f"the feature job read {world.history_published:,} events of history in {history_took_s:.0f} s"
            " and follows the world live",
            highlight=False,
        )
        scoring.wait_ready()

        console.rule("4. live: every scored event scored over Kafka, the loop closing, a skew injected")
        world.go_live()
        scoring.start_counting()
        _run_live(_Run(world, scoring, loop, skew, reader, watched), began + seconds, console)
        _, scored = scoring.stats()  # while the scorer still answers for its counters
        final_counts = scoring.over_budget_counts()
        skew_summary = skew.summary()
    except BaseException:
        _stop_all(stops, quiet=True)
        raise
    _stop_all(stops)
    stats = published[0]
    console.print(loop.table())

    console.rule("5. validating (bad records go to the dead-letter topic)")
    counts, dead_letters = _validate(settings, console)
    console.print(
        counts_table(stats.delivered, counts, topic_sizes(bootstrap, [t.name for t in TOPICS], settings.kafka.client_config))
    )
    for record in dead_letters[:3]:
        console.print(
            f"  dead letter ({record.reason}, by {record.consumer}) from "
            f"{record.source_topic}[{record.source_partition}]@{record.source_offset}: {record.error}",
            highlight=False,
        )

    summary = {
        "seconds": round(time.monotonic() - began, 1),
        "delivered": stats.total,
        "history_events": world.history_published,
        "history_s": history_s,
        "history_absorbed_s": round(history_took_s, 1),
        "events_per_s": round(stats.total / max(stats.seconds, 1e-9)),
        "valid": sum(c.valid for t, c in counts.items() if t != DEAD_LETTERS.name),
        "dead_lettered": sum(c.dead_lettered for c in counts.values()),
        "watched_entities_with_features": sum(
            s is not None for s in reader.row_timestamps_us(watched.view, list(watched.entities))
        ),
        "scored": sum(scored.versions.values()) if scored else 0,
        "scored_by_version": scored.versions if scored else {},
        "scorer_p99_ms": round(scored.scorer_p99_ms, 2) if scored else None,
        "defaulted_feature_rate": round(scored.defaulted_rate, 3) if scored else None,
        "over_feature_budget_rate": round(scored.over_budget_rate, 3) if scored and scored.over_budget_rate is not None else None,
        **_over_budget_split(final_counts, around_training),
        "labeled_examples": len(loop.labeled()),
        "snapshot_id": loop.outcome.snapshot_id,
        "trained_version": loop.outcome.candidate_version,
        "holdout_metric": loop.quality.headline,
        "holdout_quality": {k: round(v, 4) for k, v in loop.outcome.holdout_quality.items()},
        "release": loop.outcome.release,
        "loop_steps": {step.name: step.state for step in loop.steps.values()},
        **skew_summary,
    }
    failures = unkept_promises(summary, loop)
    summary["failures"] = failures
    _report(summary, settings, console)
    return failures


def _report(summary: dict, settings: Settings, console: Console) -> None:
    """The summary's sentences, then the summary itself as one JSON line (the last line the demo prints)."""
    console.rule("summary")
    trained = summary["trained_version"]
    measured = ", ".join(f"{k} {v:.4g}" for k, v in summary["holdout_quality"].items()) or "none"
    metric = summary["holdout_metric"].upper()
    console.print(
        f"The loop: {summary['labeled_examples']:,} labeled examples → snapshot {summary['snapshot_id']} → "
        + (
            f"v{trained} trained (holdout {metric} {measured}) → the release controller: {summary['release'] or 'no verdict'}."
            if trained
            else f"no model registered (holdout {metric} {measured})."
        ),
        highlight=False,
    )
    steady = summary["over_feature_budget_rate_steady"]
    if steady is not None:
        verdict = "met" if steady < _STEADY_OVER_BUDGET_GOAL else "NOT met"
        console.print(
            f"Feature reads over their {settings.serving.feature_budget_ms:g} ms budget (answered on the declared defaults,"
            f" flagged in each prediction): {steady:.1%} in the steady state (goal < {_STEADY_OVER_BUDGET_GOAL:.0%}: {verdict}),"
            f" {summary['over_feature_budget_rate_while_training'] or 0:.1%} while the model trained — everything above shares"
            f" {os.cpu_count()} cores: two Flink jobs, Kafka, Redis, Prometheus, the monitor, the scorer, the training run and"
            " the producer.",
            highlight=False,
        )
    if summary["skew_injected"]:
        alerting = ", ".join(summary["skew_alerting_features"]) or "none"
        console.print(
            f"Skew injected into {', '.join(summary['skew_injected_features'])} (the score requests' field multiplied,"
            f" as the project's demo.skew says): the monitor measured PSI {summary['skew_psi']}"
            f" for {summary['skew_feature']} against snapshot"
            f" {summary['skew_reference_snapshot']};"
            f" Prometheus' {SKEW_ALERT}: {summary['skew_alert']}. Features alerting now: {alerting}"
            + (
                " — the injected one, and only it."
                if summary["skew_alerting_features"] == summary["skew_injected_features"]
                else "."
            ),
            highlight=False,
        )
    causes = summary["retrain_trigger_causes"]
    verdict = (
        f"fire ({settings.retrain.mode_for(causes)}, on {' and '.join(causes)})" if summary["retrain_trigger_fires"] else "quiet"
    )
    console.print(
        f"The retrain trigger, looking now (`loopline retrain watch` looks every {settings.retrain.poll_s:g} s): {verdict}:"
        f" {summary['retrain_trigger_reason']}",
        highlight=False,
    )
    for failure in summary["failures"]:
        console.print(f"[red]not as promised:[/red] {failure}", highlight=False)
    console.print(
        "The stack is still up for exploring (`loopline stack status`, `loopline stream submit` to run the"
        " feature job again, `loopline monitor` and `loopline dashboard` for the skew page); `make down` stops it."
    )
    console.print(json.dumps(summary), soft_wrap=True, highlight=False)
