"""One Redis connection string for Feast and for Loopline's own Redis clients.

The string is Feast's (``host:port[,password=...][,ssl=true][,db=0]``, see Feast's Redis online
store), so the password and TLS settings that reach Feast's writes reach the fast read path and
the result cache too.
"""

from __future__ import annotations

import redis


def redis_client(connection: str, timeout_s: float | None = None, client: type = redis.Redis):
    """A redis-py client (``client``: ``redis.Redis`` or ``redis.asyncio.Redis``) for ``connection``;
    ``timeout_s`` bounds connecting and each reply."""
    from feast.infra.online_stores.redis import RedisOnlineStore

    nodes, params = RedisOnlineStore._parse_connection_string(connection)
    return client(
        host=nodes[0]["host"], port=int(nodes[0]["port"]), socket_timeout=timeout_s, socket_connect_timeout=timeout_s, **params
    )
