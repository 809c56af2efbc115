package dev.loopline.streams;

import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.apache.flink.api.common.eventtime.Watermark;
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
 * <p>What it publishes is of rows in Redis, not of records read. Its input is the decoder's progress
 * ({@link EventDecoder#progress}: per partition read, the last offset read and the newest event time taken from it),
 * with the read marks ({@link ReadMarks}) in band: when a mark passes it keeps what had been read by then. Each row
 * writer's subtask records the marks its rows reached Redis behind ({@link OnlineRowSink}); once every writer of a
 * topic's views recorded a mark, the rows of everything read by that mark are in Redis, however far the decoder has
 * read ahead of the windows meanwhile (network buffers under backpressure, the windows' pending rows). Every tick it
 * asks Kafka for each partition's end offset (keeping the last {@code TICKS_KEPT} ticks') and computes, per topic,
 * {@code progress = min over partitions of (the newest tick whose end the rows had reached, or else the newest event
 * time taken)}, from what had been read at the newest mark every writer recorded. A partition holding no record at a
 * tick, or, for a job restored from its checkpoint, not yet read from while its group's committed offset is at the end,
 * counts as read to that tick's end. A quiet topic so progresses with the clock; a lagging job, or one stopped, does
 * not. A topic with a partition behind that the rows have not reached anything of has no progress to publish (how far
 * its rows reach is unknown): the field keeps what was published before (a restored job's last run's), or stays absent
 * on a first start, until they have.
 *
 * <p>A namespace's progress only moves forward ({@link #PUBLISH}): a job rebuilding from the oldest retained event
 * reads its unchanged views' events again, but their rows keep what they absorbed (the compare-and-set refuses an older
 * row), so readers go on reading them as of the progress they had, flagged stale once the clock passes it, until the
 * rebuild has caught up.
 *
 * <p>A pending generation (a view rebuilt under a changed plan, written under a namespace of its own) is promoted, in
 * one compare-and-set, once its progress is within {@code switchWithinMs} of the tick's time (a topic read to its end
 * is; one that never stops receiving events is never read to its end): from then on readers read it instead of the
 * generation they served, a rebuilt generation then being as current as a serving one is. Kafka or Redis away only
 * pauses the publishing (readers then see the progress stand still and flag their reads stale); it never fails the
 * job. Runs at parallelism 1, its ticks on a thread of their own, so a slow broker never holds up the job's tasks.
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
        /** The field of its progress in the hash, and its row writer's subtasks' read marks' prefix. */
        String progressField;
        String writtenField;
        /** Its pending generation's JSON and the fields of the pending and serving generations; pending null when none. */
        String pending;
        String pendingField;
        String servingField;
    }

    private static final class Writer implements SinkWriter<Row> {
        /** How far apart (in read marks' ms) the kept reading positions are, and how many of the last ticks' end
         * offsets are kept: a partition read to an end is caught up as of that tick. */
        private static final long SNAPSHOT_EVERY_MS = 200;
        private static final int TICKS_KEPT = 120;
        private final Config config;
        /** Per partition read: {last offset read, newest event time}. */
        private final Map<TopicPartition, long[]> read = new HashMap<>();
        /** What had been read when each read mark passed, oldest first (guarded by itself). */
        private final Deque<Snapshot> snapshots = new ArrayDeque<>();
        /** The last ticks' end offsets, newest first (the tick thread's own). */
        private final Deque<Ends> ends = new ArrayDeque<>();
        private final ScheduledExecutorService ticks;
        private final List<String> topics = new ArrayList<>();
        private KafkaConsumer<byte[], byte[]> kafka;
        private UnifiedJedis redis;
        private Map<TopicPartition, Long> committed;

        private record Snapshot(long mark, Map<TopicPartition, long[]> read) {}

        private record Ends(long at, Map<TopicPartition, Long> ends, Map<TopicPartition, Long> beginnings) {}

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

        /** A read mark: every progress row ahead of it was read before it, so the rows of what ``read`` holds now are
         * in Redis once every row writer of a topic has recorded this mark. */
        @Override
        public void writeWatermark(Watermark mark) {
            synchronized (snapshots) {
                Snapshot last = snapshots.peekLast();
                if (last == null || mark.getTimestamp() - last.mark() >= SNAPSHOT_EVERY_MS) {
                    snapshots.addLast(new Snapshot(mark.getTimestamp(), new HashMap<>(read)));
                }
            }
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
                List<TopicPartition> all = readEnds(now);
                if (redis == null) {
                    redis = config.connection.connect();
                }
                Map<String, String> hash = redis.hgetAll(config.key);
                Map<String, long[]> computed = new HashMap<>();
                long least = Long.MAX_VALUE;
                for (String topic : topics) {
                    long written = written(topic, hash);
                    computed.put(topic, progress(topic, all, written));
                    least = Math.min(least, written);
                }
                pruneBefore(least);
                publish(computed, now);
            } catch (RuntimeException e) {  // Kafka or Redis away: the next tick tries again; readers see no progress meanwhile
                LOG.warn("publishing the views' progress failed: {}", e.toString());
                closeClients();
            }
        }

        /** The partitions of the job's topics, with their end offsets now kept as this tick's. */
        private List<TopicPartition> readEnds(long now) {
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
            ends.addFirst(new Ends(now, kafka.endOffsets(all, timeout), kafka.beginningOffsets(all, timeout)));
            while (ends.size() > TICKS_KEPT) {
                ends.removeLast();
            }
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
            return all;
        }

        /** The newest read mark every row writer of ``topic``'s views recorded in ``hash`` (each of its subtasks);
         * Long.MIN_VALUE where one has recorded none. */
        private long written(String topic, Map<String, String> hash) {
            long least = Long.MAX_VALUE;
            for (ViewEntry view : config.views) {
                if (!view.topic.equals(topic)) {
                    continue;
                }
                String first = hash.get(view.writtenField + 0);
                int subtasks = first == null ? 1 : Integer.parseInt(first.substring(first.indexOf(':') + 1));
                for (int i = 0; i < subtasks; i++) {
                    String mark = hash.get(view.writtenField + i);
                    least = Math.min(least, mark == null ? Long.MIN_VALUE : Long.parseLong(mark.substring(0, mark.indexOf(':'))));
                }
            }
            return least;
        }

        /** What had been read at the newest read mark no later than ``written``; nothing read where there is none. */
        private Map<TopicPartition, long[]> readBy(long written) {
            synchronized (snapshots) {
                Map<TopicPartition, long[]> found = Map.of();
                for (Snapshot snapshot : snapshots) {
                    if (snapshot.mark() > written) {
                        break;
                    }
                    found = snapshot.read();
                }
                return found;
            }
        }

        /** ``topic``'s progress from what its rows hold (what had been read at the read mark they were all written
         * behind, ``written``), as {progress ms, 1 when known}: per partition, the time of the newest tick whose end
         * offset it had been read to (everything published before then is in the rows) or else the newest event time
         * taken from it; the least over its partitions. A partition neither read to an end nor read from has no known
         * progress, nor then has the topic. */
        private long[] progress(String topic, List<TopicPartition> all, long written) {
            Map<TopicPartition, long[]> seen = readBy(written);
            long progress = Long.MAX_VALUE;
            for (TopicPartition partition : all) {
                if (!partition.topic().equals(topic)) {
                    continue;
                }
                long[] taken = seen.get(partition);
                long position = taken != null ? taken[0] + 1 : committed.getOrDefault(partition, -1L);
                long at = taken != null ? taken[1] : Long.MIN_VALUE;
                for (Ends tick : ends) {
                    long end = tick.ends().getOrDefault(partition, 0L);
                    if (end <= tick.beginnings().getOrDefault(partition, 0L) || position >= end) {
                        at = Math.max(at, tick.at());
                        break;
                    }
                }
                if (at == Long.MIN_VALUE) {
                    return new long[] {0, 0};
                }
                progress = Math.min(progress, at);
            }
            return new long[] {progress, 1};
        }

        /** Forget the reading positions no later read mark can need: all but the newest at or before ``written``. */
        private void pruneBefore(long written) {
            synchronized (snapshots) {
                Snapshot oldest = snapshots.pollFirst();
                while (oldest != null && !snapshots.isEmpty() && snapshots.peekFirst().mark() <= written) {
                    oldest = snapshots.pollFirst();
                }
                if (oldest != null) {
                    snapshots.addFirst(oldest);
                }
            }
        }

        private void publish(Map<String, long[]> computed, long now) {
            List<String> fields = new ArrayList<>();
            for (ViewEntry view : config.views) {
                long[] topic = computed.get(view.topic);
                if (topic[1] == 1) {
                    fields.add(view.progressField);
                    fields.add(topic[0] + ":" + now);
                }
            }
            if (!fields.isEmpty()) {
                redis.eval(PUBLISH, List.of(config.key), fields);
            }
            for (ViewEntry view : config.views) {
                long[] topic = computed.get(view.topic);
                if (view.pending != null && topic[1] == 1 && now - topic[0] <= config.switchWithinMs) {
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
