"""One look of the retrain trigger: what the model registry says of the served model, its labeled examples over the
window and the alerts firing, judged by ``decide`` (``feedback_loop/retrain_trigger.py``); and the firing recorded on
the registered model, so the cooldown survives a restarted watcher and every watcher of the registry sees it.

The registry is MLflow's client; the examples and the alerts are read by functions the caller passes in (Prometheus
sits in ``infra/``, which this package does not import)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from feedback_loop.retrain_trigger import FiringAlert, QualityFunction, TriggerDecision, TriggerPolicy, decide
from schemas.model_registry import CANARY_ALIAS, PROD_ALIAS
from schemas.records import TrainingExample

if TYPE_CHECKING:
    from mlflow import MlflowClient

#: Who the retrain trigger is in the alias history.
TRIGGER_ACTOR = "retrain-trigger"
#: The registered model's tag holding when the trigger last fired (epoch ms).
LAST_FIRED_TAG = "loopline.retrain_trigger.last_fired_ms"


class AlertsUnread(RuntimeError):
    """The alerts could not be read (the message says why): the look goes on, judging quality alone."""


def firing_alerts(alerts: Iterable[dict], names: Collection[str]) -> list[FiringAlert]:
    """The alerts among ``alerts`` (Prometheus' ``/api/v1/alerts`` entries) that fire now and are named in ``names``."""
    return [
        FiringAlert(a["labels"]["alertname"], a["labels"], a.get("activeAt", ""))
        for a in alerts
        if a.get("state") == "firing" and a["labels"].get("alertname") in names
    ]


def check_trigger(
    policy: TriggerPolicy,
    registry: MlflowClient,
    model_name: str,
    *,
    examples: Callable[[int, str], Sequence[TrainingExample]] | None,
    quality: QualityFunction | None,
    alerts: Callable[[], list[FiringAlert]] | None,
    now_ms: int | None = None,
) -> TriggerDecision:
    """The trigger's verdict now on ``model_name`` in ``registry``: its aliases and when the trigger last fired, the
    examples ``examples(since_ms, model_name)`` gives over the policy's window (None: quality is not judged, and
    ``quality`` is None too) and the alerts ``alerts()`` gives (None: alerts are not looked at). Alerts that cannot be
    read (``AlertsUnread``) are said in the reason; quality is still judged."""
    from mlflow.exceptions import MlflowException

    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    try:
        model = registry.get_registered_model(model_name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return TriggerDecision(False, f"{model_name} is not registered: nothing to judge")
    aliases = {alias: str(version) for alias, version in model.aliases.items()}
    fired = model.tags.get(LAST_FIRED_TAG)
    window = [] if examples is None else examples(now_ms - int(policy.window_s * 1000), model.name)
    firing: list[FiringAlert] | None = None
    unread = ""
    if alerts is not None:
        try:
            firing = alerts()
        except AlertsUnread as err:
            unread = f"; alerts not read: {err}"
    decision = decide(
        policy,
        window,
        model_name=model.name,
        prod_version=aliases.get(PROD_ALIAS),
        canary_version=aliases.get(CANARY_ALIAS),
        now_ms=now_ms,
        last_fired_ms=int(fired) if fired else None,
        quality=quality,
        alerts=firing,
    )
    return replace(decision, reason=decision.reason + unread)


def record_firing(registry: MlflowClient, model_name: str, fired_ms: int) -> None:
    """Record on the registered model that the trigger fired at ``fired_ms``: its cooldown runs from there."""
    registry.set_registered_model_tag(model_name, LAST_FIRED_TAG, str(fired_ms))
