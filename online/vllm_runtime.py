"""vLLM as a model runtime: an LLM behind vLLM's OpenAI-compatible server, scored through its async client.

vLLM pins its own torch and cannot share Loopline's environment, so it runs as a server of its own
(``infra/vllm/``) and this runtime is a client. The server batches continuously, so requests are
not batched here: each one is a completion call, at most ``max_concurrency`` of them in flight.
A request beyond ``max_queue_size`` waiting for a slot is refused with ``Overloaded``, and so is
one the server does not answer within ``timeout_s`` — the same contract as the dynamic batcher.

The score of a request is the model's probability of answering ``yes`` rather than ``no`` to a
prompt built from the request's inputs: ``P(yes) / (P(yes) + P(no))`` from the log-probabilities
of the first generated token (every spelling of each answer among the top tokens counts).
"""

from __future__ import annotations

import asyncio
import math
import time

from online.batcher import BatchTiming
from online.errors import Overloaded
from schemas.model_contract import ModelInput

#: How many top tokens the server reports: the answer tokens must be among them (vLLM's default cap).
TOP_LOGPROBS = 20


class VllmModel:
    """``served_model`` on the vLLM server at ``base_url`` (``http://host:port/v1``), as one model version.

    ``prompt`` is a ``str.format`` template over the input values by position (``{0}``, ``{1:.2f}``, …)
    in the order of ``inputs`` (names as in ``schemas/model_contract.py``).
    """

    provider = "vllm"

    def __init__(
        self,
        base_url: str,
        served_model: str,
        name: str,
        version: str,
        inputs: list[ModelInput],
        prompt: str,
        answers: tuple[str, str] = ("yes", "no"),
        max_concurrency: int = 32,
        max_queue_size: int = 1024,
        timeout_s: float = 1.0,
    ) -> None:
        from openai import AsyncOpenAI

        self.name, self.version, self.served_model = name, version, served_model
        self.inputs, self.prompt, self.answers = inputs, prompt, answers
        self.max_queue_size, self.timeout_s = max_queue_size, timeout_s
        # Retries would break the budget; a refused request is the caller's to retry.
        self._client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=timeout_s)
        self._slots = asyncio.Semaphore(max_concurrency)
        self._waiting = 0
        self.warm = False

    async def warm_up(self) -> None:
        """Check the server serves the model and answer one prompt; raises if it cannot."""
        served = [model.id async for model in self._client.models.list()]
        if self.served_model not in served:
            raise LookupError(f"the vLLM server serves {served}, not {self.served_model}")
        await self.infer([0.0 if spec.kind == "number" else "" for spec in self.inputs])
        self.warm = True

    def _score(self, top_logprobs: dict[str, float]) -> float:
        # Tokenizers spell a word several ways (" yes", "yes", "Yes"): all count for it.
        yes, no = (
            sum(math.exp(lp) for token, lp in top_logprobs.items() if token.strip().lower() == answer.strip().lower())
            for answer in self.answers
        )
        if yes + no == 0.0:
            raise ValueError(f"neither of {self.answers} is among the model's top {TOP_LOGPROBS} first tokens")
        return yes / (yes + no)

    async def infer(self, row: list[float | str]) -> tuple[float, BatchTiming]:
        """The score for one input row, and how long it waited for a slot and for the server."""
        if self._waiting >= self.max_queue_size:
            raise Overloaded(f"vLLM queue full ({self.max_queue_size} waiting); retry later")
        queued = time.perf_counter()
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        started = time.perf_counter()
        try:
            completion = await asyncio.wait_for(
                self._client.completions.create(
                    model=self.served_model,
                    prompt=self.prompt.format(*row),
                    max_tokens=1,
                    temperature=0.0,
                    logprobs=TOP_LOGPROBS,
                ),
                self.timeout_s,
            )
        except TimeoutError as err:
            raise Overloaded(f"vLLM did not answer within {self.timeout_s * 1000:.0f} ms; retry later") from err
        finally:
            self._slots.release()
        score = self._score(completion.choices[0].logprobs.top_logprobs[0])
        return score, BatchTiming(started - queued, time.perf_counter() - started, 1)

    async def close(self) -> None:
        """Close the client's connections."""
        await self._client.close()
