"""Loopline's Helm chart (``infra/helm/loopline``) rendered offline: ``helm template`` and ``helm lint`` for a values
file plus ``--set`` overrides, the objects parsed. The tests validate what ``render`` returns, and a deployment's
commands can be run from it. The caller names the helm to run (``infra.helm_tool.helm_binary`` of its tools folder):
where the tools live is a setting, which only ``loopline/`` reads."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from infra.errors import StackError

CHART = Path(__file__).resolve().parent / "helm" / "loopline"
RELEASE = "loopline"
#: The Kubernetes version charts are rendered for (a helm built by `go install` would assume v1.20 otherwise).
KUBE_VERSION = "1.35.0"


def _arguments(values_files: Sequence[Path | str], overrides: Mapping[str, object]) -> list[str]:
    """helm's ``--values`` for each file (relative ones are the chart's) and ``--set`` for each override."""
    files = [str(f if Path(f).is_absolute() else CHART / f) for f in values_files]
    return [*(a for f in files for a in ("--values", f)), *(a for k, v in overrides.items() for a in ("--set", f"{k}={v}"))]


def _helm(arguments: list[str], helm: Path) -> str:
    """Run ``helm`` and return its output; StackError with its message when it fails."""
    result = subprocess.run([str(helm), *arguments], capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(
            f"`helm {arguments[0]}` failed: {result.stderr.strip() or result.stdout.strip()}",
            "fix the chart or the values it names",
        )
    return result.stdout


def render(
    values_files: Sequence[Path | str] = ("values.yaml",),
    overrides: Mapping[str, object] | None = None,
    *,
    helm: Path,
    namespace: str = "loopline",
) -> list[dict]:
    """Every object the chart renders (hooks included) for ``values_files`` (in order; relative to the chart) and
    ``overrides`` (``--set key=value``), parsed, by ``helm``."""
    text = _helm(
        [
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            KUBE_VERSION,
            *_arguments(values_files, overrides or {}),
        ],
        helm,
    )
    return [doc for doc in yaml.safe_load_all(text) if doc]


def lint(
    values_files: Sequence[Path | str] = ("values.yaml",), overrides: Mapping[str, object] | None = None, *, helm: Path
) -> str:
    """``helm lint --strict`` of the chart with these values by ``helm``: its report (StackError when it finds a fault)."""
    return _helm(
        ["lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), *_arguments(values_files, overrides or {})], helm
    )
