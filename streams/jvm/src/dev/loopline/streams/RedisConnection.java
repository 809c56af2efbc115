package dev.loopline.streams;

import java.io.Serializable;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.RedisClusterClient;
import redis.clients.jedis.UnifiedJedis;

/**
 * Where the online store is, as Feast's connection string names it (Python parses it with Feast and hands the parts
 * over as JSON, {@code OnlineWriter.jvm_connection}): its nodes, whether they form a Redis Cluster, and the client's
 * credentials, TLS, database and reply timeout. The JVM writers ({@link OnlineRowSink}, {@link ProgressSink}) connect
 * with it.
 */
final class RedisConnection implements Serializable {
    private static final long serialVersionUID = 1L;
    List<String> nodes;
    boolean cluster;
    String username;
    String password;
    boolean ssl;
    int db;
    int timeoutMs;

    void check() {
        if (nodes == null || nodes.isEmpty()) {
            throw new IllegalArgumentException("at least one Redis node is needed");
        }
    }

    /** A client of the store: of the whole cluster, or (as Feast's) of the first node. */
    UnifiedJedis connect() {
        DefaultJedisClientConfig config = DefaultJedisClientConfig.builder().user(username).password(password).ssl(ssl).database(db)
                .timeoutMillis(timeoutMs).build();
        if (cluster) {
            Set<HostAndPort> all = new HashSet<>();
            for (String node : nodes) {
                all.add(HostAndPort.from(node));
            }
            return RedisClusterClient.builder().nodes(all).clientConfig(config).build();
        }
        return RedisClient.builder().hostAndPort(HostAndPort.from(nodes.get(0))).clientConfig(config).build();
    }
}
