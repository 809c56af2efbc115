package dev.loopline.streams;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.kafka.shaded.org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.flink.kafka.shaded.org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.flink.kafka.shaded.org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.flink.kafka.shaded.org.apache.kafka.common.PartitionInfo;
import org.apache.flink.kafka.shaded.org.apache.kafka.common.TopicPartition;
import org.apache.flink.kafka.shaded.org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.flink.types.Row;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import com.google.gson.Gson;

import redis.clients.jedis.UnifiedJedis;

/**
 * Publishes, once a second, how far in event time each view's rows have absorbed their topic, and makes a rebuilt
 * generation of a view the one readers serve once it has caught up ({@code feature_store/view_state.py} reads both).
 *
 * <p>Its input is the decoder's progress ({@link EventDecoder#progress}): per partition read, the last offset read and
 * the newest event time taken from it. Every tick it asks Kafka for each partition's end offset and computes, per topic,
 * {@code progress = min over partitions of (caught up ? the tick's time : newest event time)}: a partition is caught up
 * when every record published to it before the tick has been read (or it holds none, or, for a job restored from its
 * checkpoint, its group's committed offset is at the end). A quiet topic read to its end so progresses with the clock; a
 * lagging job, or one stopped, does not. A topic with a partition behind that the job has not read from yet has no
 * progress to publish (how far its rows reach is unknown): the field keeps what was published before (a restored job's
 * last run's), or stays absent on a first start, until the job has read from it. What it publishes at a tick is what it computed at the one before, a second
 * earlier: the rows of every event read by then are in Redis (the windows send an entity's row within
 * {@code online_interval_ms}, the row writer a millisecond later).
 *
 * <p>A namespace's progress only moves forward ({@link #PUBLISH}): a job rebuilding from the oldest retained event
 * reads its unchanged views' events again, but their rows keep what they absorbed (the compare-and-set refuses an older
 * row), so readers go on reading them as of the progress they had, flagged stale once the clock passes it, until the
 * rebuild has caught up.
 *
 * <p>A pending generation (a view rebuilt under a changed plan, written under a namespace of its own) is promoted, in
 * one compare-and-set, once its topic was caught up at a tick or its progress was within {@code switchWithinMs} of the
 * tick's time (a topic that never stops receiving events is never read to its end): from then on readers read it
 * instead of the generation they served, a rebuilt generation then being as current as a serving one is. Kafka or Redis away only pauses the publishing (readers then see the progress stand still and flag their
 * reads stale); it never fails the job. Runs at parallelism 1, on a thread of its own, so a slow broker never holds up
 * the job's tasks.
 */
public final class ProgressSink implements Sink<Row> {
    private static final long serialVersionUID = 1L;
    private static final Logger LOG = LoggerFactory.getLogger(ProgressSink.class);
    /** KEYS[1] the views' hash; ARGV: pairs of a progress field and its {@code <progress ms>:<tick ms>}, each set only
     * where it holds no later progress. */
    private static final String PUBLISH = "for i = 1, #ARGV, 2 do\n"
            + "local old = redis.call('HGET', KEYS[1], ARGV[i])\n"
            + "if not old or tonumber(string.match(old, '^%d+')) <= tonumber(string.match(ARGV[i + 1], '^%d+')) then\n"
            + "redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end\nend\nreturn 0\n";
    /** KEYS[1] the views' hash; ARGV: the pending field, the pending generation's JSON, the serving field. */
    private static final String PROMOTE = "if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end\n"
            + "redis.call('HSET', KEYS[1], ARGV[3], ARGV[2])\nredis.call('HDEL', KEYS[1], ARGV[1])\nreturn 1\n";

    private final String configJson;

    /** {@code configJson}: the {@link Config}, as {@code streams/feature_job.py} writes it. */
    public ProgressSink(String configJson) {
        this.configJson = configJson;
        new Gson().fromJson(configJson, Config.class).connection.check();
    }

    @Override
    public SinkWriter<Row> createWriter(WriterInitContext context) {
        return new Writer(new Gson().fromJson(configJson, Config.class));
    }

    static final class Config {
        RedisConnection connection;
        /** The hash of the project's views ({@code feature_store/view_state.py}). */
        String key;
        List<ViewEntry> views;
        String bootstrapServers;
        Map<String, String> kafkaProperties;
        String groupId;
        /** The job restored its offsets from a checkpoint: its group's committed offsets are its own. */
        boolean restored;
        long intervalMs;
        /** A pending generation is promoted once its progress is this close to the clock (or its topic read to its end). */
        long switchWithinMs;
    }

    static final class ViewEntry {
        String view;
        String topic;
        /** The field of its progress in the hash. */
        String progressField;
        /** Its pending generation's JSON and the fields of the pending and serving generations; pending null when none. */
        String pending;
        String pendingField;
        String servingField;
    }

    private static final class Writer implements SinkWriter<Row> {
        private final Config config;
        /** Per partition read: {last offset read, newest event time}. */
        private final Map<TopicPartition, long[]> read = new ConcurrentHashMap<>();
        private final ScheduledExecutorService ticks;
        private final List<String> topics = new ArrayList<>();
        private KafkaConsumer<byte[], byte[]> kafka;
        private UnifiedJedis redis;
        private Map<TopicPartition, Long> committed;
        /** What the previous tick computed, per topic: {progress ms, tick ms, 1 when caught up, 1 when known}. */
        private Map<String, long[]> previous;

