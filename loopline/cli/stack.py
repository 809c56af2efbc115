"""``loopline stack``: the local stack (Kafka in KRaft mode, Redis, the Flink runtime)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from infra.service import tail
from loopline.cli import context
from loopline.components import build_stack
from loopline.settings import forget_stack_shape, read_stack_shape, remember_stack_shape
from loopline.tables import prebuilds_table, stack_table

app = typer.Typer(help="The local stack: Kafka (KRaft), Redis, Flink runtime.")


@app.command("setup")
def stack_setup() -> None:
    """Install missing Debian packages (as root), fetch the pinned jars from Maven Central, and build what would
    otherwise be built at first use (JVM operators, gRPC modules, DeepSpeed's ops)."""
    from loopline.prebuilds import prebuilds

    config = context.settings()
    added = build_stack(config).setup()
    context.console.print(f"set up: {', '.join(added)}" if added else "set up: nothing missing")
    built = []
    columns = (SpinnerColumn(), TextColumn("building {task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=context.console, transient=True) as progress:
        for prebuild in prebuilds(config):
            task, began = progress.add_task(prebuild.name, total=1), time.monotonic()
            made = prebuild.build()
            progress.update(task, completed=1, visible=False)
            built.append((prebuild.name, made, time.monotonic() - began))
    context.console.print(prebuilds_table(built))


@app.command("up")
def stack_up(
    kafka_brokers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=9,
            help="Kafka as a cluster of this many KRaft nodes (kafka.brokers); remembered until `stack down --wipe`.",
        ),
    ] = None,
    redis_cluster: Annotated[
        int | None,
        typer.Option(
            min=3,
            max=16,
            help="Redis as a Redis Cluster of this many masters, "
            "each with redis.cluster_replicas replicas (redis.mode cluster, "
            "redis.cluster_masters); remembered until `stack down --wipe`.",
        ),
    ] = None,
) -> None:
    """Start Kafka and Redis unless running, wait until each answers, check Flink; print status."""
    shape = {"kafka": {"brokers": kafka_brokers}} if kafka_brokers is not None else {}
    if redis_cluster is not None:
        shape["redis"] = {"mode": "cluster", "cluster_masters": redis_cluster}
    config = context.settings(**shape)
    remembered = read_stack_shape(config.home).get("kafka", {}).get("brokers", 1)
    if config.kafka.brokers != remembered:
        kafka = config.kafka.model_copy(update={"brokers": remembered})
        if build_stack(config.model_copy(update={"kafka": kafka})).kafka.formatted():
            raise typer.BadParameter(
                f"the stack's Kafka holds the data of {remembered} node(s); {config.kafka.brokers} cannot take it over. "
                "Run `loopline stack down --wipe` first (deletes the stack's data), then `stack up` again.",
                param_hint="--kafka-brokers",
            )
    stack = build_stack(config)
    reports = stack.up()
    if shape:
        remember_stack_shape(config.home, shape)
    context.console.print(stack_table(stack.status(), reports))


@app.command("down")
def stack_down(
    wipe: Annotated[bool, typer.Option(help="Also delete the services' data and the Flink jobs' checkpoints.")] = False,
) -> None:
    """Stop the stack; its data and the jobs' checkpoints stay unless --wipe."""
    config = context.settings()
    stopped = build_stack(config).down(wipe=wipe)
    if wipe:
        forget_stack_shape(config.home)
    context.console.print(
        f"stopped: {', '.join(stopped) or 'nothing was running'}" + ("; data and checkpoints wiped" if wipe else "")
    )


@app.command("status")
def stack_status() -> None:
    """Show each service's state, address, version and pid."""
    context.console.print(stack_table(build_stack(context.settings()).status()))


@app.command("logs")
def stack_logs(
    service: Annotated[str, typer.Argument(help="kafka or redis")],
    lines: Annotated[int, typer.Option("-n", help="How many lines.")] = 50,
) -> None:
    """Print the last lines of a service's log."""
    stack = build_stack(context.settings())
    by_name = {s.name: s for s in stack.services}
    if service not in by_name:
        raise typer.BadParameter(f"unknown service {service!r}; choose from {', '.join(by_name)}")
    for line in tail(by_name[service].log_file, lines):
        print(line)
