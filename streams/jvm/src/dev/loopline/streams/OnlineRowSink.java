package dev.loopline.streams;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.flink.api.common.eventtime.Watermark;
import org.apache.flink.api.common.operators.ProcessingTimeService;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.metrics.Counter;
import org.apache.flink.types.Row;

import com.google.gson.Gson;

import redis.clients.jedis.Connection;
import redis.clients.jedis.ConnectionPool;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.RedisClusterClient;
import redis.clients.jedis.Response;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.exceptions.JedisMovedDataException;
import redis.clients.jedis.exceptions.JedisNoScriptException;
import redis.clients.jedis.util.JedisClusterCRC16;
import redis.clients.jedis.util.SafeEncoder;

/**
 * Writes a view's online rows ({@code SlidingWindows}' side output: the entity's join keys' values, version, latest,
 * events, the absorbed log positions, each window's steps, each feature) into Redis in the layout of Feast's Redis online
 * store, under the namespace of the view's generation, with the identity of its plan, exactly as
 * {@code feature_store/online_write.py} does: the same compare-and-set script (handed over with the layout, so there
 * is one copy of it), one per row, the rows of a batch pipelined in one round trip per node (each master's, on a Redis
 * Cluster), each node's pipeline ending, where {@code replicaAcks} asks for it, in {@code WAIT}: a batch counts as
 * written only once that many replicas of each node acknowledged it (Redis replicates asynchronously; a row only the
 * master held is gone after its failover). Since {@link SinkWriter#flush} sends the batch before each checkpoint, a
 * checkpoint completes only once every row it covers is on a replica; a batch they did not acknowledge in time fails
 * the write, and the job restarts from its last checkpoint.
 * Python computes the layout from Feast itself ({@code OnlineWriter.jvm_layout}: the entity key's bytes around the
 * join keys' values, the hashed fields, each feature's Value kind); this class only puts bytes together.
 *
 * <p>A batch keeps an entity's newest row (by latest event time, then events absorbed) and goes when it holds
 * {@code maxBatchRows} entities, before every checkpoint ({@link SinkWriter#flush}: every row before a checkpoint is
 * in Redis when the checkpoint completes), at each read mark ({@link #MARK_EVERY_MS}: the windows send their rows in
 * bursts, every pending entity's as a mark passes, ahead of it), and otherwise on a timer a millisecond after its first
 * row, so a burst goes in one round trip and waits for nothing more. Behind a mark every row before it is in Redis: a
 * subtask records the mark where the layout names a place ({@code marksKey}), and the progress the job publishes is
 * of these ({@link ProgressSink}). A write Redis
 * refuses, or a Redis that does not answer, fails the job, which restarts from its last checkpoint and writes the rows
 * again; the compare-and-set makes that harmless.
 */
public final class OnlineRowSink implements Sink<Row> {
    private static final long serialVersionUID = 1L;
    /** How far apart (in read marks' ms) the marks a subtask records are: the progress moves in steps this fine. */
    private static final long MARK_EVERY_MS = 200;

    private final String layoutJson;

    /** ``layoutJson``: the {@link Layout}, as {@code OnlineWriter.jvm_layout} writes it. */
    public OnlineRowSink(String layoutJson) {
        this.layoutJson = layoutJson;
        new Gson().fromJson(layoutJson, Layout.class).check();
    }

    @Override
    public SinkWriter<Row> createWriter(WriterInitContext context) {
        return new Writer(new Gson().fromJson(layoutJson, Layout.class), context.getProcessingTimeService(),
                context.metricGroup().counter("feature_rows_written"), context.getTaskInfo().getIndexOfThisSubtask(),
                context.getTaskInfo().getNumberOfParallelSubtasks());
    }

