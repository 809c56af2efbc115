"""The environment an image of the catalog gives its processes: the ``ENV`` of its Dockerfile's stage and of the
stages (and the base made here) it is built from, read from the Dockerfiles themselves, so that what runs an image's
command elsewhere (``infra/chart_rehearsal.py``) sees the image's ``PATH``, ``VIRTUAL_ENV``, ``LOOPLINE_HOME``…
without a copy of them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from infra.images.catalog import catalog

IMAGES_DIR = Path(__file__).resolve().parent
#: The Dockerfile of each base that `make images` builds here when no registry serves the public one
#: (``loopline/images.py``); the official ``flink`` image sets the same FLINK_HOME and PATH.
BASE_DOCKERFILES = {"flink": "flink-base.Dockerfile"}
#: The PATH of an image that sets none (the OCI runtimes' default).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(instruction, rest) per instruction, continuation lines joined, comments left out."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#"))
    )
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined.splitlines() if line.strip()]


def _stage_env(dockerfile: Path, target: str | None) -> tuple[list[str], str]:
    """The ``ENV`` assignments (``NAME=value``, in order) of ``target`` (default: the last stage) and its parent
    stages, and the image the first of them starts ``FROM``."""
    stages: dict[str, tuple[str, list[str]]] = {}
    name = ""
    for instruction, rest in _instructions(dockerfile):
        if instruction == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else f"#{len(stages)}"
            stages[name] = (parts[0], [])
        elif instruction == "ENV":
            stages[name][1].extend(shlex.split(rest))
    stage = target or name
    assignments: list[str] = []
    while True:
        parent, env = stages[stage]
        assignments = env + assignments
        if parent not in stages:
            return assignments, parent
        stage = parent


def image_environment(reference: str) -> dict[str, str]:
    """The environment the catalog's image ``reference`` (``name:tag``) sets, ``$NAME`` references expanded."""
    image = next((i for i in catalog().values() if i.reference == reference), None)
    if image is None:
        raise KeyError(f"{reference} is not an image of the catalog (python -m infra.images.catalog lists them)")
    assignments = _stage_env(IMAGES_DIR / image.dockerfile, image.target)[0]
    if image.base in BASE_DOCKERFILES:
        assignments = _stage_env(IMAGES_DIR / BASE_DOCKERFILES[image.base], None)[0] + assignments
    env = {"PATH": DEFAULT_PATH}
    for assignment in assignments:
        key, _, value = assignment.partition("=")
        env[key] = _VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)
    return env
