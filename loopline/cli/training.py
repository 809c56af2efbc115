"""``loopline train`` and ``loopline retrain``: training on a snapshot, and the retrain trigger."""

from __future__ import annotations

import signal
import threading
import time
from typing import TYPE_CHECKING, Annotated

import typer

from loopline.cli import context
from loopline.cli.context import actor

if TYPE_CHECKING:
    from offline_training.retraining import RetrainOutcome

app = typer.Typer(
    help="The retrain trigger: retrain when prod's labeled quality falls or a skew or consistency alert fires (retrain.*)."
)


def train(
    snapshot: Annotated[str, typer.Option(help="The snapshot id to train on.")],
    resume: Annotated[bool, typer.Option(help="Continue the last run on this snapshot from its newest checkpoint.")] = False,
    processes: Annotated[
        int | None,
        typer.Option(help="Training processes per node (default feedback.train_processes; unset: one per visible GPU, else 2)."),
    ] = None,
    quantize: Annotated[bool | None, typer.Option(help="Also try dynamic INT8 (default retrain.quantize).")] = None,
    canary: Annotated[float | None, typer.Option(min=0.0, max=100.0, help="A canary on PCT % of requests.")] = None,
    owner: Annotated[str | None, typer.Option(help="Who answers for the model, on its card (default retrain.owner).")] = None,
    nnodes: Annotated[int, typer.Option(help="Training nodes: run this command on each, with its --node-rank.")] = 1,
    node_rank: Annotated[
        int, typer.Option(help="This node, 0..nnodes-1; node 0 serves the rendezvous, judges and registers.")
    ] = 0,
    rdzv: Annotated[str | None, typer.Option(help="HOST:PORT where the nodes meet (torchrun's c10d): node 0's address.")] = None,
) -> None:
    """Train on a snapshot with DeepSpeed (torchrun; on one node or, with --nnodes, several sharing feedback.train_dir),
    compare with prod on the same holdout rows, write the model card, register the model if it is not worse than prod,
    and with --canary release it on part of the traffic."""
    from loopline.retraining import retrain, train_on_snapshot

    if node_rank > 0:  # the model the nodes trained together is judged and registered once, by node 0
        metrics = train_on_snapshot(
            context.settings(), snapshot, resume=resume, processes=processes, nnodes=nnodes, node_rank=node_rank, rdzv=rdzv
        )
        context.console.print(
            f"node {node_rank} of {nnodes} done; node 0 judges and registers the model ({metrics.parent})", highlight=False
        )
        return
    reason = f"loopline train --canary {canary:g}" if canary else ""
    outcome = retrain(
        context.settings(),
        snapshot,
        resume=resume,
        processes=processes,
        quantize=quantize,
        canary_percent=canary,
        actor=actor(),
        reason=reason,
        owner=owner,
        nnodes=nnodes,
        rdzv=rdzv,
    )
    _print_outcome(outcome, canary)


def _print_outcome(outcome: RetrainOutcome, canary_requested: float | None) -> None:
    """The candidate against prod (table), whether it was registered and why, INT8's verdict, the canary, the card."""
    from loopline.tables import candidate_table

    report = outcome.report
    context.console.print(candidate_table(report, outcome.name))
    quantization = report.quantization
    if quantization is not None:
        context.console.print(
            f"INT8 {'kept' if quantization.kept else 'refused'}: {quantization.reason}; latency gain "
            f"×{quantization.latency_gain:.2f} (fp32 median ÷ INT8 median)",
            highlight=False,
        )
    if report.version is None:
        context.console.print(f"[red]not registered[/red]: {report.verdict.reason}", highlight=False)
    else:
        context.console.print(
            f"[green]registered {outcome.name} v{report.version}[/green]: {report.verdict.reason}", highlight=False
        )
    if outcome.canary_percent is not None:
        context.console.print(
            f"v{report.version} is the canary on {outcome.canary_percent:g} % of requests; `loopline release watch` decides"
        )
    elif canary_requested and report.version is not None:
        context.console.print(
            f"no canary: there is no prod to compare v{report.version} with; `loopline models promote {report.version}` serves it"
        )
    context.console.print(f"model card: {report.card_path}", highlight=False)


@app.command("watch")
def retrain_watch(once: Annotated[bool, typer.Option(help="Look once (and act on it), then stop.")] = False) -> None:
    """Judge prod on the labeled examples of the last retrain.window_s, and look for its skew and consistency alerts in
    Prometheus, every retrain.poll_s; when its quality falls or an alert fires, print why (notify) or also snapshot,
    train, evaluate and release the new version as a canary (retrain): retrain.mode for quality, retrain.alert_mode for
    alerts."""
    from loopline.retraining import trigger_step
    from offline_training.retraining import TrainJobStarted

    config = context.settings()
    if config.retrain.mode == config.retrain.alert_mode == "off":
        context.console.print(
            "the retrain trigger is off: set retrain.mode (labeled quality) or retrain.alert_mode (skew and "
            "consistency alerts) to notify or retrain (LOOPLINE_RETRAIN__MODE, LOOPLINE_RETRAIN__ALERT_MODE)"
        )
        return
    from infra.prometheus_server import alert_names

    unknown = sorted(set(config.retrain.alerts) - alert_names())
    if config.retrain.alert_mode != "off" and unknown:
        raise typer.BadParameter(
            f"retrain.alerts names no rule under infra/prometheus/: {', '.join(unknown)} "
            f"(the rules' alerts: {', '.join(sorted(alert_names()))})"
        )
    # SIGTERM (a pod's stop) ends the watch between looks, never inside one (a retraining or a TrainJob's creation).
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        decision, outcome = trigger_step(config)
        verdict = f"[red]fire[/red] ({config.retrain.mode_for(decision.causes)})" if decision.fire else "quiet"
        context.console.print(f"{time.strftime('%H:%M:%S')} {verdict}: {decision.reason}", highlight=False)
        if isinstance(outcome, TrainJobStarted):
            job = outcome.trainjob
            context.console.print(
                f"TrainJob {job.namespace}/{job.name} {'created' if job.created else 'already created'} on snapshot "
                f"{outcome.snapshot_id}: `kubectl get trainjob {job.name}` follows it",
                highlight=False,
            )
        elif outcome is not None:
            _print_outcome(outcome, config.retrain.canary_percent)
        if once:
            return
        stop.wait(config.retrain.poll_s)
