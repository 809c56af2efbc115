"""How models are kept in the model registry (MLflow), so training can release them and serving load them.

* One registered model per use case (a project's ``model.name``). Each version's artifact is a folder holding
  one ONNX file, ``model.onnx``, shaped as ``schemas/model_contract.py`` says.
* The version tag ``loopline.artifact_sha256`` records the SHA-256 of that file at registration.
  Serving recomputes it on the copy it downloaded and refuses to load a mismatch (the version it
  already serves keeps serving).
* Aliases: ``prod`` takes all traffic; ``canary``, when set, takes a share of it. The share is the
  registered model's tag ``loopline.canary_share`` (a fraction in [0, 1]; no tag: 0).
* A request goes to the canary when ``canary_bucket(request_id) < share``: the bucket is a hash of
  the request id, uniform in [0, 1), so a retried request meets the same model and the routing
  needs no shared state between scorers.
* Every alias change is recorded, since MLflow's aliases keep no history: the registered model's
  tag ``loopline.alias_history.<sequence>`` (zero-padded, so tags sort in order) holds one
  ``AliasChange`` as JSON: when, who or what, which alias, from which version to which, and why.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

PROD_ALIAS = "prod"
CANARY_ALIAS = "canary"
ALIASES = (PROD_ALIAS, CANARY_ALIAS)
EXPERIMENT = "loopline-models"
ARTIFACT_DIR = "model"
ARTIFACT_FILE = "model.onnx"
SHA256_TAG = "loopline.artifact_sha256"
CANARY_SHARE_TAG = "loopline.canary_share"
HISTORY_TAG_PREFIX = "loopline.alias_history."


@dataclass(frozen=True)
class AliasChange:
    """One move of an alias: at ``at_ms`` ``actor`` pointed ``alias`` from ``previous`` to ``version`` (None: unset),
    because ``reason``."""

    at_ms: int
    actor: str
    alias: str
    previous: str | None
    version: str | None
    reason: str

    def tag(self, sequence: int) -> tuple[str, str]:
        """The (tag key, value) that records this change as the ``sequence``-th."""
        return f"{HISTORY_TAG_PREFIX}{sequence:06d}", json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> list[AliasChange]:
        """The history recorded in a registered model's tags, oldest first."""
        return [cls(**json.loads(tags[key])) for key in sorted(k for k in tags if k.startswith(HISTORY_TAG_PREFIX))]


def artifact_sha256(path: Path) -> str:
    """The hex SHA-256 of a model file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def parse_canary_share(text: str | None) -> float:
    """The canary share a registered model's tag holds (0 when untagged); ValueError outside [0, 1]."""
    share = float(text) if text else 0.0
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"{CANARY_SHARE_TAG} must be a fraction in [0, 1], not {text!r}")
    return share


def canary_bucket(request_id: str) -> float:
    """Where a request id falls in [0, 1): the first 8 bytes of its SHA-256, scaled."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big") / 2**64


def routes_to_canary(request_id: str, share: float) -> bool:
    """Whether the canary scores this request when it takes ``share`` of the traffic."""
    return canary_bucket(request_id) < share