    /** Where and how a view's rows go: the connection, the entity's key and the hash fields (bytes in base64). */
    static final class Layout {
        RedisConnection connection;
        /** The bytes of the entity's key around its join keys' values (Feast orders them by join key name): before the
         * first, between each two, after the last (base64); and which of the row's key values comes at each place. */
        List<String> keyParts;
        List<Integer> keyOrder;
        String timestampField;
        String orderField;
        /** The field of the row's absorbed log positions. */
        String absorbedField;
        /** The field of the plan identity the rows are computed under, and that identity. */
        String planField;
        String plan;
        /** Per feature, in the row's order: its field, and its Value kind (int64, int32, double, float, string, bool). */
        List<String> featureFields;
        List<String> featureKinds;
        /** Per window, in the row's order: the field of its steps. */
        List<String> stepsFields;
        long ttlSeconds;
        String script;
        int maxBatchRows;
        /** Replicas of each node a batch must reach, and how long it waits for them (ms). */
        int replicaAcks;
        long replicaAckTimeoutMs;
        /** Where each subtask records the read marks its rows reached Redis behind: a hash, and its fields' prefix (the
         * subtask's index follows); null for none. */
        String marksKey;
        String marksField;

        void check() {
            Set<String> kinds = Set.of("int64", "int32", "double", "float", "string", "bool");
            for (String kind : featureKinds) {
                if (!kinds.contains(kind)) {
                    throw new IllegalArgumentException("feature kind " + kind + " is not written by the JVM writer: " + kinds);
                }
            }
            if (replicaAcks < 0 || (replicaAcks > 0 && replicaAckTimeoutMs <= 0)) {
                throw new IllegalArgumentException("replicaAcks must be 0 or more, with a positive replicaAckTimeoutMs");
            }
            if (featureFields.size() != featureKinds.size() || keyParts.size() != keyOrder.size() + 1) {
                throw new IllegalArgumentException("a feature field per kind and a key part around each key value are needed");
            }
            connection.check();
        }
    }

    private static final class Writer implements SinkWriter<Row> {
        private final ProcessingTimeService time;
        private final Counter written;
        private final UnifiedJedis redis;
        private final byte[] script;
        private final byte[] scriptSha;
        private final byte[][] keyParts;
        private final int[] keyOrder;
        /** Where version, latest and events are in a row (after the key values), and the steps after them. */
        private final int head;
        private final byte[] timestampField;
        private final byte[] orderField;
        private final byte[] absorbedField;
        private final byte[] planField;
        private final byte[] plan;
        private final byte[][] featureFields;
        private final String[] featureKinds;
        private final byte[][] stepsFields;
        private final byte[] ttl;
        private final int maxBatchRows;
        private final int replicaAcks;
        private final long replicaAckTimeoutMs;
        /** On a Redis Cluster: each slot's master ("host:port"), as last looked up; null where not looked up yet. */
        private final String[] slotNodes;
        /** The batch: each entity's newest row, by its Redis key. */
        private final Map<ByteBuffer, Row> newest = new HashMap<>();
        private boolean flushScheduled;
        private final byte[] marksKey;
        private final byte[] marksField;
        private final int subtasks;
        /** The newest read mark recorded in Redis. */
        private long markRecorded = Long.MIN_VALUE;

        Writer(Layout layout, ProcessingTimeService time, Counter written, int subtask, int subtasks) {
            Base64.Decoder base64 = Base64.getDecoder();
            this.time = time;
            this.written = written;
            this.redis = layout.connection.connect();
            this.script = layout.script.getBytes(StandardCharsets.UTF_8);
            this.scriptSha = SafeEncoder.encode(sha1Hex(script));
            this.keyParts = layout.keyParts.stream().map(base64::decode).toArray(byte[][]::new);
            this.keyOrder = layout.keyOrder.stream().mapToInt(Integer::intValue).toArray();
            this.head = keyOrder.length;
            this.timestampField = base64.decode(layout.timestampField);
            this.orderField = base64.decode(layout.orderField);
            this.absorbedField = base64.decode(layout.absorbedField);
            this.planField = base64.decode(layout.planField);
            this.plan = layout.plan.getBytes(StandardCharsets.US_ASCII);
            this.featureFields = layout.featureFields.stream().map(base64::decode).toArray(byte[][]::new);
            this.featureKinds = layout.featureKinds.toArray(String[]::new);
            this.stepsFields = layout.stepsFields.stream().map(base64::decode).toArray(byte[][]::new);
            this.ttl = ascii(layout.ttlSeconds);
            this.maxBatchRows = layout.maxBatchRows;
            this.replicaAcks = layout.replicaAcks;
            this.replicaAckTimeoutMs = layout.replicaAckTimeoutMs;
            this.slotNodes = redis instanceof RedisClusterClient ? new String[16384] : null;
            this.marksKey = layout.marksKey == null ? null : layout.marksKey.getBytes(StandardCharsets.UTF_8);
            this.marksField = layout.marksField == null ? null : (layout.marksField + subtask).getBytes(StandardCharsets.UTF_8);
            this.subtasks = subtasks;
        }

