package dev.loopline.streams;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.streaming.api.TimeDomain;
import org.apache.flink.streaming.api.TimerService;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

import com.google.gson.Gson;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;

/**
 * One stream feature view's sliding windows for one entity (keyed by its join keys' values, {@link FieldKey}),
 * updated on every event ({@link WindowPlan}: the semantics, the tiles and their steps).
 *
 * <p>Each event's row, for the offline log, is {@code (key..., version, latest, events, feature...)}, the entity's
 * join keys' values first: {@code latest}
 * is the entity's latest event time {@code T} (ms), {@code events} the number of events the operator has absorbed
 * for the entity (kept in its checkpointed state), and the features, as of {@code T}, are a function of the set of
 * those events alone, whatever their arrival order. The online store orders an entity's rows by
 * {@code (latest, events)}: a job restored from a checkpoint replays a superset of the events behind any row it
 * wrote before the failure, from its partitions in any interleaving, so its row of the full set never orders below
 * such a row, and orders equal only when it is of the same set. {@code version} is a timestamp in microseconds for
 * the offline log: {@code T} times 1000, or one more than the previous row's version when that is larger, so it
 * grows strictly with every absorbed event; it runs ahead of {@code T} by a millisecond or more only after a
 * thousand events absorbed without {@code T} moving on.
 *
 * <p>For the online store the operator sends, to the side output {@code online}, an entity's newest row when the next
 * read mark passes ({@link ReadMarks}: an event-time timer at the mark after the current one, checkpointed with the
 * state; Flink fires it before it passes the mark on, so a mark leaves behind it the rows of every event read before
 * it), with the log positions it absorbed ({@link WindowPlan.Windows#absorbedPositions}: which events are behind
 * it, exactly, however the entity's events spread over partitions) and each window's steps ({@link WindowPlan#steps})
 * after {@code events}: {@code (key..., version, latest, events, absorbed, steps..., feature...)}. The store keeps
 * only the newest row anyway, and a row carries the entity's whole windows, so a coalesced row loses nothing.
 *
 * <p>An input row is an event of the view's topic, its contract's fields, then its Kafka partition and offset.
 *
 * <p>State stays bounded: an entity leaves it once every window it has is empty for good, that is once the partitions
 * it absorbed from have moved past its latest event by {@code horizonMs} (its view's longest window, or its ttl where
 * that is longer and it has a feature without a window, which looks back that far: {@link WindowPlan}) plus the topic's
 * allowed out-of-orderness: the decoder refuses, as late, any later event that would still fall in a window of the
 * entity's tiles, so its next event finds the windows as empty as a new entity's. Checked on a processing-time timer,
 * as long after the entity's first event since it was last checked as its partitions' event time is from letting it
 * leave, at least a second and at most {@code checkEveryMs} ({@code stream.state_check_ms}), and again so while they have not moved that far (a quiet topic keeps
 * its entities). A view with a feature without a window and no ttl ({@code horizonMs} negative) keeps its entities:
 * those values never expire. Which partitions moved how far is what this subtask saw since it started; after a restore an entity waits
 * for its partitions' next events.
 *
 * <p>An event that would take a tile's total past what a window sums exactly ({@link WindowPlan#refusal}) is not
 * absorbed: its dead letter ({@link DeadLetter}, reason {@code overflow}, the event's fields as JSON, at its log
 * position) goes to the side output {@code refused}, and the entity's windows stay as they were.
 */
public final class SlidingWindows extends KeyedProcessFunction<String, Row, Row> {
    private static final long serialVersionUID = 1L;
    /** How soon after it was scheduled an entity's leave check runs, at the soonest. */
    private static final long MIN_CHECK_MS = 1_000;
    private final WindowPlan plan;
    /** How many join keys the entity has: where version, latest and events are in its rows. */
    private final int keys;
    private final OutputTag<Row> online;
    private final OutputTag<String> refused;
    private final long horizonMs;
    private final long outOfOrdernessMs;
    private final long checkEveryMs;
    /** The job's name, the view's topic and its contract's field names, in order: what a dead letter says. */
    private final String consumer;
    private final String topic;
    private final String[] fieldNames;
    private transient ValueState<WindowPlan.Windows> state;
    /** When the entity's state is next checked for leaving (processing time); none while not scheduled. */
    private transient ValueState<Long> checkAt;
    /** Per partition: the newest event time this subtask absorbed from it. */
    private transient Map<Integer, Long> partitionNewest;

    /** {@code letters}: {@code {"consumer", "topic", "fields"}} as JSON, for the dead letters of refused events;
     * {@code ttlMs}: the view's ttl ({@link WindowPlan}); {@code horizonMs}: its longest window (or its ttl, where
     * longer and it has a feature without a window), negative where an entity never leaves the state. */
    public SlidingWindows(String aggregationSpec, int timeField, long scale, long ttlMs, OutputTag<Row> online,
            OutputTag<String> refused, String letters, long horizonMs, long outOfOrdernessMs, long checkEveryMs, int keys) {
        this.plan = new WindowPlan(aggregationSpec, timeField, scale, ttlMs);
        this.keys = keys;
        this.online = online;
        this.refused = refused;
        this.horizonMs = horizonMs;
        this.outOfOrdernessMs = outOfOrdernessMs;
        this.checkEveryMs = checkEveryMs;
        JsonObject spec = JsonParser.parseString(letters).getAsJsonObject();
        this.consumer = spec.get("consumer").getAsString();
        this.topic = spec.get("topic").getAsString();
        this.fieldNames = new Gson().fromJson(spec.get("fields"), String[].class);
    }

