package dev.loopline.streams;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.typeutils.RowTypeInfo;
import org.apache.flink.metrics.Counter;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;

/**
 * The feature job's door: every raw Kafka record of every topic the job reads, keyed by its topic and partition,
 * becomes either an event of its topic's contract (a row of the contract's fields, in declaration order, then its
 * partition and offset, to the side output {@link #events}) or a dead letter (the main output, {@code DeadLetterRecord} JSON) saying why not:
 * <ul>
 *   <li>{@code invalid}: the record breaks its contract ({@link EventContract}: JSON or Avro, as its topic is encoded);
 *   <li>{@code out_of_range}: a valid event the engine cannot aggregate exactly (its event time past
 *       {@code maxEventTimeMs}, or an aggregated number beyond {@code maxExactValue});
 *   <li>{@code late}: its event time is more than the topic's allowed out-of-orderness behind the newest event time
 *       taken from its partition (the per-partition watermark; it does not depend on how fast other partitions are
 *       read, so a replay reaches the same verdicts).
 * </ul>
 * A record never stops the job. Counted in {@code invalid_events} (invalid and out of range) and {@code late_events}.
 * When a read mark ({@link ReadMarks}) passes after a partition's records, it says how far it has read that partition (the
 * side output {@link #progress}: topic, partition, the last offset read, the newest event time taken), for
 * {@link ProgressSink}: ahead of the mark, so what the publisher holds when a mark reaches it was read before the mark.
 * The raw rows hold the record's topic, key, value, partition and offset at the positions the spec gives.
 */
public final class EventDecoder extends KeyedProcessFunction<String, Row, String> {
    private static final long serialVersionUID = 1L;
    /** One topic the job reads: its contract and wire format, its event time field, the allowed out-of-orderness, and
     * the numeric fields some view aggregates (checked for range). */
    private static final class Source implements java.io.Serializable {
        private static final long serialVersionUID = 1L;
        EventContract contract;
        boolean avro;
        int timeField;
        String timeName;
        long outOfOrdernessMs;
        int[] rangeFields;
        OutputTag<Row> tag;
    }

    private final String consumer;
    private final int topicAt;
    private final int keyAt;
    private final int valueAt;
    private final int partitionAt;
    private final int offsetAt;
    private final long maxEventTimeMs;
    private final BigDecimal maxExactValue;
    private final Map<String, Source> sources = new HashMap<>();
    private transient ValueState<Long> newest;
    private transient ValueState<Long> lastOffset;
    private final OutputTag<Row> progress = new OutputTag<>("progress", new RowTypeInfo(Types.STRING, Types.INT, Types.LONG, Types.LONG));
    private transient Counter invalidEvents;
    private transient Counter lateEvents;

    /** {@code spec}: the sources and the raw rows' layout, as {@code streams/feature_job.py} writes them. */
    public EventDecoder(String spec) {
        JsonObject root = JsonParser.parseString(spec).getAsJsonObject();
        consumer = root.get("consumer").getAsString();
        JsonObject raw = root.getAsJsonObject("raw");
        topicAt = raw.get("topic").getAsInt();
        keyAt = raw.get("key").getAsInt();
        valueAt = raw.get("value").getAsInt();
        partitionAt = raw.get("partition").getAsInt();
        offsetAt = raw.get("offset").getAsInt();
        maxEventTimeMs = root.get("maxEventTimeMs").getAsLong();
        maxExactValue = new BigDecimal(root.get("maxExactValue").getAsString());
        for (JsonElement element : root.getAsJsonArray("sources")) {
            JsonObject s = element.getAsJsonObject();
            Source source = new Source();
            String topic = s.get("topic").getAsString();
            source.contract = new EventContract(s.get("contract").getAsString());
            source.avro = s.get("wire").getAsString().equals("avro");
            source.timeName = s.get("timeField").getAsString();
            source.timeField = source.contract.position(source.timeName);
            source.outOfOrdernessMs = s.get("outOfOrdernessMs").getAsLong();
            List<Integer> ranged = new ArrayList<>();
            s.getAsJsonArray("rangeFields").forEach(f -> ranged.add(source.contract.position(f.getAsString())));
            source.rangeFields = ranged.stream().mapToInt(Integer::intValue).toArray();
            source.tag = new OutputTag<>("events-" + topic, rowType(source.contract));
            sources.put(topic, source);
        }
    }

    /** The side output of how far each partition has been read: (topic, partition, last offset read, newest event time
     * taken, 0 for none), at the first read mark after its records. */
    public OutputTag<Row> progress() {
        return progress;
    }

    /** The side output of {@code topic}'s events. */
    public OutputTag<Row> events(String topic) {
        return sources.get(topic).tag;
    }