        @Override
        public void write(Row row, Context context) throws IOException {
            ByteBuffer entity = ByteBuffer.wrap(key(row));
            Row held = newest.get(entity);
            if (held == null || order(row, held) > 0) {
                // Rows are reused by the operators upstream (object reuse): keep a copy.
                newest.put(entity, Row.copy(row));
            }
            if (newest.size() >= maxBatchRows) {
                send();
            } else if (!flushScheduled) {
                flushScheduled = true;
                time.registerTimer(time.getCurrentProcessingTime() + 1, at -> {
                    flushScheduled = false;
                    send();
                });
            }
        }

        @Override
        public void flush(boolean endOfInput) throws IOException {
            send();
        }

        /** A read mark ({@code ReadMarks}): the rows of every event read before it came before it, so once the batch
         * is written they are all in Redis; recorded (at most every {@link #MARK_EVERY_MS} of marks) for the progress
         * publisher. */
        @Override
        public void writeWatermark(Watermark mark) throws IOException {
            send();
            if (marksKey != null && (markRecorded == Long.MIN_VALUE || mark.getTimestamp() - markRecorded >= MARK_EVERY_MS)) {
                try {
                    redis.hset(marksKey, marksField, ascii(mark.getTimestamp() + ":" + subtasks));
                } catch (RuntimeException e) {
                    throw new IOException("recording the rows' read mark in Redis failed: " + e.getMessage(), e);
                }
                markRecorded = mark.getTimestamp();
            }
        }

        @Override
        public void close() {
            redis.close();
        }

        /** Which of two rows of an entity the store keeps: the later latest event, then the more events. */
        private int order(Row a, Row b) {
            int byTime = Long.compare((Long) a.getField(head + 1), (Long) b.getField(head + 1));
            return byTime != 0 ? byTime : Long.compare((Long) a.getField(head + 2), (Long) b.getField(head + 2));
        }

        /** Write the batch: one compare-and-set per entity, pipelined per node, each node's acknowledged by its replicas
         * where asked; again with the script's text on a node that has not cached it (restarted or new), and again
         * whole after a slot moved (a failover), which the compare-and-set makes safe. */
        private void send() throws IOException {
            if (newest.isEmpty()) {
                return;
            }
            try {
                sendByNode();
            } catch (JedisMovedDataException moved) {
                ((RedisClusterClient) redis).refreshClusterTopology();
                java.util.Arrays.fill(slotNodes, null);
                sendByNode();
            }
            written.inc(newest.size());
            newest.clear();
        }

        private void sendByNode() throws IOException {
            Map<String, List<List<byte[]>>> byNode = new HashMap<>();
            for (Map.Entry<ByteBuffer, Row> e : newest.entrySet()) {
                byte[] key = e.getKey().array();
                byNode.computeIfAbsent(node(key), n -> new ArrayList<>()).add(arguments(key, e.getValue()));
            }
            for (Map.Entry<String, List<List<byte[]>>> e : byNode.entrySet()) {
                if (!pipelined(e.getKey(), e.getValue(), true)) {
                    pipelined(e.getKey(), e.getValue(), false);
                }
            }
        }

