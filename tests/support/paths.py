"""Where the tests find what lies outside them: the repository, the shared jar cache, the pinned CRDs, the chart's
values sets."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The jar cache is shared with `make setup`, so tests do not fetch from Maven Central again.
JARS_DIR = REPO / ".loopline" / "jars"
#: The CRDs the chart's custom resources are validated against (the shared folder beside the repository).
CRDS = REPO.parent / "shared" / "crds"
#: The chart's values sets: its small default, and production layered over it.
CHART_VALUES = {"default": ["values.yaml"], "production": ["values.yaml", "values-production.yaml"]}
