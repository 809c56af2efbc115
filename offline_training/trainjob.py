"""The Kubeflow TrainJob a retrain starts, made from the chart's template.

The chart renders one TrainJob definition twice: the TrainJob it trains on ``training.job.snapshot`` with, and (in the
retrain trigger's ConfigMap) the template here, queued with the *retrain* priority. So the trainer image, node and
process counts, GPU resources and Kueue labels have one source, the chart's values; this module adds only what a
firing decides: the name, the snapshot and the canary share. The runtime's command reads the last two from the
trainer's environment (``SNAPSHOT_ENV``, ``CANARY_ENV``; not ``LOOPLINE_*``, which name settings only).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml

from offline_training.errors import OfflineTrainingError
from offline_training.kubernetes_api import Created, KubernetesApi, Resource

TRAINJOBS = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs")
#: The trainer's environment variables the ClusterTrainingRuntime's command passes to `loopline train`.
SNAPSHOT_ENV = "TRAIN_SNAPSHOT"
CANARY_ENV = "TRAIN_CANARY_PERCENT"
#: Why the TrainJob was started (the trigger's reason), for `kubectl describe`.
REASON_ANNOTATION = "loopline/retrain-reason"
#: Who created it: the trigger, not Helm (whose label the chart's template carries).
MANAGED_BY = "loopline-retrain-trigger"
#: An object name the Trainer's JobSet and Jobs can derive theirs from: an RFC 1035 label.
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class TrainJobTemplateError(OfflineTrainingError, ValueError):
    """The TrainJob template is missing or is not a TrainJob."""


def load_template(path: Path) -> dict:
    """The TrainJob template at ``path`` (the chart's ConfigMap, mounted): read at each firing, so an upgraded
    release's template is used without restarting the trigger."""
    try:
        template = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise TrainJobTemplateError(
            f"no TrainJob template at {path}: mount the chart's retrain-trainjob ConfigMap there, "
            "or point retrain.trainjob_template at it"
        ) from None
    if not isinstance(template, dict) or template.get("kind") != "TrainJob" or "trainer" not in template.get("spec", {}):
        raise TrainJobTemplateError(f"{path} is not a TrainJob with a trainer: render it with the chart")
    return template


def trainjob_name(prefix: str, fired_ms: int) -> str:
    """The TrainJob of the firing at ``fired_ms``: one name per firing, so a retried creation finds its own."""
    name = f"{prefix}-{fired_ms}"
    if not _NAME.match(name):
        raise TrainJobTemplateError(
            f"{name!r} is not a valid TrainJob name (lowercase, ≤ 63 characters): shorten the "
            "template's metadata.name (the release's name)"
        )
    return name


def retrain_trainjob(template: dict, *, snapshot_id: str, fired_ms: int, canary_percent: float, reason: str) -> dict:
    """The TrainJob that trains on ``snapshot_id`` for the firing at ``fired_ms`` (named ``<template name>-<fired_ms>``),
    releasing the model on ``canary_percent`` % of requests when it beats prod: ``template`` with those set."""
    job = copy.deepcopy(template)
    metadata = job["metadata"]
    metadata["name"] = trainjob_name(metadata["name"], fired_ms)
    metadata.setdefault("labels", {})["app.kubernetes.io/managed-by"] = MANAGED_BY
    metadata.setdefault("annotations", {})[REASON_ANNOTATION] = reason[:1024]
    trainer = job["spec"]["trainer"]
    decided = {SNAPSHOT_ENV: snapshot_id, CANARY_ENV: f"{canary_percent:g}"}
    trainer["env"] = [e for e in trainer.get("env", []) if e["name"] not in decided] + [
        {"name": name, "value": value} for name, value in decided.items()
    ]
    return job


def start_retrain(
    api: KubernetesApi, template: dict, *, snapshot_id: str, fired_ms: int, canary_percent: float, reason: str
) -> Created:
    """Create the firing's TrainJob (``retrain_trainjob``) in the API's namespace; Kueue admits it, the Trainer runs it."""
    job = retrain_trainjob(template, snapshot_id=snapshot_id, fired_ms=fired_ms, canary_percent=canary_percent, reason=reason)
    return api.create(TRAINJOBS, job)
