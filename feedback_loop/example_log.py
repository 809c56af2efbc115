"""Where a snapshot's examples come from: the joiner's log (``training.examples``), or a backfill from the event log.

* ``logged_examples``: the committed examples scored within a time range, with the offsets they came from.
* ``backfill_examples``: for history from before any prediction was logged, examples built point in
  time from the raw event log with the offline recompute: each labeled scored event (the project's ``scored_event``:
  a transaction, an order) with the features its entities had as of that event (the job's semantics), and its
  request fields taken from the event's own fields as the project maps them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from feedback_loop.snapshots import BASE_COLUMNS
from schemas.project import Project
from schemas.records import TrainingExample
from schemas.validation import ContractViolation, decode
from streams.feature_plan import FeaturePlan
from streams.recompute import accepted_events, recompute
from streams.topics import read_topic


def logged_examples(
    bootstrap_servers: str,
    topic: str,
    from_ms: int | None,
    to_ms: int | None,
    client_config: Mapping[str, str] | None = None,
    model_name: str | None = None,
) -> tuple[list[TrainingExample], dict[str, Any]]:
    """The examples on ``topic`` scored in ``[from_ms, to_ms)`` (read_committed), of ``model_name`` when given, and their
    source: the topic and, per partition, the first and last offset read. An example is written after it was scored,
    so its Kafka timestamp is at or after its prediction time: reading starts at ``from_ms`` by timestamp."""
    messages = read_topic(bootstrap_servers, topic, client_config, since_ms=from_ms)
    examples, offsets = [], {}
    for message in messages:
        try:
            example = decode(TrainingExample, message.value() or b"")
        except ContractViolation:
            continue  # the joiner writes only valid examples; anything else on the topic is not ours to train on
        if (from_ms is not None and example.predicted_at_ms < from_ms) or (
            to_ms is not None and example.predicted_at_ms >= to_ms
        ):
            continue
        if model_name is not None and example.model_name != model_name:
            continue
        examples.append(example)
        first, last = offsets.get(message.partition(), (message.offset(), message.offset()))
        offsets[message.partition()] = (min(first, message.offset()), max(last, message.offset()))
    source = {"topic": topic, "offsets": {str(p): list(span) for p, span in sorted(offsets.items())}}
    return examples, source | ({"model_name": model_name} if model_name is not None else {})


def backfill_examples(
    plan: FeaturePlan,
    project: Project,
    events: Mapping[str, Sequence],
    labels: Sequence,
    inputs: Sequence[str],
    scored_topic: str | None = None,
) -> pd.DataFrame:
    """Examples (snapshot columns) for every labeled scored event in the event log, features recomputed point in time.

    ``events``: the Kafka messages of each topic the plan reads; ``labels``: those of the label topic; ``inputs``: the
    model inputs (``view:feature`` or ``request:<field>``). A scored event is one of ``project.spec.scored_event``'s
    topic (read from ``scored_topic`` when the plan reads it elsewhere); its id names it in the labels
    (``labels.joins_on``); each view's entity is taken from the scored event's fields of the same names, its features as
    of the scored event's time."""
    scored, plan_labels = project.spec.scored_event, project.labels
    scored_topic = scored_topic or scored.topic
    accepted = {topic: accepted_events(plan, topic, messages)[0] for topic, messages in events.items()}
    time_field = plan.source(scored_topic).time_field
    outcomes = {}
    for message in labels:
        try:
            label = plan_labels.contract.decode(message.value() or b"", plan_labels.wire)
        except ContractViolation:
            continue
        outcomes.setdefault(getattr(label, plan_labels.joins_on), label)
    happened = accepted[scored_topic]
    happened = happened[happened[scored.id].isin(outcomes.keys())]
    if happened.empty:
        return pd.DataFrame(columns=[*BASE_COLUMNS, *inputs])
    known = [outcomes[event_id] for event_id in happened[scored.id]]
    source, label_time = plan_labels.source_field, plan_labels.time_field
    frame = pd.DataFrame(
        {
            "event_id": happened[scored.id].to_numpy(),
            "request_id": happened[scored.id].to_numpy(),
            "model_name": "backfill",
            "model_version": "none",
            "score": float("nan"),
            "label": [float(getattr(label, plan_labels.value)) for label in known],
            "label_source": [None if source is None else str(getattr(label, source)) for label in known],
            "predicted_at_ms": happened[time_field].to_numpy(),
            "label_time_ms": [None if label_time is None else getattr(label, label_time) for label in known],
            "defaulted": 0,
        }
    )
    for view in plan.views:
        wanted = [name for name in inputs if name.startswith(f"{view.name}:")]
        if not wanted:
            continue
        missing = [key for key in view.entity_keys if key not in happened.columns]
        if missing:
            raise ValueError(
                f"{view.name}'s entity ({', '.join(missing)}) is not among the fields of the scored events "
                f"({scored_topic}): its features cannot be backfilled as of each of them"
            )
        at = view.with_entity(
            pd.DataFrame(
                {**{key: happened[key].to_numpy() for key in view.entity_keys}, "at_ms": happened[time_field].to_numpy()}
            )
        )
        features = recompute(view, accepted[view.topic], at).drop_duplicates([view.entity_key, "at_ms"])
        joined = at.merge(features, how="left", on=[view.entity_key, "at_ms"])
        for name in wanted:
            frame[name] = joined[name.split(":", 1)[1]].to_numpy()
    for name in inputs:
        field = scored.request_fields.get(name.removeprefix("request:")) if name.startswith("request:") else None
        if field is not None:
            frame[name] = happened[field].to_numpy()
    return frame[[*BASE_COLUMNS, *inputs]]
