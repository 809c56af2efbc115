"""Workers answering for each other: the combined exposition and the sibling sockets (no stack needed)."""

from __future__ import annotations

import asyncio
import uuid

import uvloop
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from online.metrics import ScorerMetrics
from online.metrics_merge import merge_expositions
from online.worker_peers import WorkerPeers, decode_stalled, encode_stalled


def _samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
    }


def test_counts_add_up_created_is_the_earliest_and_info_stays_one() -> None:
    workers = [ScorerMetrics(), ScorerMetrics()]
    for n, metrics in enumerate(workers):
        metrics.requests.labels("http", "200").inc(3 + n)
        metrics.stage_seconds.labels("total").observe(0.001 * (n + 1))
        metrics.queue_depth.set(2)
        metrics.model.labels("prod").info({"name": "fraud", "version": str(n + 1), "provider": "cpu"})
    workers[1].requests.labels("http", "503").inc()
    texts = [generate_latest(m.collector_registry) for m in workers]
    own = [_samples(text) for text in texts]
    merged = _samples(merge_expositions(text.decode() for text in texts))

    ok = ("loopline_scoring_requests_total", (("door", "http"), ("status", "200")))
    assert merged[ok] == 7.0
    assert merged[("loopline_scoring_requests_total", (("door", "http"), ("status", "503")))] == 1.0
    created = ("loopline_scoring_requests_created", ok[1])
    assert merged[created] == min(o[created] for o in own)
    assert merged[("loopline_scoring_stage_seconds_count", (("stage", "total"),))] == 2.0
    assert merged[("loopline_scoring_stage_seconds_bucket", (("le", "0.001"), ("stage", "total")))] == 1.0
    assert merged[("loopline_scoring_queue_depth", ())] == 4.0
    infos = {k: v for k, v in merged.items() if k[0] == "loopline_scoring_model_info"}
    assert sorted(dict(k[1])["version"] for k in infos) == ["1", "2"] and set(infos.values()) == {1.0}, "mid-swap: both, once"
    assert set(merged) == set(own[0]) | set(own[1]), "every name and label set kept"


def test_siblings_answer_and_a_missing_one_is_none() -> None:
    address = f"test-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[list, list, list]:
        peers = [WorkerPeers(address, i, 3) for i in range(3)]
        for i, peer in enumerate(peers[:2]):  # worker 2 never starts

            async def metrics(i=i) -> bytes:
                return f"metrics of {i}".encode()

            async def ready(i=i) -> bytes:
                return b"1"

            async def stalled(i=i) -> bytes:
                return encode_stalled({"kafka": 61.0 + i})

            await peer.start({"metrics": metrics, "ready": ready, "stalled": stalled})
        try:
            return (
                await peers[0].ask_siblings("metrics"),
                await peers[1].ask_siblings("ready"),
                await peers[2].ask_siblings("stalled"),
            )
        finally:
            for peer in peers:
                await peer.close()

    for run in (asyncio.run, uvloop.run):  # the scorer's loop is uvloop's
        metrics, ready, stalled = run(scenario())
        assert metrics == [b"metrics of 1", None]
        assert ready == [b"1", None]
        assert decode_stalled(stalled) == {"kafka": 62.0}
