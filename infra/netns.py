"""Hosts of their own on one machine: a network namespace per host, each with its own address on a bridge.

A test that needs nodes at different addresses, or a network cut between one node and the rest, makes them here
(Debian's iproute2, as root) and removes them when done. Host i's address is ``<subnet>.<10 + i>``; the root
namespace is ``<subnet>.1`` on the bridge, so the test's own clients reach every host and the hosts reach each other
through it. Cutting a host takes its bridge port down: its connections to everyone stall, as a pulled cable would.
"""

from __future__ import annotations

import random
import subprocess
import uuid
from collections.abc import Sequence


class NetworkError(RuntimeError):
    """An ``ip`` command failed (not root, no iproute2, or a name already taken)."""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()} (needs root and iproute2)")


class NetworkNamespaces:
    """``count`` hosts (network namespaces) on a bridge of a random 10.x.y.0/24 subnet; a context manager that
    removes them on exit."""

    def __init__(self, count: int) -> None:
        token = uuid.uuid4().hex[:6]
        rng = random.Random()
        self.subnet = f"10.{rng.randrange(100, 250)}.{rng.randrange(1, 250)}"
        self.bridge = f"llb{token}"
        self.names = [f"ll{token}-{i}" for i in range(count)]
        self._ports = [f"lv{token}{i}" for i in range(count)]
        self._made: list[str] = []

    @property
    def addresses(self) -> list[str]:
        """Each host's address, in order."""
        return [f"{self.subnet}.{10 + i}" for i in range(len(self.names))]

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``host``'s namespace (``ip netns exec`` execs it: the pid is the program's)."""
        return ["ip", "netns", "exec", self.names[host], *argv]

    def cut(self, host: int) -> None:
        """Cut host ``host`` off the network (its bridge port down)."""
        _ip("link", "set", self._ports[host], "down")

    def restore(self, host: int) -> None:
        """Connect host ``host`` again."""
        _ip("link", "set", self._ports[host], "up")

    def __enter__(self) -> NetworkNamespaces:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(self.bridge)
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name, port, address in zip(self.names, self._ports, self.addresses, strict=True):
                _ip("netns", "add", name)
                self._made.append(name)
                _ip("link", "add", port, "type", "veth", "peer", "name", f"{port}p")
                _ip("link", "set", f"{port}p", "netns", name)
                _ip("-n", name, "link", "set", f"{port}p", "name", "eth0")
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                _ip("-n", name, "link", "set", "lo", "up")
                _ip("link", "set", port, "master", self.bridge)
                _ip("link", "set", port, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove every namespace (and with it its end of the link) and the bridge; what is already gone is skipped."""
        for made in reversed(self._made):
            args = ("link", "del", made) if made == self.bridge else ("netns", "del", made)
            subprocess.run(["ip", *args], capture_output=True)
        self._made.clear()