    @Override
    public void open(OpenContext context) {
        state = getRuntimeContext().getState(new ValueStateDescriptor<>("windows", WindowsSerializer.INSTANCE));
        checkAt = getRuntimeContext().getState(new ValueStateDescriptor<>("leave_check_at", Types.LONG));
        partitionNewest = new HashMap<>();
    }

    @Override
    public void processElement(Row row, Context ctx, Collector<Row> out) throws Exception {
        WindowPlan.Windows w = state.value();
        if (w == null) {
            w = plan.newState(plan.eventTime(row));
        }
        int arity = row.getArity();
        WindowPlan.Refusal refusal = plan.refusal(w, row);
        if (refusal != null) {
            ctx.output(refused, letter(row, ctx.getCurrentKey(), refusal));
            return;
        }
        plan.absorb(w, row);
        int partition = (Integer) row.getField(arity - 2);
        w.absorbedAt(partition, (Long) row.getField(arity - 1));
        partitionNewest.merge(partition, plan.eventTime(row), Math::max);
        w.pending = true;
        state.update(w);
        out.collect(row(ctx.getCurrentKey(), w, null));
        // One timer per entity per mark: Flink keeps a single timer per key and time.
        ctx.timerService().registerEventTimeTimer(ctx.timerService().currentWatermark() + 1);
        if (horizonMs >= 0 && checkAt.value() == null) {
            scheduleCheck(ctx.timerService(), horizonMs + outOfOrdernessMs);
        }
    }

    @Override
    public void onTimer(long timestamp, OnTimerContext ctx, Collector<Row> out) throws Exception {
        WindowPlan.Windows w = state.value();
        if (w == null) {
            return;
        }
        if (ctx.timeDomain() == TimeDomain.EVENT_TIME) {
            if (w.pending) {
                ctx.output(online, row(ctx.getCurrentKey(), w, plan.steps(w)));
                w.pending = false;
                state.update(w);
            }
            return;
        }
        checkAt.clear();
        if (horizonMs < 0) {  // a timer of a job that kept no horizon: this entity never leaves
            return;
        }
        Long moved = movedTo(w);
        if (moved == null) {  // a partition not seen since the start (a restore): how far it moved is unknown
            scheduleCheck(ctx.timerService(), checkEveryMs);
        } else if (w.latest + horizonMs + outOfOrdernessMs < moved && !w.pending) {
            state.clear();
        } else {
            scheduleCheck(ctx.timerService(), w.latest + horizonMs + outOfOrdernessMs - moved);
        }
    }

    /** The least, over the partitions the entity absorbed from, of the newest event time this subtask saw from each;
     * null where it saw none from one of them. */
    private Long movedTo(WindowPlan.Windows w) {
        long least = Long.MAX_VALUE;
        for (int partition : w.absorbedPartitions()) {
            Long newest = partitionNewest.get(partition);
            if (newest == null) {
                return null;
            }
            least = Math.min(least, newest);
        }
        return least;
    }

    /** A leave check as long from now as the entity's partitions are {@code behindMs} of event time from letting it
     * leave (a live topic's event time moves with the clock), within {@link #MIN_CHECK_MS} and {@code checkEveryMs} (a
     * replay's moves faster); on a whole second, so entities checked at one instant share one timer time. */
    private void scheduleCheck(TimerService timers, long behindMs) throws java.io.IOException {
        long delay = Math.min(Math.max(behindMs, MIN_CHECK_MS), checkEveryMs);
        long at = ((timers.currentProcessingTime() + delay) / 1000 + 1) * 1000;
        checkAt.update(at);
        timers.registerProcessingTimeTimer(at);
    }

    /** The dead letter of an event the windows refused: its fields as JSON, at its log position. */
    private String letter(Row row, String key, WindowPlan.Refusal refusal) {
        Map<String, Object> event = new LinkedHashMap<>();
        for (int i = 0; i < fieldNames.length; i++) {
            event.put(fieldNames[i], row.getField(i));
        }
        int arity = row.getArity();
        String field = fieldNames[refusal.column()];
        return DeadLetter.json(consumer, "overflow", field + ": " + refusal.why(), field, topic, (Integer) row.getField(arity - 2),
                (Long) row.getField(arity - 1), key.getBytes(StandardCharsets.UTF_8),
                new Gson().toJson(event).getBytes(StandardCharsets.UTF_8));
    }

    /** The entity's row as of its latest event; an online row (with {@code steps}) carries its absorbed positions and
     * the steps before the features, an offline row ({@code steps} null) neither. */
    private Row row(String key, WindowPlan.Windows w, byte[][] steps) {
        Object[] features = plan.finished(w);
        int head = keys + 3 + (steps == null ? 0 : 1 + steps.length);
        Row out = new Row(head + features.length);
        String[] parts = FieldKey.parts(key, keys);
        for (int i = 0; i < keys; i++) {
            out.setField(i, parts[i]);
        }
        out.setField(keys, w.version);
        out.setField(keys + 1, w.latest);
        out.setField(keys + 2, w.events);
        if (steps != null) {
            out.setField(keys + 3, w.absorbedPositions());
            for (int i = 0; i < steps.length; i++) {
                out.setField(keys + 4 + i, steps[i]);
            }
        }
        for (int i = 0; i < features.length; i++) {
            out.setField(head + i, features[i]);
        }
        return out;
    }
}
