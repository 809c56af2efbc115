"""``loopline snapshot``: versioned training snapshots."""

from __future__ import annotations

from typing import Annotated

import typer

from loopline.cli import context
from loopline.cli.context import epoch_ms
from loopline.tables import snapshot_diff_table, snapshot_table

app = typer.Typer(help="Versioned training snapshots (parquet + manifest, content-addressed).")


@app.command("create")
def snapshot_create(
    start: Annotated[str | None, typer.Option("--from", help="Examples scored from this time (ISO-8601, UTC).")] = None,
    end: Annotated[str | None, typer.Option("--to", help="... up to (not including) this time.")] = None,
    backfill: Annotated[
        bool, typer.Option(help="Build examples from the event log (recompute), not from logged predictions.")
    ] = False,
    model: Annotated[str | None, typer.Option(help="Only this model's logged examples (default: every model's).")] = None,
) -> None:
    """Write an immutable snapshot of labeled examples; print its manifest summary."""
    from loopline.retraining import create_snapshot

    manifest = create_snapshot(context.settings(), epoch_ms(start), epoch_ms(end), backfill=backfill, model_name=model)
    context.console.print(snapshot_table([manifest], title="snapshot"))


@app.command("backfill")
def snapshot_backfill(
    snapshot_id: Annotated[str, typer.Argument(help="The snapshot to extend (a unique prefix will do).")],
    feature: Annotated[list[str], typer.Option("--feature", help="A feature added since (view:feature); repeat for more.")],
) -> None:
    """A new snapshot: the snapshot's examples with features added since, each as of its request's time, recomputed
    from the retained events with the stream's window semantics."""
    from loopline.retraining import backfill_snapshot

    manifest = backfill_snapshot(context.settings(), snapshot_id, feature, context.console)
    context.console.print(snapshot_table([manifest], title=f"snapshot {snapshot_id} with {', '.join(feature)}"))


@app.command("list")
def snapshot_list() -> None:
    """Every snapshot, oldest first."""
    from feedback_loop.snapshots import list_snapshots

    context.console.print(
        snapshot_table(
            list_snapshots(context.settings().snapshots_root), title=f"snapshots in {context.settings().snapshots_root}"
        )
    )


@app.command("show")
def snapshot_show(snapshot_id: Annotated[str, typer.Argument(help="A snapshot id (a unique prefix will do).")]) -> None:
    """A snapshot's manifest."""
    from feedback_loop.snapshots import find_snapshot

    manifest, folder = find_snapshot(context.settings().snapshots_root, snapshot_id)
    context.console.print(f"{folder}")
    context.console.print_json(manifest.to_json())


@app.command("diff")
def snapshot_diff(
    a: Annotated[str, typer.Argument(help="The reference snapshot.")], b: Annotated[str, typer.Argument(help="The other.")]
) -> None:
    """How snapshot B differs from A: rows, labels, features, and each feature's drift (PSI on A's bins)."""
    from feedback_loop.snapshots import diff_snapshots

    context.console.print(snapshot_diff_table(diff_snapshots(context.settings().snapshots_root, a, b)))
