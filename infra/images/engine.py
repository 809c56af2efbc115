"""Podman as Loopline builds and runs its images with it: Debian's podman/buildah as root, configured by a
``containers.conf`` of the project's own (``CONTAINERS_CONF``), never the host's ``/etc/containers``.

What this machine needs (measured 2026-12, DESIGN.md): runtime ``runc`` (crun 1.8 refuses the cgroup v1/v2 hybrid),
ulimits inside the VM's hard limits (podman's defaults exceed them), cgroupfs and a file events log (PID 1 is not
systemd). Images live in podman's default root storage (overlay, ``/var/lib/containers/storage``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from infra.errors import StackError

#: The Debian packages behind each command the image build needs (installed by the images target when missing).
IMAGE_COMMANDS: dict[str, str] = {"podman": "podman", "buildah": "buildah", "debootstrap": "debootstrap", "runc": "runc"}

CONTAINERS_CONF = """\
# Written by Loopline (infra/images/engine.py); podman reads it through CONTAINERS_CONF.
[containers]
# podman's default ulimits exceed this VM's hard limits (nofile 20000).
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
# crun 1.8 refuses this machine's cgroup v1/v2 hybrid; PID 1 is not systemd.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


class Podman:
    """The ``podman`` command with Loopline's engine configuration at ``config_dir/containers.conf``."""

    def __init__(self, config_dir: Path) -> None:
        self.config = config_dir / "containers.conf"

    def configure(self) -> Path:
        """Write the engine configuration (unless it already says the same); return its path."""
        if not self.config.exists() or self.config.read_text() != CONTAINERS_CONF:
            self.config.parent.mkdir(parents=True, exist_ok=True)
            self.config.write_text(CONTAINERS_CONF)
        return self.config

    @property
    def environment(self) -> dict[str, str]:
        """This process's environment with podman pointed at Loopline's configuration."""
        return {**os.environ, "CONTAINERS_CONF": str(self.config)}

    def run(self, *args: str, capture: bool = True, timeout_s: float | None = None) -> subprocess.CompletedProcess:
        """``podman <args>``; StackError with the end of its output when it fails."""
        result = subprocess.run(["podman", *args], env=self.environment, capture_output=capture, text=True, timeout=timeout_s)
        if result.returncode != 0:
            tail = " | ".join(((result.stdout or "") + (result.stderr or "")).strip().splitlines()[-4:])
            raise StackError(
                f"`podman {' '.join(args[:2])} …` failed: {tail}", "read the output above; `podman info` checks the engine"
            )
        return result

    def exists(self, reference: str) -> bool:
        """Whether the image ``reference`` is in the local storage."""
        return subprocess.run(["podman", "image", "exists", reference], env=self.environment).returncode == 0

    def size_bytes(self, reference: str) -> int:
        """The image's size as podman counts it (every layer, uncompressed)."""
        return int(json.loads(self.run("image", "inspect", reference).stdout)[0]["Size"])

    def build(
        self,
        dockerfile: Path,
        context: Path,
        tag: str,
        build_args: dict[str, str],
        *,
        target: str | None = None,
        secrets: Sequence[tuple[str, Path]] = (),
    ) -> None:
        """``podman build`` of ``dockerfile`` over ``context`` as ``tag``, reusing cached layers, on the host's network
        (builds reach package indexes through it); each ``(id, file)`` of ``secrets`` is mounted for ``RUN
        --mount=type=secret`` only, never written into a layer. Its output streams to this process's."""
        args = ["build", "--layers", "--network", "host", "-f", str(dockerfile), "-t", tag]
        args += [f"--build-arg={name}={value}" for name, value in build_args.items()]
        args += [f"--secret=id={name},src={path}" for name, path in secrets]
        args += [f"--target={target}"] if target else []
        self.run(*args, str(context), capture=False)
