"""One Redis connection string for Feast and for Loopline's own Redis clients.

The string is Feast's (``host:port[,host:port...][,password=...][,ssl=true][,db=0]``, see Feast's Redis online
store), so the password and TLS settings that reach Feast's writes reach the fast read path and the result cache
too. On a Redis Cluster (Feast's ``redis_type: redis_cluster``) the client is redis-py's cluster client, started from
the nodes listed: it routes each key to the master of its slot, and its pipelines send one batch per node.
"""

from __future__ import annotations

import redis
import redis.asyncio


def redis_client(connection: str, timeout_s: float | None = None, *, cluster: bool = False, asynchronous: bool = False):
    """A redis-py client for ``connection``: ``redis.Redis`` on its first node, or with ``cluster`` a
    ``RedisCluster`` on all of them (``asynchronous``: the ``redis.asyncio`` ones). ``timeout_s`` bounds connecting
    and each reply, on every node."""
    from feast.infra.online_stores.redis import RedisOnlineStore

    nodes, params = RedisOnlineStore._parse_connection_string(connection)
    library = redis.asyncio if asynchronous else redis
    params |= {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if cluster:
        startup = [library.cluster.ClusterNode(node["host"], int(node["port"])) for node in nodes]
        return library.RedisCluster(startup_nodes=startup, **params)
    return library.Redis(host=nodes[0]["host"], port=int(nodes[0]["port"]), **params)
