"""The pinned ``helm`` that renders and lints Loopline's chart: taken from PATH when it is that release, else built
once from the Go module proxy (no other download is reachable here) and cached.

Measured on this machine's 2 cores (shared with other test runs), empty Go caches: 74–135 s, downloads included, with
or without ``-trimpath -ldflags='-s -w'`` (the load, not the flags, made the spread); the stripped binary is 62 MB. With
Go's build cache warm, a rebuild is seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from infra.errors import StackError

HELM_VERSION = "v3.22.0"
_MODULE = "helm.sh/helm/v3/cmd/helm"


def _version(helm: str | Path) -> str:
    """What ``helm version --short`` says (``v3.22.0+g…``; a build from the module proxy says ``v3.22``), or "" if it
    does not run."""
    try:
        return subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return ""


def _is_pinned(helm: str | Path) -> bool:
    """Whether ``helm`` is the pinned release's minor version (its patch releases render alike)."""
    minor = HELM_VERSION.rsplit(".", 1)[0]
    version = _version(helm)
    return version == minor or version.startswith(f"{minor}.")


def cached_helm(tools_dir: Path) -> Path:
    """Where the built helm is kept under ``tools_dir``."""
    return tools_dir / f"helm-{HELM_VERSION}"


def helm_binary(tools_dir: Path) -> Path:
    """The pinned helm: cached under ``tools_dir``, or on PATH, or else built there now (a minute or two) with Go."""
    cached = cached_helm(tools_dir)
    if cached.is_file():
        return cached
    on_path = shutil.which("helm")
    if on_path and _is_pinned(on_path):
        return Path(on_path)
    go = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if os.access(p, os.X_OK)), None)
    if go is None:
        raise StackError(
            f"no helm {HELM_VERSION} on PATH and no Go to build it", "install Go (https://go.dev/dl/) or put helm v3.22 on PATH"
        )
    tools_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tools_dir) as gobin:
        # -trimpath and a stripped binary: nothing of this machine's paths in it, and a shorter link.
        result = subprocess.run(
            [go, "install", "-trimpath", "-ldflags=-s -w", f"{_MODULE}@{HELM_VERSION}"],
            env={**os.environ, "GOBIN": gobin, "CGO_ENABLED": "0"},
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise StackError(
                f"building helm {HELM_VERSION} failed: {result.stderr.strip()[-1000:]}",
                "check that the Go module proxy (GOPROXY) is reachable",
            )
        (Path(gobin) / "helm").rename(cached)
    return cached
