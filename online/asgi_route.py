"""One route served on the bare ASGI interface, in front of an ASGI app that serves every other path.

The score route is the scorer's hot path. Starlette's and FastAPI's per-request layers (error pages,
telemetry, body limits, exception handlers, routing, the Request and Response objects) cost more CPU
than the route's own work, and the route needs none of them: it reads its body with its own limit and
answers every error itself. ``RouteInFront`` passes every other request to the app untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from online.errors import PayloadTooLarge

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: A route's handler: the request's headers (names lower-case, as ASGI gives them) and a reader of its
#: body (at most a limit of bytes), to the status and JSON body of the answer, and what to call once it is sent
#: (or None).
Handler = Callable[
    [dict[bytes, bytes], Callable[[int], Awaitable[bytes]]], Awaitable[tuple[int, bytes, Callable[[], None] | None]]
]

_JSON = (b"content-type", b"application/json")
#: The seconds a client refused with 503 waits before retrying (a client library's backoff may add to it).
_RETRY_AFTER = [(b"retry-after", b"1")]


class ClientDisconnected(Exception):
    """The client went away before its request's body was in: there is nobody to answer."""


class RouteInFront:
    """``handler`` answers ``method path``; ``app`` answers every other request. Other methods on ``path``
    get 405 naming the allowed one, as a router would answer."""

    def __init__(self, app: ASGIApp, method: str, path: str, handler: Handler) -> None:
        self.app, self.method, self.path, self.handler = app, method, path, handler

    @property
    def state(self) -> Any:
        """The app's state (``app.state``), as if this were the app."""
        return self.app.state  # type: ignore[attr-defined]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        if scope["method"] != self.method:
            await answer(send, 405, b'{"detail":"Method Not Allowed"}', [(b"allow", self.method.encode())])
            return
        headers = dict(scope["headers"])
        try:
            status, body, answered = await self.handler(headers, lambda limit: read_body(receive, headers, limit))
        except ClientDisconnected:
            return
        # Every 503 of the route is "retry later" (overloaded, not ready, the log unavailable): say when, as HTTP does.
        await answer(send, status, body, _RETRY_AFTER if status == 503 else None)
        if answered is not None:
            answered()


async def read_body(receive: Receive, headers: dict[bytes, bytes], limit: int) -> bytes:
    """The request's body, read no further than ``limit`` bytes (PayloadTooLarge beyond, before reading a body
    whose declared length, in ``headers``, is over it)."""
    declared = headers.get(b"content-length", b"")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request of {int(declared):,} bytes; the limit is {limit:,}")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request of more than {limit:,} bytes; the limit is {limit:,}")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send a JSON answer: its status, length and body in two ASGI messages."""
    start = [_JSON, (b"content-length", str(len(body)).encode()), *(headers or ())]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})
