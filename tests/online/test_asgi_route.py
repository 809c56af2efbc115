"""The bare ASGI score route (``online/asgi_route.py``): its method, path and body limits, a client that goes away,
and every other request passed to the app behind it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
from fastapi import FastAPI

from online.asgi_route import RouteInFront
from online.errors import PayloadTooLarge

LIMIT = 100


def _route() -> tuple[RouteInFront, list[bytes]]:
    """The route, and the bodies it answered: each is recorded by the handler's call-when-sent, so only once its
    answer went out."""
    api = FastAPI()
    api.state.marker = "behind"
    bodies: list[bytes] = []

    @api.get("/other")
    def other() -> dict:
        return {"served_by": "app"}

    async def handler(headers: dict[bytes, bytes], body) -> tuple[int, bytes, Callable[[], None] | None]:
        try:
            payload = await body(LIMIT)
        except PayloadTooLarge as err:
            return 413, str(err).encode(), None
        return 200, b'{"echo":"%s","auth":"%s"}' % (payload, headers.get(b"authorization", b"-")), lambda: bodies.append(payload)

    return RouteInFront(api, "POST", "/v1/score", handler), bodies


def _call(app: RouteInFront, method: str, path: str, **request) -> httpx.Response:
    async def call() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://scorer") as client:
            return await client.request(method, path, **request)

    return asyncio.run(call())


def _streamed(*chunks: bytes):
    async def stream():
        for chunk in chunks:
            yield chunk

    return stream()


def test_the_route_answers_its_method_and_passes_every_other_request_on() -> None:
    app, bodies = _route()
    scored = _call(app, "POST", "/v1/score", content=b"abc", headers={"Authorization": "Bearer t"})
    assert (scored.status_code, scored.json()) == (200, {"echo": "abc", "auth": "Bearer t"})
    assert scored.headers["content-type"] == "application/json" and scored.headers["content-length"] == str(len(scored.content))
    wrong_method = _call(app, "GET", "/v1/score")
    assert (wrong_method.status_code, wrong_method.headers["allow"]) == (405, "POST")
    other = _call(app, "GET", "/other")
    assert (other.status_code, other.json()) == (200, {"served_by": "app"})
    assert _call(app, "GET", "/missing").status_code == 404
    assert app.state.marker == "behind" and bodies == [b"abc"]


def test_a_body_over_the_limit_is_refused_declared_or_streamed() -> None:
    app, bodies = _route()
    declared = _call(app, "POST", "/v1/score", content=b"x" * (LIMIT + 1))
    assert declared.status_code == 413 and f"{LIMIT + 1:,} bytes" in declared.text

    streamed = _call(app, "POST", "/v1/score", content=_streamed(b"x" * 60, b"x" * 60))
    assert streamed.status_code == 413 and f"more than {LIMIT:,} bytes" in streamed.text
    exact = _call(app, "POST", "/v1/score", content=_streamed(b"y" * 50, b"y" * 50))
    assert exact.status_code == 200 and bodies == [b"y" * LIMIT]


def test_a_client_gone_before_its_body_gets_no_answer() -> None:
    app, bodies = _route()
    sent: list[dict] = []
    messages = iter([{"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.disconnect"}])

    async def receive() -> dict:
        return next(messages)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/score", "headers": []}
    asyncio.run(app(scope, receive, send))
    assert sent == [] and bodies == []
