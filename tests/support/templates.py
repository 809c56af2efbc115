"""The templates' projects as the tests take them: each loaded from where Loopline ships it (read only), its event
record types, topics and synthetic world. A test that runs a project on the stack works on the session's copy of it
(the project of ``tests/conftest.py``'s ``settings``), made with ``loopline init``."""

from __future__ import annotations

import sys
import time

from loopline.project import template_path, world_class, world_of
from schemas.project import load_project
from streams.feature_plan import FeaturePlan, SourcePlan, ViewPlan

FRAUD = load_project(template_path("fraud"))
DELIVERY = load_project(template_path("delivery"))
#: The fraud transactions' event time field.
EVENT_TIME = "event_time_ms"
TRANSACTIONS, LABELS = (FRAUD.topics[i] for i in range(2))
TransactionEvent = FRAUD.contract(TRANSACTIONS.name).record_type
LabelEvent = FRAUD.contract(LABELS.name).record_type
FraudWorld = world_class(FRAUD)
#: The fraud world's users: ``u000000`` is the busiest.
synthetic_user_id = sys.modules[FraudWorld.__module__].synthetic_user_id


def fraud_world(seed: int = 7, start_ms: int | None = None, **options):
    """The fraud template's world from ``start_ms`` (default: now); ``options``: ``WorldConfig``'s fields and the
    world's own knobs (``users``, ``merchants``, ...) by name."""
    return world_of(FRAUD, seed, int(time.time() * 1000) if start_ms is None else start_ms, **options)


def view_plan(
    name: str,
    aggregations,
    *,
    keys: tuple[str, ...] = ("user_id",),
    topic: str = TRANSACTIONS.name,
    time_field: str = EVENT_TIME,
    out_of_orderness_ms: int = 0,
) -> ViewPlan:
    """A view's plan made by hand (for the recompute and the consistency check), over ``topic``'s events."""
    return ViewPlan(name, topic, keys, time_field, out_of_orderness_ms, tuple(aggregations), None)


def fraud_plan(*views: ViewPlan, topic: str = TRANSACTIONS.name, out_of_orderness_ms: int = 0) -> FeaturePlan:
    """A plan of hand-made ``views`` reading the fraud project's transactions from ``topic``."""
    source = SourcePlan(topic, FRAUD.contract(TRANSACTIONS.name), "json", EVENT_TIME, out_of_orderness_ms)
    return FeaturePlan((source,), views)
