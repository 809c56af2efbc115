"""The top-level commands on the project: the ``--project`` option, ``init``, ``config``, ``apply``, ``produce`` and ``demo``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from loopline.cli import context
from loopline.components import apply_loopline_topics, project
from loopline.produce import produce_stream
from loopline.tables import topics_table
from schemas.kafka_config import masked


def main_options(
    project: Annotated[
        Path | None,
        typer.Option(
            "--project",
            help="The Loopline project to act on (a folder with "
            "loopline_project.yaml); default: the working directory's, or the nearest "
            "folder above it.",
            envvar="LOOPLINE_PROJECT",
        ),
    ] = None,
) -> None:
    """Loopline: streaming-first real-time features and inference, for the project in the working directory."""
    if project is not None:
        # Every command's settings, and every Loopline process a command starts, act on it.
        os.environ["LOOPLINE_PROJECT"] = str(project.absolute())


def init(
    directory: Annotated[Path, typer.Argument(help="The new project's folder (new, or empty).")],
    template: Annotated[str, typer.Option(help="The template to start from: fraud, delivery.")] = "fraud",
) -> None:
    """Make a Loopline project from a template, as `feast init` does: a Feast repo, contracts, labels, model, a synthetic
    world. Every command run in the folder acts on it."""
    from loopline.project import init_project
    from schemas.project import load_project

    made = load_project(init_project(directory, template))
    context.console.print(
        f"made {made.name} project in {made.path} from the {template} template; next: `cd {directory}` and "
        "`loopline stack up`, `loopline apply`, `loopline stream submit` (docs/guide.md walks through the rest)"
    )


def show_config() -> None:
    """Print the settings in force (override with LOOPLINE_* variables or a loopline.yaml); secrets masked."""
    shown = context.settings().model_dump(mode="json")
    shown["kafka"]["client_config"] = masked(shown["kafka"]["client_config"])
    context.console.print_json(json.dumps(shown))


def apply_all(
    topics: Annotated[
        bool, typer.Option(help="Also `topics apply`; --no-topics where an operator owns the topics (Strimzi's KafkaTopics).")
    ] = True,
) -> None:
    """`feast apply` on the feature repo (the Feast registry and Redis of these settings), then `topics apply`. The
    stream feature views are compiled against the project's contracts first: what the engine cannot compute is
    refused before anything is registered, naming the view."""
    from feature_store.config import apply_definitions, repo_stream_views
    from streams.feature_plan import compile_plan

    config = context.settings()
    plan = compile_plan(repo_stream_views(config.repo_path), project(config))
    context.console.print(f"the streaming plan: {len(plan.views)} views over {', '.join(plan.topics)}", highlight=False)
    views = apply_definitions(
        config.feast_registry_path, config.redis_connection, config.repo_path, redis_cluster=config.redis_cluster
    )
    context.console.print(f"feature views applied: {', '.join(views)} (Feast registry {config.feast_registry_path})")
    if topics:
        context.console.print(topics_table(apply_loopline_topics(config)))


def produce(
    rate: Annotated[float, typer.Option(help="Events per second (average; a world's bursts may go above).")] = 1000.0,
    duration: Annotated[float, typer.Option(help="Seconds of stream time to publish.")] = 10.0,
    seed: Annotated[int, typer.Option(help="Same seed and start: the same events.")] = 7,
    start: Annotated[str, typer.Option(help="Stream start time, ISO-8601 or 'now'.")] = "now",
    malformed_rate: Annotated[float | None, typer.Option(help="Share of deliberately broken records.")] = None,
) -> None:
    """Publish the project's synthetic world (its events, late and out of order ones among them, and labels)."""
    stats = produce_stream(context.settings(), rate, duration, seed, start, context.console, malformed_rate)
    context.console.print(json.dumps({"delivered": dict(stats.delivered), "seconds": round(stats.seconds, 2)}))


def demo(
    seconds: Annotated[
        float,
        typer.Option(help="Rough total run time (the demo goes on, bounded, until the loop closes).", envvar="DEMO_SECONDS"),
    ] = 300.0,
    rate: Annotated[
        float,
        typer.Option(
            help="Events per second of the world, each scored event scored (the feature job alone keeps up with thousands)."
        ),
    ] = 100.0,
    template: Annotated[
        str | None,
        typer.Option(
            help="Run this template's world (fraud, delivery) in a project of its own under "
            "the home; default: the project here, else fraud."
        ),
    ] = None,
) -> None:
    """Run the loop end to end on the local stack and print a summary; the stack stays up. Exit code 1 when a promise
    was not kept (a step of the loop failed, or the alerts do not match the injected skew)."""
    from loopline.project import instance_of_template
    from loopline.scenarios.demo import run_demo
    from schemas.project import find_project

    config = context.settings()
    if template is not None or (config.project is None and find_project(Path.cwd()) is None):
        config = context.settings(project=instance_of_template(config.home, template or "fraud"))
    failures = run_demo(config, seconds=seconds, rate=rate, console=context.console)
    if failures:
        Console(stderr=True, soft_wrap=True).print(
            f"[red]error:[/red] the demo did not keep {len(failures)} promise(s): " + "; ".join(failures), highlight=False
        )
        raise typer.Exit(1)
