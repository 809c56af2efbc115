"""The vLLM runtime: the scorer's async OpenAI client, against a local stand-in on the CPU, against vLLM on a GPU.

The stand-in (``tests/support/openai_standin.py``) serves the same API vLLM does; the GPU test starts the
real server (``infra/vllm/serve.sh``) on the tiny model ``infra/vllm/setup.sh`` builds.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from infra.service import free_port, wait_until
from loopline.serving import build_scorer, llm_model, serve_when_warm
from loopline.settings import Settings
from online.settings import LlmSettings
from online.vllm_runtime import VllmModel
from tests.support.openai_standin import openai_standin, p_yes
from tests.support.paths import REPO
from tests.support.scoring import score_request, serving_doors

VIEW = "user_transaction_features"
INPUTS = [f"{VIEW}:txn_count_5m", "request:amount"]
PROMPT = "{0:.0f} transactions in 5 minutes, now {1:.2f}. Fraud? Answer:"
USER = "llm-nobody"  # unknown: its feature takes the declared default
VLLM_ENV, VLLM_MODEL = REPO / ".loopline" / "vllm-env", REPO / ".loopline" / "vllm-model"


def _llm_settings(settings: Settings, base_url: str, served_model: str, **llm) -> Settings:
    config = LlmSettings(base_url=base_url, served_model=served_model, inputs=INPUTS, prompt=PROMPT, **llm)
    return settings.model_copy(update={"serving": settings.serving.model_copy(update={"llm": config, "model_version": "tiny-1"})})


def test_llm_scores_through_the_scorer_within_its_concurrency_limit(applied: Settings) -> None:
    with openai_standin() as standin:
        standin.delay_s = 0.05
        settings = _llm_settings(applied, standin.base_url, standin.served_model, max_concurrency=4)
        scorer = build_scorer(settings)
        with serving_doors(settings, scorer, functools.partial(serve_when_warm, scorer, llm_model(settings))) as (url, _):
            assert wait_until(lambda: requests.get(f"{url}/v1/models/ready", timeout=5).ok, 20, 0.05)
            status = requests.get(f"{url}/v1/models/status", timeout=5).json()["models"]["prod"]
            assert (status["provider"], status["version"]) == ("vllm", "tiny-1")
            amounts = [round(3.7 * i, 2) for i in range(40)]
            with ThreadPoolExecutor(20) as pool:
                replies = list(
                    pool.map(lambda a: requests.post(f"{url}/v1/score", json=score_request(USER, a), timeout=10), amounts)
                )
    assert [r.status_code for r in replies] == [200] * len(amounts)
    for amount, reply in zip(amounts, replies, strict=True):
        body = reply.json()
        assert body["features"] == {f"{VIEW}:txn_count_5m": 0, "request:amount": amount}
        assert body["score"] == pytest.approx(p_yes(PROMPT.format(0, amount)), rel=1e-9)
        assert body["stage_latency_ms"]["inference"] >= 50
    assert standin.max_in_flight == 4, "the client keeps at most max_concurrency completions in flight, and uses them"


def test_llm_over_its_budget_is_refused_fast_then_recovers(applied: Settings) -> None:
    with openai_standin() as standin:
        settings = _llm_settings(applied, standin.base_url, standin.served_model, timeout_ms=200)
        scorer = build_scorer(settings)
        with serving_doors(settings, scorer, functools.partial(serve_when_warm, scorer, llm_model(settings))) as (url, _):
            assert wait_until(lambda: requests.get(f"{url}/v1/models/ready", timeout=5).ok, 20, 0.05)
            standin.delay_s = 2.0
            began = time.perf_counter()
            slow = requests.post(f"{url}/v1/score", json=score_request(USER, 10.0), timeout=10)
            took_s = time.perf_counter() - began
            assert slow.status_code == 503 and "200 ms" in slow.json()["reason"]
            assert took_s < 0.2 + 0.3
            standin.delay_s = 0.0
            assert requests.post(f"{url}/v1/score", json=score_request(USER, 10.0), timeout=10).status_code == 200


def _gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _gpu(), reason="needs a GPU: vLLM serves on CUDA (the client is tested against the stand-in above)")
@pytest.mark.skipif(not (VLLM_ENV / "bin" / "vllm").exists(), reason="needs the vLLM environment: run infra/vllm/setup.sh")
def test_real_vllm_serves_the_tiny_model(tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "vllm.log").open("w")
    server = subprocess.Popen(
        [str(REPO / "infra" / "vllm" / "serve.sh"), str(port), "loopline-tiny"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    async def score() -> list[float]:
        model = VllmModel(
            f"http://127.0.0.1:{port}/v1",
            "loopline-tiny",
            "tiny",
            "1",
            INPUTS,
            "{0:.0f} {1:.2f} ?",
            max_concurrency=8,
            timeout_s=5.0,
        )
        try:
            await model.warm_up()
            return [score for score, _ in await asyncio.gather(*(model.infer([i, 2.5 * i]) for i in range(32)))]
        finally:
            await model.close()

    def up() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).ok
        except requests.ConnectionError:
            return server.poll() is not None

    try:
        assert wait_until(up, 300, 1.0) and server.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
        scores = asyncio.run(score())
        assert len(scores) == 32 and all(0.0 <= s <= 1.0 for s in scores)
        assert asyncio.run(score()) == pytest.approx(scores), "greedy scoring is deterministic"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
