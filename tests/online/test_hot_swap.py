"""Models from the MLflow registry (SQLite + local artifacts): hot swap under load, canary routing, tampered artifacts.

Two logistic regressions with different weights are registered as versions of one model; every
response's score is checked against the formula of the version the response names, so a request
scored by one model but labelled with another would fail the test.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from infra.service import wait_until
from loopline.components import model_release
from loopline.serving import build_scorer, model_watcher
from loopline.settings import Settings
from offline_training.onnx_models import write_linear_model
from offline_training.release import ModelRelease
from schemas.model_registry import PROD_ALIAS, routes_to_canary
from tests.support.linear_models import INPUTS, USER, WEIGHTS, expected_score
from tests.support.scoring import score_request, serving_doors


@pytest.fixture(scope="module")
def registered(applied: Settings, tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, ModelRelease, dict[str, Path]]:
    """Serving settings polling a fresh registered model every 0.1 s; its release handle; the two model files."""
    folder = tmp_path_factory.mktemp("models")
    files = {kind: write_linear_model(folder / f"{kind}.onnx", INPUTS, *WEIGHTS[kind]) for kind in WEIGHTS}
    serving = applied.serving.model_copy(update={"model_name": f"fraud-{uuid.uuid4().hex[:8]}", "model_registry_poll_s": 0.1})
    settings = applied.model_copy(update={"serving": serving})
    return settings, model_release(settings), files


def _metric(url: str, name: str, labels: str = "") -> float:
    text = requests.get(f"{url}/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _serving_version(url: str) -> str | None:
    prod = requests.get(f"{url}/v1/models/status", timeout=5).json()["models"].get(PROD_ALIAS)
    return prod and prod["version"]


def test_hot_swap_under_load_fails_nothing_and_switches_once(registered) -> None:
    settings, release, files = registered
    name = settings.serving.model_name
    versions = {release.register(name, files["a"]): "a", release.register(name, files["b"]): "b"}
    v1, v2 = versions
    release.set_alias(name, PROD_ALIAS, v1)
    scorer = build_scorer(settings)
    with serving_doors(settings, scorer, model_watcher(settings, scorer).run) as (url, _):
        assert wait_until(lambda: requests.get(f"{url}/v1/models/ready", timeout=5).ok, 30, 0.05), "v1 never got ready"
        stop, swapped_at = threading.Event(), []
        results: list[list[tuple[int, str | None, float, float]]] = [[] for _ in range(4)]

        def load(out: list) -> None:
            with requests.Session() as session:
                while not stop.is_set():
                    amount = float(len(out) % 500)
                    response = session.post(f"{url}/v1/score", json=score_request(USER, amount), timeout=10)
                    body = response.json()
                    out.append((response.status_code, body.get("model_version"), body.get("score"), amount))

        workers = [threading.Thread(target=load, args=(out,)) for out in results]
        for worker in workers:
            worker.start()
        try:
            assert wait_until(lambda: min(map(len, results)) >= 50, 30, 0.02), "the load never got going"
            release.set_alias(name, PROD_ALIAS, v2)
            assert wait_until(lambda: _serving_version(url) == v2, 30, 0.05), "v2 was never swapped in"
            swapped_at.append(sum(map(len, results)))
            assert wait_until(lambda: sum(map(len, results)) >= swapped_at[0] + 400, 30, 0.02)
        finally:
            stop.set()
            for worker in workers:
                worker.join(15)
        swaps = _metric(url, "loopline_scoring_model_swaps_total", f'{{alias="{PROD_ALIAS}"}}')

    responses = [r for out in results for r in out]
    assert [r for r in responses if r[0] != 200] == [], "no request fails during the swap"
    for _, version, score, amount in responses:
        assert score == pytest.approx(expected_score(versions[version], amount), rel=1e-5), f"scored by v{version}'s model"
    for out in results:  # each client sees v1, then v2 for good: one switch, no flapping
        seen = [version for _, version, _, _ in out]
        switch = seen.index(v2)
        assert set(seen[:switch]) == {v1} and set(seen[switch:]) == {v2}
    assert swaps == 1


def test_canary_takes_its_share_by_request_id_and_ends(registered) -> None:
    settings, release, files = registered
    name = settings.serving.model_name
    prod, canary = release.register(name, files["a"]), release.register(name, files["b"])
    release.set_alias(name, PROD_ALIAS, prod)
    release.start_canary(name, canary, 0.3)
    scorer = build_scorer(settings)
    with serving_doors(settings, scorer, model_watcher(settings, scorer).run) as (url, _):

        def both_serving() -> bool:
            status = requests.get(f"{url}/v1/models/status", timeout=5).json()
            return {a: m["version"] for a, m in status["models"].items()} == {"prod": prod, "canary": canary}

        assert wait_until(both_serving, 30, 0.05), "prod and canary never both served"
        with requests.Session() as session:
            sent = [score_request(USER, float(i % 300)) for i in range(300)]
            replies = [session.post(f"{url}/v1/score", json=request, timeout=5).json() for request in sent]
        for request, reply in zip(sent, replies, strict=True):
            routed = canary if routes_to_canary(request["request_id"], 0.3) else prod
            assert reply["model_version"] == routed
            kind = "b" if routed == canary else "a"
            assert reply["score"] == pytest.approx(expected_score(kind, request["request_fields"]["amount"]), rel=1e-5)
        assert 0.2 < sum(r["model_version"] == canary for r in replies) / len(replies) < 0.4

        release.end_canary(name)
        assert wait_until(lambda: "canary" not in requests.get(f"{url}/v1/models/status", timeout=5).json()["models"], 30, 0.05)
        again = [requests.post(f"{url}/v1/score", json=request, timeout=5).json() for request in sent[:50]]
        assert {reply["model_version"] for reply in again} == {prod}


def test_tampered_or_unloadable_versions_are_refused_and_the_old_one_keeps_serving(registered) -> None:
    settings, release, files = registered
    name = settings.serving.model_name
    good, tampered = release.register(name, files["a"]), release.register(name, files["a"])
    source = release.client.get_model_version(name, tampered).source
    artifact = Path(source.removeprefix("file://")) / "model.onnx"
    artifact.write_bytes(files["b"].read_bytes())  # a valid model, but not the one registered
    release.set_alias(name, PROD_ALIAS, good)
    scorer = build_scorer(settings)
    with serving_doors(settings, scorer, model_watcher(settings, scorer).run) as (url, _):
        assert wait_until(lambda: _serving_version(url) == good, 30, 0.05)
        release.set_alias(name, PROD_ALIAS, tampered)
        refused = 'loopline_scoring_model_refusals_total{reason="artifact"}'
        assert wait_until(lambda: _metric(url, refused) == 1, 30, 0.05), "the tampered version was not refused"
        time.sleep(0.5)  # several more polls: refused once, not retried, not swapped in
        assert _metric(url, refused) == 1
        assert _serving_version(url) == good
        garbage = files["a"].with_name("not-a-model.onnx")
        garbage.write_bytes(b"not an ONNX graph")
        release.set_alias(name, PROD_ALIAS, release.register(name, garbage))  # registered as is: its sha256 matches
        invalid = 'loopline_scoring_model_refusals_total{reason="invalid_model"}'
        assert wait_until(lambda: _metric(url, invalid) == 1, 30, 0.05), "an unloadable version was not refused"
        assert _serving_version(url) == good
        reply = requests.post(f"{url}/v1/score", json=score_request(USER, 42.0), timeout=5).json()
        assert reply["model_version"] == good and reply["score"] == pytest.approx(expected_score("a", 42.0), rel=1e-5)
