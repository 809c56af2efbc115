"""The scorer's worker processes answering for each other (``loopline serve --workers N``).

N workers share one HTTP port (SO_REUSEPORT), so a probe or a scrape lands on any one of them and must speak for
all: ``/metrics`` combines every worker's metrics, ``/v1/models/ready`` is 200 only while every worker is ready,
``/v1/health/live`` names a stalled door of any worker. Each worker answers its siblings on a Unix socket of its
own in Linux's abstract namespace (no file to leave behind when a worker is killed): a one-line question
(``metrics``, ``ready``, ``stalled``) and the answer until the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Awaitable, Callable

#: How long a sibling may take to answer before it is counted as not answering (a scrape waits for the slowest).
_ANSWER_TIMEOUT_S = 2.0
_QUESTIONS = ("metrics", "ready", "stalled")


class WorkerPeers:
    """Worker ``index`` of the ``count`` that serve ``address`` (their shared host:port), answering its siblings
    and asking them."""

    def __init__(self, address: str, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ValueError(f"worker {index} of {count}: the index runs from 0 to {count - 1}")
        self.address, self.index, self.count = address, index, count
        self._server: asyncio.AbstractServer | None = None

    def _socket(self, index: int) -> str:
        return f"\0loopline-scorer-{self.address}-worker-{index}"

    async def start(self, answers: dict[str, Callable[[], Awaitable[bytes]]]) -> None:
        """Answer the siblings' questions with ``answers[question]()`` from now on (until ``close``)."""
        missing = set(_QUESTIONS) - set(answers)
        if missing:
            raise ValueError(f"no answer to {sorted(missing)}")

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                question = (await asyncio.wait_for(reader.readline(), _ANSWER_TIMEOUT_S)).decode().strip()
                if question in answers:
                    writer.write(await answers[question]())
                    await writer.drain()
            except (TimeoutError, ConnectionError, UnicodeDecodeError):
                pass  # a sibling that gave up asking; it counts this worker as not answering
            finally:
                writer.close()

        self._server = await asyncio.start_unix_server(answer, path=self._socket(self.index))

    async def close(self) -> None:
        """Stop answering."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _ask(self, index: int, question: str) -> bytes | None:
        """Sibling ``index``'s answer to ``question``; None when it does not answer (not started yet, restarting)."""
        # Connected by hand: uvloop's open_unix_connection refuses an abstract address (EINVAL), its sock_connect does not.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, self._socket(index)), _ANSWER_TIMEOUT_S)
            reader, writer = await asyncio.open_unix_connection(sock=sock)
        except (TimeoutError, OSError):
            sock.close()
            return None
        try:
            writer.write(question.encode() + b"\n")
            await writer.drain()
            return await asyncio.wait_for(reader.read(), _ANSWER_TIMEOUT_S)
        except (TimeoutError, OSError):
            return None
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def ask_siblings(self, question: str) -> list[bytes | None]:
        """Every other worker's answer to ``question`` (None for one that does not answer), asked at once."""
        siblings = [i for i in range(self.count) if i != self.index]
        return list(await asyncio.gather(*(self._ask(i, question) for i in siblings)))


def encode_stalled(stalled: dict[str, float]) -> bytes:
    """A worker's stalled doors as its answer to ``stalled``."""
    return json.dumps(stalled).encode()


def decode_stalled(answers: list[bytes | None]) -> dict[str, float]:
    """The siblings' stalled doors, each door's longest stall (siblings that did not answer are not stalled)."""
    merged: dict[str, float] = {}
    for answer in answers:
        if answer:
            for door, seconds in json.loads(answer).items():
                merged[door] = max(seconds, merged.get(door, 0.0))
    return merged
