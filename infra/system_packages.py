"""Debian packages the stack runs: installed by the setup step when missing and running as root."""

from __future__ import annotations

import os
import shutil
import subprocess

from infra.errors import StackError

#: Command the stack needs -> the Debian package that provides it.
REQUIRED_COMMANDS: dict[str, str] = {
    "java": "openjdk-17-jre-headless",
    "javac": "openjdk-17-jdk-headless",
    "mvn": "maven",
    "redis-server": "redis-server",
    "redis-cli": "redis-tools",  # forms the stack's Redis Cluster
    "kcat": "kcat",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    # Hosts of their own for a cluster's nodes (network namespaces, infra/netns.py) in the Kafka cluster's test.
    "ip": "iproute2",
    # The dashboard's test runs the page in headless Chromium.
    "chromium": "chromium",
}


def missing_packages(commands: dict[str, str] = REQUIRED_COMMANDS) -> list[str]:
    """The Debian packages whose commands are not on PATH."""
    return sorted({package for command, package in commands.items() if shutil.which(command) is None})


def ensure_packages(commands: dict[str, str] = REQUIRED_COMMANDS) -> list[str]:
    """Install the missing packages with apt-get when root; else say what to install. Returns what was installed."""
    missing = missing_packages(commands)
    if not missing:
        return []
    if os.geteuid() != 0:
        raise StackError(f"missing Debian packages: {', '.join(missing)}", f"sudo apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]):
        result = subprocess.run(argv, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            last = " | ".join(result.stderr.strip().splitlines()[-2:])
            raise StackError(f"`{' '.join(argv)}` failed: {last}", f"install {' '.join(missing)} by hand")
    return missing
