"""Where a snapshot's examples come from: the joiner's log (``training.examples``), or a backfill from the event log.

* ``logged_examples``: the committed examples scored within a time range, with the offsets they came from.
* ``backfill_examples``: for history from before any prediction was logged, examples built point in
  time from the raw event log with the offline recompute: each labeled transaction with the features
  its user had as of that transaction (the job's semantics), and its amount as the request field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from feedback_loop.snapshots import BASE_COLUMNS
from schemas.records import LabelEvent, TrainingExample
from schemas.validation import ContractViolation, decode
from streams.feature_plan import FeaturePlan
from streams.recompute import accepted_events, recompute
from streams.topics import read_topic

#: The request field a backfilled example takes from its transaction (the demo model's ``request:amount``).
REQUEST_FIELDS = {"request:amount": "amount"}


def logged_examples(
    bootstrap_servers: str, topic: str, from_ms: int | None, to_ms: int | None, client_config: Mapping[str, str] | None = None,
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
        if (from_ms is not None and example.predicted_at_ms < from_ms) or (to_ms is not None and example.predicted_at_ms >= to_ms):
            continue
        if model_name is not None and example.model_name != model_name:
            continue
        examples.append(example)
        first, last = offsets.get(message.partition(), (message.offset(), message.offset()))
        offsets[message.partition()] = (min(first, message.offset()), max(last, message.offset()))
    source = {"topic": topic, "offsets": {str(p): list(span) for p, span in sorted(offsets.items())}}
    return examples, source | ({"model_name": model_name} if model_name is not None else {})


def backfill_examples(plan: FeaturePlan, transactions, labels, inputs: Sequence[str]) -> pd.DataFrame:
    """Examples (snapshot columns) for every labeled transaction in the event log, features recomputed point in time.

    ``transactions`` and ``labels`` are the Kafka messages of the two topics; ``inputs`` the model inputs
    (``view:feature`` or ``request:<field>``)."""
    accepted, _ = accepted_events(plan, transactions)
    outcomes = {}
    for message in labels:
        try:
            label = decode(LabelEvent, message.value() or b"")
        except ContractViolation:
            continue
        outcomes.setdefault(label.event_id, label)
    events = accepted[accepted["event_id"].isin(outcomes.keys())]
    if events.empty:
        return pd.DataFrame(columns=[*BASE_COLUMNS, *inputs])
    frame = pd.DataFrame({
        "event_id": events["event_id"].to_numpy(), "request_id": events["event_id"].to_numpy(), "model_name": "backfill",
        "model_version": "none", "score": float("nan"),
        "label": [float(outcomes[e].is_fraud) for e in events["event_id"]],
        "label_source": [outcomes[e].source for e in events["event_id"]],
        "predicted_at_ms": events["event_time_ms"].to_numpy(), "label_time_ms": [outcomes[e].label_time_ms for e in events["event_id"]],
        "defaulted": 0,
    })  # fmt: skip
    for view in plan.views:
        wanted = [name for name in inputs if name.startswith(f"{view.name}:")]
        if not wanted:
            continue
        at = pd.DataFrame({view.entity_key: events[view.entity_key].to_numpy(), "at_ms": events["event_time_ms"].to_numpy()})
        features = recompute(view, accepted, at).drop_duplicates([view.entity_key, "at_ms"])
        joined = at.merge(features, how="left", on=[view.entity_key, "at_ms"])
        for name in wanted:
            frame[name] = joined[name.split(":", 1)[1]].to_numpy()
    for name in inputs:
        if name in REQUEST_FIELDS:
            frame[name] = events[REQUEST_FIELDS[name]].to_numpy()
    return frame[[*BASE_COLUMNS, *inputs]]