        /** The master ("host:port") holding ``key`` on a Redis Cluster; "" for a single server. */
        private String node(byte[] key) {
            if (slotNodes == null) {
                return "";
            }
            int slot = JedisClusterCRC16.getSlot(key);
            if (slotNodes[slot] == null) {
                try (Connection connection = ((RedisClusterClient) redis).getConnectionFromSlot(slot)) {
                    slotNodes[slot] = connection.getHostAndPort().toString();
                }
            }
            return slotNodes[slot];
        }

        private Connection connection(String node) {
            if (slotNodes == null) {
                return ((RedisClient) redis).getPool().getResource();
            }
            ConnectionPool pool = ((RedisClusterClient) redis).getClusterNodes().get(node);
            if (pool == null) {  // the node left the cluster since its slots were looked up
                throw new JedisMovedDataException("no longer a node of the cluster: " + node, null, -1);
            }
            return pool.getResource();
        }

        /** Run ``calls`` (key, then arguments) on ``node`` in one pipeline, then WAIT for its replicas where asked;
         * false when the node did not know the script by its hash. */
        private boolean pipelined(String node, List<List<byte[]>> calls, boolean bySha) throws IOException {
            List<Response<Object>> replies = new ArrayList<>(calls.size());
            Response<Long> acked = null;
            try (Pipeline pipe = new Pipeline(connection(node), true)) {
                for (List<byte[]> call : calls) {
                    List<byte[]> keys = call.subList(0, 1);
                    List<byte[]> args = call.subList(1, call.size());
                    replies.add(bySha ? pipe.evalsha(scriptSha, keys, args) : pipe.eval(script, keys, args));
                }
                if (replicaAcks > 0) {
                    acked = pipe.waitReplicas(replicaAcks, replicaAckTimeoutMs);
                }
                pipe.sync();
            } catch (JedisMovedDataException e) {
                throw e;
            } catch (RuntimeException e) {
                throw new IOException("writing online rows to Redis failed: " + e.getMessage(), e);
            }
            for (Response<Object> reply : replies) {
                try {
                    reply.get();
                } catch (JedisNoScriptException e) {
                    return false;
                } catch (JedisMovedDataException e) {
                    throw e;
                } catch (RuntimeException e) {
                    throw new IOException("Redis refused an online row: " + e.getMessage(), e);
                }
            }
            if (acked != null && acked.get() < replicaAcks) {
                throw new IOException(calls.size() + " online rows on " + (node.isEmpty() ? "Redis" : node) + " reached "
                        + acked.get() + " of " + replicaAcks + " replica(s) within " + replicaAckTimeoutMs
                        + " ms (redis.write_acks): not counted as written; the job restarts from its last checkpoint");
            }
            return true;
        }

        /** The compare-and-set's key and arguments for one row (``feature_store/online_write.py`` documents them). */
        private List<byte[]> arguments(byte[] key, Row row) {
            long latestMs = (Long) row.getField(head + 1);
            long micros = Math.multiplyExact(latestMs, 1000L);
            long seconds = Math.floorDiv(micros, 1_000_000L);
            long nanos = Math.floorMod(micros, 1_000_000L) * 1000L;
            List<byte[]> call = new ArrayList<>(14 + 2 * (featureFields.length + stepsFields.length));
            call.add(key);
            call.add(timestampField);
            call.add(timestamp(seconds, nanos));
            call.add(ascii(seconds));
            call.add(ascii(nanos));
            call.add(orderField);
            call.add(ascii(micros));
            call.add(ascii((Long) row.getField(head + 2)));
            call.add(ttl);
            call.add(ascii(0));  // no field to delete: the row has every window's steps
            call.add(absorbedField);
            call.add(((String) row.getField(head + 3)).getBytes(StandardCharsets.US_ASCII));
            call.add(planField);
            call.add(plan);
            for (int i = 0; i < featureFields.length; i++) {
                call.add(featureFields[i]);
                call.add(value(featureKinds[i], row.getField(head + 4 + stepsFields.length + i)));
            }
            for (int i = 0; i < stepsFields.length; i++) {
                call.add(stepsFields[i]);
                call.add((byte[]) row.getField(head + 4 + i));
            }
            return call;
        }

