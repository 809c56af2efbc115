"""``loopline topics``: Kafka topics from their specs."""

from __future__ import annotations

import typer

from loopline.cli import context
from loopline.components import apply_loopline_topics
from loopline.tables import topics_table

app = typer.Typer(help="Kafka topics from the specs in schemas/.")


@app.command("apply")
def topics_apply() -> None:
    """Create or update the project's topics and Loopline's own from their specs (idempotent)."""
    context.console.print(topics_table(apply_loopline_topics(context.settings())))
