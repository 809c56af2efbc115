"""``loopline serve``: the scorer behind its front doors, in one process or in a supervisor's workers."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from infra.errors import StackError
from loopline.cli import context


def serve(
    model: Annotated[Path | None, typer.Option(help="Serve this ONNX file (default: the model registry's prod/canary).")] = None,
    http: Annotated[bool, typer.Option(help="POST /v1/score, GET /v1/models/status|ready, /metrics.")] = True,
    kafka: Annotated[
        bool,
        typer.Option(help="scoring.requests -> scoring.predictions, exactly once (or at least once: serving.kafka_delivery)."),
    ] = False,
    grpc: Annotated[bool, typer.Option(help="loopline.scoring.v1.Scorer/Score (schemas/scoring.proto).")] = False,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Processes sharing the ports (default: serving.workers, else one per core).")
    ] = None,
    worker_index: Annotated[int | None, typer.Option(hidden=True, help="Set by the supervisor for each worker.")] = None,
) -> None:
    """Serve the scorer through its front doors until interrupted, hot-swapping the model registry's versions."""
    from loopline.serve_workers import WorkerSupervisor
    from loopline.serving import serve as run

    config = context.settings()
    path = model or config.serving.model_path
    if path is not None and not path.exists():
        raise StackError(f"no model file at {path}", "pass an existing --model PATH, or none to serve from the model registry")
    doors = {door for door, chosen in (("http", http), ("kafka", kafka), ("grpc", grpc)) if chosen}
    if not doors:
        raise StackError("no front door chosen", "pass --http, --kafka and/or --grpc")
    serving = config.serving
    where = {
        "http": f"http://{serving.host}:{serving.http_port}",
        "grpc": f"grpc {serving.host}:{serving.grpc_port}",
        "kafka": "Kafka scoring.requests",
    }
    count = workers or serving.workers or len(os.sched_getaffinity(0))
    if worker_index is not None:
        run(config, path, doors, worker=(worker_index, count))
        return
    source = path or f"{serving.model_name}@prod/canary from {config.tracking_uri}"
    context.console.print(
        f"scoring with {source} on {', '.join(where[d] for d in sorted(doors))}, {count} worker{'s' * (count > 1)}"
    )
    if count == 1:
        run(config, path, doors)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    arguments = [
        *(["--model", str(path)] if path is not None else []),
        *(f"--{'' if chosen else 'no-'}{door}" for door, chosen in (("http", http), ("kafka", kafka), ("grpc", grpc))),
    ]
    raise typer.Exit(WorkerSupervisor(config, arguments, count).run())
