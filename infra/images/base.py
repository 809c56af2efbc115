"""A Debian base image made here from Debian's own packages, for machines that reach no container registry:
``debootstrap --variant=minbase`` into a folder, then ``tar | podman import``.

It stands in for ``python:3.11-slim-bookworm``: bookworm's ``python3`` is 3.11, with ``venv``. Its tag is a digest of
its inputs (suite, mirror, packages), so a change of any makes a new base and an unchanged one is never rebuilt.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from infra.errors import StackError
from infra.images.engine import Podman

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
#: Bookworm's python3: the requirement sets are pinned for it (their markers evaluated for this version).
PYTHON_FULL_VERSION = "3.11.2"
#: What the Python images need beyond minbase (the slim image's set): Python 3.11 with venv, the CA store.
PACKAGES = ("python3", "python3-venv", "ca-certificates")


def base_tag(suite: str = SUITE, mirror: str = MIRROR, packages: tuple[str, ...] = PACKAGES) -> str:
    """``loopline-base:<suite>-<digest of the inputs>``."""
    digest = hashlib.sha256("\n".join([suite, mirror, *packages]).encode()).hexdigest()[:12]
    return f"loopline-base:{suite}-{digest}"


def ensure_base(
    podman: Podman, work_dir: Path, suite: str = SUITE, mirror: str = MIRROR, packages: tuple[str, ...] = PACKAGES
) -> tuple[str, float | None]:
    """The base image's tag, made unless it exists, and the seconds making it took (None when it existed)."""
    tag = base_tag(suite, mirror, packages)
    if podman.exists(tag):
        return tag, None
    started = time.monotonic()
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir) as work:
        root = Path(work) / "rootfs"
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(root), mirror]
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            tail = " | ".join(result.stdout.strip().splitlines()[-3:])
            raise StackError(f"debootstrap of {suite} failed: {tail}", f"check access to {mirror} and retry")
        # The package cache and lists are build leftovers (the slim images ship without them too).
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(root / leftover, ignore_errors=True)
            (root / leftover).mkdir(parents=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["podman", "import", "--change", "CMD=/bin/bash", "-", tag],
            stdin=tar.stdout,
            env=podman.environment,
            capture_output=True,
            text=True,
        )
        tar.wait()
        if tar.returncode != 0 or imported.returncode != 0:
            raise StackError(
                f"podman import of the {suite} base failed: {imported.stderr.strip()[-300:]}", "`podman info` checks the engine"
            )
    return tag, time.monotonic() - started
