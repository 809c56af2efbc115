"""The ``loopline`` command: projects, the local stack, topics, contracts, the synthetic world, jobs, serving, the
feedback loop and the demo.

This module only assembles the command: each group's commands live in the module named for the group, and the
order they are added in here is the order ``loopline --help`` lists them in."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from loopline.cli import (
    feedback,
    flink,
    gpu_plan,
    models,
    monitor,
    project,
    schemas,
    serve,
    snapshot,
    stack,
    stream,
    topics,
    training,
)
from loopline.cli.errors import USER_ERRORS, one_line

__all__ = ["USER_ERRORS", "app", "main"]

app = typer.Typer(help="Loopline: streaming-first real-time features and inference.", pretty_exceptions_enable=False)
app.callback()(project.main_options)
app.command("init")(project.init)
app.command("config")(project.show_config)
app.command("apply")(project.apply_all)
app.command("produce")(project.produce)
app.command("serve")(serve.serve)
app.command("release")(models.release)
app.command("rollback")(models.rollback)
app.command("train")(training.train)
app.command("monitor")(monitor.monitor)
app.command("dashboard")(monitor.dashboard)
app.command("plan-gpu")(gpu_plan.plan_gpu)
app.command("demo")(project.demo)
app.add_typer(stack.app, name="stack")
app.add_typer(topics.app, name="topics")
app.add_typer(schemas.app, name="schemas")
app.add_typer(stream.app, name="stream")
app.add_typer(flink.app, name="flink")
app.add_typer(models.app, name="models")
app.add_typer(feedback.app, name="feedback")
app.add_typer(snapshot.app, name="snapshot")
app.add_typer(training.app, name="retrain")


def main() -> None:
    """Console entry point: user errors are one line on stderr and exit code 1."""
    try:
        app()
    except USER_ERRORS as err:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {one_line(err)}", highlight=False)
        sys.exit(1)