        Writer(Config config) {
            this.config = config;
            for (ViewEntry view : config.views) {
                if (!topics.contains(view.topic)) {
                    topics.add(view.topic);
                }
            }
            ticks = Executors.newSingleThreadScheduledExecutor(runnable -> {
                Thread thread = new Thread(runnable, "loopline-progress");
                thread.setDaemon(true);
                return thread;
            });
            ticks.scheduleWithFixedDelay(this::tick, config.intervalMs, config.intervalMs, TimeUnit.MILLISECONDS);
        }

        @Override
        public void write(Row row, Context context) {
            TopicPartition partition = new TopicPartition((String) row.getField(0), (Integer) row.getField(1));
            read.put(partition, new long[] {(Long) row.getField(2), (Long) row.getField(3)});
        }

        @Override
        public void flush(boolean endOfInput) {}

        @Override
        public void close() {
            ticks.shutdownNow();
            try {
                ticks.awaitTermination(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            if (kafka != null) {
                kafka.close(Duration.ofSeconds(5));
            }
            if (redis != null) {
                redis.close();
            }
        }

        private void tick() {
            try {
                long now = System.currentTimeMillis();
                Map<String, long[]> computed = progress(now);
                if (previous != null) {
                    publish(previous);
                }
                previous = computed;
            } catch (RuntimeException e) {  // Kafka or Redis away: the next tick tries again; readers see no progress meanwhile
                LOG.warn("publishing the views' progress failed: {}", e.toString());
                closeClients();
            }
        }

        private Map<String, long[]> progress(long now) {
            if (kafka == null) {
                Properties properties = new Properties();
                properties.putAll(config.kafkaProperties);
                properties.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, config.bootstrapServers);
                properties.put(ConsumerConfig.GROUP_ID_CONFIG, config.groupId);
                properties.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
                properties.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
                properties.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
                kafka = new KafkaConsumer<>(properties);
            }
            Duration timeout = Duration.ofSeconds(5);
            List<TopicPartition> all = new ArrayList<>();
            for (String topic : topics) {
                for (PartitionInfo info : kafka.partitionsFor(topic, timeout)) {
                    all.add(new TopicPartition(topic, info.partition()));
                }
            }
            Map<TopicPartition, Long> ends = kafka.endOffsets(all, timeout);
            Map<TopicPartition, Long> beginnings = kafka.beginningOffsets(all, timeout);
            if (committed == null) {
                Map<TopicPartition, Long> offsets = new HashMap<>();
                if (config.restored) {  // the offsets the job restored from (its last checkpoint's), once, at its start
                    for (Map.Entry<TopicPartition, OffsetAndMetadata> e : kafka.committed(new HashSet<>(all), timeout).entrySet()) {
                        if (e.getValue() != null) {
                            offsets.put(e.getKey(), e.getValue().offset());
                        }
                    }
                }
                committed = offsets;
            }
            Map<String, long[]> computed = new HashMap<>();
            for (String topic : topics) {
                computed.put(topic, new long[] {now, now, 1, 1});
            }
            for (TopicPartition partition : all) {
                long end = ends.getOrDefault(partition, 0L);
                long[] seen = read.get(partition);
                long position = seen != null ? seen[0] + 1 : committed.getOrDefault(partition, -1L);
                boolean caughtUp = end <= beginnings.getOrDefault(partition, 0L) || position >= end;
                long[] topic = computed.get(partition.topic());
                if (!caughtUp && seen == null) {  // not read from yet: how far it was absorbed is unknown until it is
                    topic[2] = 0;
                    topic[3] = 0;
                } else if (!caughtUp) {
                    topic[0] = Math.min(topic[0], seen[1]);
                    topic[2] = 0;
                }
            }
            return computed;
        }

        private void publish(Map<String, long[]> computed) {
            if (redis == null) {
                redis = config.connection.connect();
            }
            List<String> fields = new ArrayList<>();
            for (ViewEntry view : config.views) {
                long[] topic = computed.get(view.topic);
                if (topic[3] == 1) {
                    fields.add(view.progressField);
                    fields.add(topic[0] + ":" + topic[1]);
                }
            }
            if (!fields.isEmpty()) {
                redis.eval(PUBLISH, List.of(config.key), fields);
            }
            for (ViewEntry view : config.views) {
                long[] topic = computed.get(view.topic);
                if (view.pending != null && topic[3] == 1 && (topic[2] == 1 || topic[1] - topic[0] <= config.switchWithinMs)) {
                    Object promoted = redis.eval(PROMOTE, List.of(config.key), List.of(view.pendingField, view.pending, view.servingField));
                    LOG.info("view {}: {} {}", view.view, Long.valueOf(1).equals(promoted) ? "promoted" : "no longer pending",
                            view.pending);
                    view.pending = null;
                }
            }
        }

        private void closeClients() {
            if (kafka != null) {
                kafka.close(Duration.ofSeconds(1));
                kafka = null;
            }
            if (redis != null) {
                redis.close();
                redis = null;
            }
        }
    }
}