        /** Feast's key of the entity's hash: its serialized entity key (around each join key's value, in Feast's order,
         * the value's length and its UTF-8) and project. */
        private byte[] key(Row row) {
            byte[][] values = new byte[keyOrder.length][];
            int size = 0;
            for (byte[] part : keyParts) {
                size += part.length;
            }
            for (int i = 0; i < keyOrder.length; i++) {
                values[i] = ((String) row.getField(keyOrder[i])).getBytes(StandardCharsets.UTF_8);
                size += 4 + values[i].length;
            }
            ByteBuffer out = ByteBuffer.allocate(size).order(ByteOrder.LITTLE_ENDIAN).put(keyParts[0]);
            for (int i = 0; i < values.length; i++) {
                out.putInt(values[i].length).put(values[i]).put(keyParts[i + 1]);
            }
            return out.array();
        }
    }

    /** A serialized protobuf Timestamp: field 1 seconds, field 2 nanos, each left out when 0. */
    static byte[] timestamp(long seconds, long nanos) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(16);
        if (seconds != 0) {
            out.write(0x08);
            varint(out, seconds);
        }
        if (nanos != 0) {
            out.write(0x10);
            varint(out, nanos);
        }
        return out.toByteArray();
    }

    /** A serialized Feast Value of ``kind`` holding ``value`` (the empty Value for null): string_val (field 2),
     * int32_val (3), int64_val (4), double_val (5), float_val (6) or bool_val (7). */
    static byte[] value(String kind, Object value) {
        if (value == null) {
            return new byte[0];
        }
        if (kind.equals("string")) {
            byte[] text = ((String) value).getBytes(StandardCharsets.UTF_8);
            ByteArrayOutputStream out = new ByteArrayOutputStream(text.length + 6);
            out.write(0x12);
            varint(out, text.length);
            out.write(text, 0, text.length);
            return out.toByteArray();
        }
        if (kind.equals("bool")) {
            return new byte[] {0x38, (byte) (((Boolean) value) ? 1 : 0)};
        }
        Number number = (Number) value;
        switch (kind) {
            case "int64":
            case "int32": {
                ByteArrayOutputStream out = new ByteArrayOutputStream(11);
                out.write(kind.equals("int64") ? 0x20 : 0x18);
                varint(out, kind.equals("int64") ? number.longValue() : number.intValue());
                return out.toByteArray();
            }
            case "double":
                return ByteBuffer.allocate(9).order(ByteOrder.LITTLE_ENDIAN).put((byte) 0x29).putDouble(number.doubleValue()).array();
            default:
                return ByteBuffer.allocate(5).order(ByteOrder.LITTLE_ENDIAN).put((byte) 0x35).putFloat(number.floatValue()).array();
        }
    }

    /** A protobuf varint: seven bits a byte, least significant first; a negative number as its 64-bit two's complement. */
    private static void varint(ByteArrayOutputStream out, long value) {
        while ((value & ~0x7FL) != 0) {
            out.write((int) ((value & 0x7F) | 0x80));
            value >>>= 7;
        }
        out.write((int) value);
    }

    private static byte[] ascii(long number) {
        return ascii(Long.toString(number));
    }

    private static byte[] ascii(String text) {
        return text.getBytes(StandardCharsets.US_ASCII);
    }

    private static String sha1Hex(byte[] text) {
        try {
            return java.util.HexFormat.of().formatHex(java.security.MessageDigest.getInstance("SHA-1").digest(text));
        } catch (java.security.NoSuchAlgorithmException impossible) {  // every JVM has SHA-1
            throw new IllegalStateException(impossible);
        }
    }
}
