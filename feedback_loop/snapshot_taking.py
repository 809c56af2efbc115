"""Taking training snapshots: of the examples the joiner logged, of examples recomputed point in time from the event
log, and of an earlier snapshot extended with features added since it was taken."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from feedback_loop.example_log import backfill_examples, logged_examples
from feedback_loop.snapshots import Manifest, SnapshotError, examples_frame, read_snapshot, write_snapshot
from streams.topics import read_topic

if TYPE_CHECKING:
    from schemas.project import Project
    from streams.feature_plan import FeaturePlan, ViewPlan

#: Told how far a snapshot's extension has come: what it is doing, steps done, steps in all.
Progress = Callable[[str, int, int], None]


def snapshot_logged_examples(
    bootstrap_servers: str,
    examples_topic: str,
    snapshots_root: Path,
    label_kind: str,
    from_ms: int | None,
    to_ms: int | None,
    client_config: Mapping[str, str] | None = None,
    model_name: str | None = None,
) -> Manifest:
    """Snapshot the examples of ``examples_topic`` scored in ``[from_ms, to_ms)`` (only ``model_name``'s when given)."""
    examples, source = logged_examples(bootstrap_servers, examples_topic, from_ms, to_ms, client_config, model_name)
    return write_snapshot(
        examples_frame(examples),
        snapshots_root,
        kind="feedback",
        source=source,
        time_range={"from_ms": from_ms, "to_ms": to_ms},
        label_kind=label_kind,
    )


def snapshot_recomputed_examples(
    plan: FeaturePlan,
    project: Project,
    bootstrap_servers: str,
    snapshots_root: Path,
    from_ms: int | None,
    to_ms: int | None,
    client_config: Mapping[str, str] | None = None,
) -> Manifest:
    """Snapshot examples recomputed point in time from the event log for every labeled scored event scored in
    ``[from_ms, to_ms)``, with the project's model inputs."""
    events = {topic: read_topic(bootstrap_servers, topic, client_config) for topic in plan.topics}
    labels = read_topic(bootstrap_servers, project.labels.topic, client_config)
    frame = backfill_examples(plan, project, events, labels, project.spec.model.inputs)
    if from_ms is not None:
        frame = frame[frame["predicted_at_ms"] >= from_ms]
    if to_ms is not None:
        frame = frame[frame["predicted_at_ms"] < to_ms]
    source = {
        "backfill": {
            "topics": sorted(events),
            "labels": project.labels.topic,
            "events": sum(len(messages) for messages in events.values()),
        }
    }
    return write_snapshot(
        frame,
        snapshots_root,
        kind="backfill",
        source=source,
        time_range={"from_ms": from_ms, "to_ms": to_ms},
        label_kind=project.labels.kind,
    )


def extend_snapshot(
    snapshots_root: Path,
    snapshot_id: str,
    features: list[str],
    plan: FeaturePlan,
    defaults: Mapping[str, float | int | str | bool | None],
    bootstrap_servers: str,
    client_config: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """A new snapshot: ``snapshot_id``'s examples with ``features`` (``view:feature``, added since it was taken), each
    read as of its request's time from the retained events (``feedback_loop/snapshot_backfill.py``; ``defaults``: the
    default each feature declares, by ``view:feature``), telling ``progress`` how far it has come. Refused
    (SnapshotError) for a snapshot not taken from the example log, and where a topic no longer retains the windows the
    earliest request needs."""
    from feedback_loop.snapshot_backfill import backfill_features, request_points, requested_features
    from streams.recompute import accepted_events
    from streams.retention_check import deleted_until_ms

    told = progress or (lambda *_: None)
    features = list(dict.fromkeys(features))  # a feature named twice is backfilled once
    manifest, frame = read_snapshot(snapshots_root, snapshot_id)
    if "topic" not in manifest.source:
        raise SnapshotError(
            f"snapshot {manifest.snapshot_id} was not taken from the example log ({manifest.kind}): make it "
            "anew with the features (loopline snapshot create --backfill) instead"
        )
    wanted = requested_features(plan, frame, features)
    done, steps = 0, 1 + 2 * len(wanted)
    description = f"reading the example log {manifest.source['topic']}"
    told(description, done, steps)
    points = request_points(frame, logged_examples(bootstrap_servers, manifest.source["topic"], None, None, client_config)[0])
    done += 1
    told(description, done, steps)
    events, read = {}, 0
    reach = {
        topic: plan.lookback_ms(r for view, references in wanted if view.topic == topic for r in references)
        for topic in {view.topic for view, _ in wanted}
    }
    for view, _ in wanted:
        span = reach[view.topic]
        since = None if span is None else int(points["requested_at_ms"].min()) - span - plan.out_of_orderness_ms
        deleted = deleted_until_ms(bootstrap_servers, client_config, view.topic)
        if deleted is not None and (since is None or deleted > since):
            needed = (
                "every event of an entity (a feature without a window, of a view without a ttl)"
                if since is None
                else (f"them since {since} ms")
            )
            raise SnapshotError(
                f"{view.topic} no longer holds events from before {deleted} ms (deleted by retention), but "
                f"{view.name}'s features at the snapshot's earliest request need {needed}: backfilled, "
                "they would be wrong"
            )
        description = f"reading {view.topic}"
        told(description, done, steps)
        if view.topic not in events:
            messages = read_topic(bootstrap_servers, view.topic, client_config, since_ms=since)
            events[view.topic], read = accepted_events(plan, view.topic, messages)[0], read + len(messages)
        done += 1
        told(description, done, steps)

    def recomputing(view: ViewPlan) -> None:
        nonlocal done
        done += 1
        told(f"recomputing {view.name} as of {len(frame):,} requests", done, steps)

    added = backfill_features(frame, points, wanted, events, defaults, on_view=recomputing)
    source = {**manifest.source, "extends": manifest.snapshot_id, "backfilled": list(features), "events": read}
    time_range = {k: v for k, v in manifest.time_range.items() if k in ("from_ms", "to_ms")}
    return write_snapshot(
        added, snapshots_root, kind=manifest.kind, source=source, time_range=time_range, label_kind=manifest.label_kind
    )
