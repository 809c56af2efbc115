"""A small stand-in for vLLM's OpenAI-compatible server, for testing the vLLM client on a CPU.

It serves the same two endpoints the client uses (``GET /v1/models``, ``POST /v1/completions``
with ``logprobs``) in the same shapes. Its "model" is a formula a test can check: the numbers in
the prompt summed, ``P(yes) = sigmoid(0.01 · sum − 1)``. It counts requests in flight (to check
the client's concurrency limit) and can be told to answer slowly (to check the budget).
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request

from infra.service import free_port, wait_until


def p_yes(prompt: str) -> float:
    """The stand-in model's probability of answering yes to ``prompt``."""
    total = sum(float(number) for number in re.findall(r"-?\d+(?:\.\d+)?", prompt))
    return 1 / (1 + math.exp(-(0.01 * total - 1)))


@dataclass
class StandIn:
    """The server's address and its knobs and counters (read and set from the test's thread)."""

    base_url: str
    served_model: str
    delay_s: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0
    completions: int = 0


def _app(state: StandIn) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": state.served_model, "object": "model", "created": 0, "owned_by": "test"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict:
        body = await request.json()
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            await asyncio.sleep(state.delay_s)
        finally:
            state.in_flight -= 1
        state.completions += 1
        yes = p_yes(body["prompt"])
        top = {" yes": math.log(yes), " no": math.log(1 - yes)}
        return {
            "id": f"cmpl-{state.completions}",
            "object": "text_completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "text": " yes" if yes >= 0.5 else " no",
                    "finish_reason": "length",
                    "logprobs": {
                        "tokens": [max(top, key=top.get)],
                        "token_logprobs": [max(top.values())],
                        "top_logprobs": [top],
                        "text_offset": [0],
                    },
                }
            ],
            "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
        }

    return app


@contextmanager
def openai_standin(served_model: str = "standin") -> Iterator[StandIn]:
    """The stand-in server on a free port, in a thread, for the duration of the block."""
    port = free_port()
    state = StandIn(f"http://127.0.0.1:{port}/v1", served_model)
    server = uvicorn.Server(uvicorn.Config(_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        assert wait_until(lambda: server.started, 20, 0.02), "the stand-in did not start"
        yield state
    finally:
        server.should_exit = True
        thread.join(10)
