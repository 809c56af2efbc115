"""Which snapshot each registered version of a model was trained on (the ``loopline.snapshot_id`` tag its
registration set): what the skew monitor measures against, and what the dashboard lists."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from offline_training.candidate import SNAPSHOT_TAG
from schemas.model_registry import PROD_ALIAS

if TYPE_CHECKING:
    from offline_training.release import ModelRelease


def prod_training_snapshot(release: ModelRelease, name: str) -> tuple[str | None, str | None]:
    """The version ``name``'s prod alias names and the snapshot it was trained on; None for what there is not."""
    version = release.aliases(name).get(PROD_ALIAS)
    if version is None:
        return None, None
    return version, release.client.get_model_version(name, version).tags.get(SNAPSHOT_TAG)


def model_versions(release: ModelRelease, name: str, newest: int = 20) -> dict:
    """The ``newest`` registered versions of ``name``, newest first: aliases, training snapshot, registration time."""
    aliases = release.aliases(name)
    versions = sorted(release.client.search_model_versions(f"name='{name}'"), key=lambda v: -int(v.version))
    return {
        "name": name,
        "versions": [
            {
                "version": str(v.version),
                "aliases": sorted(alias for alias, version in aliases.items() if version == str(v.version)),
                "snapshot_id": v.tags.get(SNAPSHOT_TAG),
                "created": time.strftime("%Y-%m-%d %H:%M", time.gmtime(v.creation_timestamp / 1000)),
            }
            for v in versions[:newest]
        ],
    }
