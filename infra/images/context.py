"""The build context of Loopline's images, staged under one folder from what the machine already has: Loopline's
wheel (built here, byte for byte the same while the sources are), the pinned requirement sets, the jars the stack's
setup fetched or compiled, Flink's distribution as PyFlink installed it, and the Loopline project the images serve
(its contracts, Feast repo and model declarations: every process of a deployment acts on it). Nothing is downloaded.

Every file is staged with the content and mode it had last time when its source is unchanged, so podman's layer cache
(keyed by the content a COPY adds) rebuilds only what changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from infra.errors import StackError

IMAGES_DIR = Path(__file__).resolve().parent
#: What the wheel is built from is everything in the repository but these: the tests, builds, and hidden files (the
#: local state, caches, and editors' and other tools' temporary files, which can vanish while the sources are copied).
_NOT_PACKAGED = (".*", "tests", "benchmarks", "__pycache__", "*.egg-info", "build", "dist", "*.tmp")
#: What a project's folder holds that is not the project: its Feast repo's local data (registry, offline rows) and caches.
_NOT_IN_PROJECT = ("data", "__pycache__", ".*")
#: Flink's distribution as the official image lays it out under /opt/flink (PyFlink installs these folders; its log/
#: holds the logs of runs here, so the image makes its own).
FLINK_DIST_PARTS = ("bin", "conf", "lib", "licenses", "opt", "plugins")
#: Zip entries' time in a reproducible wheel (zip cannot store times before 1980).
_SOURCE_DATE_EPOCH = "315532800"


def build_wheel(repo: Path, out_dir: Path) -> Path:
    """Loopline's wheel from the sources in ``repo``, into ``out_dir`` (emptied first): built from a copy of the
    sources (a stale ``build/`` could add deleted modules) with fixed entry times, so the same sources give the same
    bytes."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as work:
        source = Path(work) / "src"
        shutil.copytree(repo, source, ignore=shutil.ignore_patterns(*_NOT_PACKAGED), symlinks=True)
        result = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out_dir), str(source)],
            capture_output=True,
            text=True,
            env={**os.environ, "SOURCE_DATE_EPOCH": _SOURCE_DATE_EPOCH},
        )
    wheels = sorted(out_dir.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise StackError(f"building Loopline's wheel failed: {result.stderr.strip()[-500:]}", "fix the packaging error above")
    return wheels[0]


def stage_context(
    context: Path, *, repo: Path, flink_home: Path, jars: Sequence[Path], requirements: Mapping[str, Sequence[str]], project: Path
) -> Path:
    """Fill ``context`` for the Dockerfiles of ``infra/images``: ``wheel/``, ``requirements/<set>.txt`` (one pinned
    requirement a line), ``jars/``, ``flink-dist/`` (linked, not copied, from ``flink_home``), ``project/`` (the
    project's folder, without the data and caches its use here left in it), the Flink base's entry point and the
    images' requirements installer (``pip-install.sh``). Returns ``context``."""
    build_wheel(repo, context / "wheel")
    shutil.rmtree(context / "project", ignore_errors=True)
    shutil.copytree(project, context / "project", ignore=shutil.ignore_patterns(*_NOT_IN_PROJECT))
    listed = context / "requirements"
    shutil.rmtree(listed, ignore_errors=True)
    listed.mkdir(parents=True)
    for name, pinned in requirements.items():
        (listed / f"{name}.txt").write_text("".join(f"{line}\n" for line in pinned))
    _link_tree({jar.name: jar for jar in jars}, context / "jars")
    _link_tree({part: flink_home / part for part in FLINK_DIST_PARTS}, context / "flink-dist")
    for script in ("docker-entrypoint.sh", "pip-install.sh"):
        shutil.copy2(IMAGES_DIR / script, context / script)
    return context


def _link_tree(sources: Mapping[str, Path], target: Path) -> None:
    """``target/<name>`` for each source file or folder, as hard links (the context is on the same disk as the jar cache
    and the venv: no copy, and the same content and mode as the source)."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name, source in sources.items():
        if not source.exists():
            raise StackError(f"{source} is missing from the images' build context", "run `loopline stack setup` (make setup)")
        if source.is_dir():
            shutil.copytree(source, target / name, copy_function=os.link)
        else:
            os.link(source, target / name)