    /** The type of a contract's events: its fields, named, as String, Long, Double or Boolean, then the record's Kafka
     * partition and offset. */
    static RowTypeInfo rowType(EventContract contract) {
        Class<?>[] classes = contract.fieldClasses();
        TypeInformation<?>[] types = new TypeInformation<?>[classes.length + 2];
        String[] names = java.util.Arrays.copyOf(contract.fieldNames(), classes.length + 2);
        for (int i = 0; i < classes.length; i++) {
            types[i] = classes[i] == Long.class ? Types.LONG : classes[i] == Double.class ? Types.DOUBLE
                    : classes[i] == Boolean.class ? Types.BOOLEAN : Types.STRING;
        }
        types[classes.length] = Types.INT;
        types[classes.length + 1] = Types.LONG;
        names[classes.length] = "_kafka_partition";
        names[classes.length + 1] = "_kafka_offset";
        return new RowTypeInfo(types, names);
    }

    @Override
    public void open(OpenContext context) {
        newest = getRuntimeContext().getState(new ValueStateDescriptor<>("newest_event_time", Types.LONG));
        lastOffset = getRuntimeContext().getState(new ValueStateDescriptor<>("last_offset", Types.LONG));
        invalidEvents = getRuntimeContext().getMetricGroup().counter("invalid_events");
        lateEvents = getRuntimeContext().getMetricGroup().counter("late_events");
    }

    @Override
    public void processElement(Row raw, Context ctx, Collector<String> out) throws Exception {
        String topic = (String) raw.getField(topicAt);
        Source source = sources.get(topic);
        lastOffset.update((Long) raw.getField(offsetAt));
        // Fires when the next read mark passes, before the mark goes on; one timer per partition per mark.
        ctx.timerService().registerEventTimeTimer(ctx.timerService().currentWatermark() + 1);
        byte[] value = (byte[]) raw.getField(valueAt);
        Object[] event;
        try {
            event = source.contract.decode(value == null ? new byte[0] : value, source.avro);
        } catch (EventContract.Violation violation) {
            invalidEvents.inc();
            out.collect(letter(raw, "invalid", "invalid " + source.contract.name() + ": " + violation.field + ": " + violation.reason,
                    violation.field));
            return;
        } catch (RuntimeException unexpected) {  // a record must never stop the job, whatever is wrong with it
            invalidEvents.inc();
            out.collect(letter(raw, "unprocessable", unexpected.toString(), null));
            return;
        }
        long eventTime = (Long) event[source.timeField];
        String range = outOfRange(source, event, eventTime);
        if (range != null) {
            invalidEvents.inc();
            String field = range.substring(0, range.indexOf(':'));
            out.collect(letter(raw, "out_of_range", range, field));
            return;
        }
        Long seen = newest.value();
        if (seen != null && eventTime < seen - source.outOfOrdernessMs) {
            lateEvents.inc();
            out.collect(letter(raw, "late", "event time is " + (seen - source.outOfOrdernessMs - eventTime)
                    + " ms behind the partition's watermark", source.timeName));
            return;
        }
        if (seen == null || eventTime > seen) {
            newest.update(eventTime);
        }
        Object[] positioned = java.util.Arrays.copyOf(event, event.length + 2);
        positioned[event.length] = raw.getField(partitionAt);
        positioned[event.length + 1] = raw.getField(offsetAt);
        ctx.output(source.tag, Row.of(positioned));
    }

    @Override
    public void onTimer(long timestamp, OnTimerContext ctx, Collector<String> out) throws Exception {
        String[] key = FieldKey.parts(ctx.getCurrentKey(), 2);
        Long seen = newest.value();
        ctx.output(progress, Row.of(key[0], Integer.valueOf(key[1]), lastOffset.value(), seen == null ? 0L : seen));
    }

    /** {@code field: why} when the event holds a value the engine cannot aggregate exactly, else null (the first such
     * field: the event time, then the aggregated numbers in the contract's order). */
    private String outOfRange(Source source, Object[] event, long eventTime) {
        if (eventTime <= 0 || eventTime > maxEventTimeMs) {
            return source.timeName + ": " + eventTime + " is beyond the latest event time the engine takes (" + maxEventTimeMs + ")";
        }
        for (int at : source.rangeFields) {
            Object number = event[at];
            BigDecimal magnitude = (number instanceof Long l ? BigDecimal.valueOf(l) : new BigDecimal((Double) number)).abs();
            if (magnitude.compareTo(maxExactValue) > 0) {
                return source.contract.fieldNames()[at] + ": " + number + " is beyond ±" + maxExactValue.toPlainString()
                        + ", the largest value summed exactly";
            }
        }
        return null;
    }

    private String letter(Row raw, String reason, String error, String field) {
        return DeadLetter.json(consumer, reason, error, field, (String) raw.getField(topicAt), (Integer) raw.getField(partitionAt),
                (Long) raw.getField(offsetAt), (byte[]) raw.getField(keyAt), (byte[]) raw.getField(valueAt));
    }
}
