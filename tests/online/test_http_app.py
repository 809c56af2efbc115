"""A probe or a scrape that reaches one of several workers answers for all of them (the HTTP app's side).

Two HTTP apps, as two workers run them, answer each other through their sibling sockets; each app is called in
process. The scorer behind each is a stand-in holding only what the probes read (readiness, metrics): scoring
itself is not what these tests test (tests/loopline/test_serve_workers.py runs real workers).
"""

from __future__ import annotations

import uuid

import httpx
import uvloop

from online.http_app import create_app
from online.metrics import ScorerMetrics
from online.worker_peers import WorkerPeers


class _Worker:
    """What the probes read of a worker's scorer."""

    def __init__(self) -> None:
        self.metrics, self.ready, self.models, self.canary_share = ScorerMetrics(), True, {}, 0.0


async def _probe(stalled: dict[int, dict[str, float]], ready: dict[int, bool], answering: int = 2) -> dict[str, httpx.Response]:
    """Worker 0's answers to the probes and a scrape, with ``answering`` of the two workers up."""
    address = f"probes-{uuid.uuid4().hex[:8]}"
    workers = [_Worker() for _ in range(2)]
    apps, peers = [], []
    for index, worker in enumerate(workers):
        worker.ready = ready[index]
        worker.metrics.requests.labels("http", "200").inc(10 * (index + 1))
        peer = WorkerPeers(address, index, 2)
        apps.append(create_app(worker, stalled_doors=lambda index=index: dict(stalled[index]), peers=peer))
        peers.append(peer)
    for index in range(answering):
        await peers[index].start(apps[index].state.peer_answers)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps[0]), base_url="http://worker-0") as client:
            return {path: await client.get(path) for path in ("/v1/models/ready", "/v1/health/live", "/metrics")}
    finally:
        for peer in peers[:answering]:
            await peer.close()


def test_ready_and_live_speak_for_every_worker_and_one_scrape_counts_both() -> None:
    healthy = uvloop.run(_probe({0: {}, 1: {}}, {0: True, 1: True}))
    assert healthy["/v1/models/ready"].status_code == 200 and healthy["/v1/health/live"].status_code == 200
    assert 'loopline_scoring_requests_total{door="http",status="200"} 30.0' in healthy["/metrics"].text

    sibling_stuck = uvloop.run(_probe({0: {}, 1: {"kafka": 75.0}}, {0: True, 1: False}))
    assert sibling_stuck["/v1/models/ready"].status_code == 503, "one worker not ready: the host is not ready"
    live = sibling_stuck["/v1/health/live"]
    assert live.status_code == 503 and live.json()["stalled_s"] == {"kafka": 75.0}, "the sibling's stalled door fails liveness"

    sibling_gone = uvloop.run(_probe({0: {}, 1: {}}, {0: True, 1: True}, answering=1))
    assert sibling_gone["/v1/models/ready"].status_code == 503, "a worker that does not answer (restarting) is not ready"
    assert sibling_gone["/v1/health/live"].status_code == 200
    assert 'loopline_scoring_requests_total{door="http",status="200"} 10.0' in sibling_gone["/metrics"].text
