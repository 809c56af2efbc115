"""The result cache (off by default): scores in Redis, keyed by a hash of the model version and its inputs.

A hit skips the batcher and the model. The key covers the model's name and version and the exact
input row, so a new model version or any changed feature misses. Redis trouble only costs the
hit: a failed or slow lookup counts as a miss, a failed store is dropped.
"""

from __future__ import annotations

import hashlib
import logging
import struct

import redis.asyncio as redis

from feature_store.redis_connection import redis_client

log = logging.getLogger(__name__)


class ResultCache:
    """Scores by (model, version, input row), each kept ``ttl_s`` seconds."""

    def __init__(self, redis_connection: str, ttl_s: float, timeout_s: float, *, redis_cluster: bool = False) -> None:
        """``redis_cluster``: the connection names a Redis Cluster's nodes (each score is one key: it lives on the
        master of its slot)."""
        self.ttl_ms = int(ttl_s * 1000)
        self._redis = redis_client(redis_connection, timeout_s, cluster=redis_cluster, asynchronous=True)

    @staticmethod
    def key(model: str, version: str, row: list[float | str]) -> str:
        """The cache key of ``row`` (numbers and texts, in the model's input order) scored by ``model`` ``version``."""
        digest = hashlib.sha256(f"{model}\0{version}\0".encode())
        for value in row:
            digest.update(struct.pack("<d", value) if isinstance(value, float) else b"\1" + value.encode() + b"\0")
        return f"loopline:score:{digest.hexdigest()}"

    async def get(self, key: str) -> float | None:
        """The cached score, or None (also when Redis fails)."""
        try:
            raw = await self._redis.get(key)
        except (redis.RedisError, OSError) as err:
            log.debug("result cache lookup failed: %r", err)
            return None
        return None if raw is None else float(raw)

    async def put(self, key: str, score: float) -> None:
        """Keep ``score`` under ``key`` for the TTL (dropped if Redis fails)."""
        try:
            await self._redis.set(key, repr(score), px=self.ttl_ms)
        except (redis.RedisError, OSError) as err:
            log.debug("result cache store failed: %r", err)

    async def close(self) -> None:
        """Close the connections."""
        await self._redis.aclose()
