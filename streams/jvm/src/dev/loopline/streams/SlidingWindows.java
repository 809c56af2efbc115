package dev.loopline.streams;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

/**
 * One stream feature view's sliding windows for one entity (keyed by entity), updated on every event.
 *
 * <p>Semantics, shared with the offline recompute ({@code streams/recompute.py}):
 * <ul>
 *   <li>An entity's features are evaluated at its latest event time {@code T}.
 *   <li>An aggregation with window {@code W} and slide {@code S} covers the entity's events whose
 *       bucket {@code floor(ts / S)} lies in {@code (floor(T / S) - W/S, floor(T / S)]}: the last
 *       {@code W} counted in steps of {@code S}.
 *   <li>Sums are exact: values are added as integers of {@code 1/scale} (rounded half to even).
 *   <li>{@code time_since_previous} is the seconds between {@code T} and the entity's latest
 *       earlier event time (by event time, not arrival).
 * </ul>
 * Each output row is {@code (entity, version, latest, events, tiles, tile..., feature...)}: {@code latest} is {@code T} (ms),
 * {@code events} the number of events the operator has absorbed for the entity (kept in its checkpointed
 * state), and the features are a function of the set of those events alone, whatever their arrival order.
 * The online store orders an entity's rows by {@code (latest, events)}: a job restored from a checkpoint
 * replays a superset of the events behind any row it wrote before the failure, from its partitions in
 * any interleaving, so its row of the full set never orders below such a row, and orders equal only when
 * it is of the same set. {@code version} is a timestamp in microseconds for the offline log:
 * {@code T} times 1000, or one more than the previous row's version when that is larger, so it grows
 * strictly with every absorbed event; it runs ahead of {@code T} by a millisecond or more only after a
 * thousand events absorbed without {@code T} moving on. {@code tiles} is the text {@code T,S1:k1:o1,S2:k2:o2,...}: per
 * slide length {@code S} (ms), the most buckets {@code k} any of its windows spans (the size of its ring of slots in
 * the store), and {@code o} the index of the oldest bucket with events among those kept.
 *
 * <p>The operator emits every row (one per event, for the offline log) with no tiles. For the online store it sends,
 * to the side output {@code online}, an entity's newest row at most once per {@code coalesceMs} of processing time
 * (on a timer, aligned for all entities, checkpointed with the state): the store keeps only the newest row anyway,
 * and a busy entity's tiles, re-sent whole on every event, were most of the job's cost. The buckets are the tiles a
 * request-time read merges ({@code feature_store/window_tiles.py}): such a row carries, per slide length, every bucket
 * changed since the entity's previous online row, each in the form {@link TileBytes} writes, framed one after the
 * other ({@link TileBytes#frame}; empty where none), so one row, written in one compare-and-set, brings its marker and
 * every tile it names. A bucket that has left every window as of {@code T} is not sent: a read is as of {@code T} or
 * later and never covers it. The per-event rows carry neither marker (null) nor tiles.
 *
 * <p>The aggregations come as text, one per {@code ;}: {@code name,function,column,window_ms,slide_ms}
 * with the column as a position in the input row ({@code window_ms} and {@code slide_ms} are 0
 * for {@code time_since_previous}).
 */
public final class SlidingWindows extends KeyedProcessFunction<String, Row, Row> {
    private static final long serialVersionUID = 1L;
    /** Where the tiles start in an output row: after the entity, version, latest, events and the tiles' marker. */
    private static final int TILES = 5;
    /** No tiles (empty, not null: PyFlink cannot hand a null byte array to Python). */
    private static final byte[] NO_TILE = new byte[0];

    private final int timeField;
    private final long scale;
    private final OutputTag<Row> online;
    private final long coalesceMs;
    private final List<Aggregation> aggregations = new ArrayList<>();
    /** Per distinct slide length: its length, the most buckets any window keeps, and the columns it tracks. */
    private final List<Slide> slides = new ArrayList<>();
    private int runningSets;
    private transient ValueState<Windows> state;

    public SlidingWindows(String aggregationSpec, int timeField, long scale, OutputTag<Row> online, long coalesceMs) {
        this.timeField = timeField;
        this.scale = scale;
        this.online = online;
        this.coalesceMs = coalesceMs;
        for (String item : aggregationSpec.split(";")) {
            String[] part = item.split(",");
            aggregations.add(place(part[1], Integer.parseInt(part[2]), Long.parseLong(part[3]), Long.parseLong(part[4])));
        }
    }

    /** The aggregation with its slide, and the slot of its column among the slide's tracked columns. */
    private Aggregation place(String function, int column, long windowMs, long slideMs) {
        if (function.equals("time_since_previous")) {
            return new Aggregation(function, column, -1, 0, -1, -1);
        }
        int index = 0;
        while (index < slides.size() && slides.get(index).lengthMs != slideMs) {
            index++;
        }
        if (index == slides.size()) {
            slides.add(new Slide(slideMs));
        }
        Slide slide = slides.get(index);
        int span = (int) (windowMs / slideMs);
        slide.keptBuckets = Math.max(slide.keptBuckets, span);
        if (function.equals("count")) {
            return new Aggregation(function, column, index, span, -1, -1);
        }
        boolean distinct = function.equals("count_distinct");
        List<Integer> columns = distinct ? slide.distinctColumns : slide.numericColumns;
        if (!columns.contains(column)) {
            columns.add(column);
        }
        return new Aggregation(function, column, index, span, columns.indexOf(column), distinct ? runningSets++ : -1);
    }

    private static final class Slide implements Serializable {
        private static final long serialVersionUID = 1L;
        final long lengthMs;
        int keptBuckets;
        final List<Integer> numericColumns = new ArrayList<>();
        final List<Integer> distinctColumns = new ArrayList<>();

        Slide(long lengthMs) {
            this.lengthMs = lengthMs;
        }
    }

    /** One feature: its function, input column, slide (index), window in buckets, column slot, running set (or -1). */
    private record Aggregation(String function, int column, int slide, int span, int slot, int runningSet)
            implements Serializable {}

    /** Stats of one slide bucket: event count, and per tracked column exact totals, max, min or value counts. */
    public static final class Bucket {
        public long count;
        public long[] totals;
        public double[] max;
        public double[] min;
        public ArrayList<HashMap<Object, Integer>> distinct;

        public Bucket() {}

        Bucket(int numeric, int distinctColumns) {
            totals = new long[numeric];
            max = new double[numeric];
            min = new double[numeric];
            distinct = new ArrayList<>();
            for (int i = 0; i < distinctColumns; i++) {
                distinct.add(new HashMap<>());
            }
        }
    }

    /** All window state of one entity. Distinct counts are kept running (per aggregation) so an event costs O(1) for them. */
    public static final class Windows {
        public long latest;
        public long previous;
        public boolean hasPrevious;
        public long version;
        public long events;
        public ArrayList<TreeMap<Long, Bucket>> buckets;
        public ArrayList<HashMap<Object, Integer>> running;
        /** Per slide, the buckets changed since the entity's last online row; whether an event came since it. */
        public ArrayList<TreeSet<Long>> changed;
        public boolean pending;

        public Windows() {}
    }

    @Override
    public void open(OpenContext context) {
        state = getRuntimeContext().getState(new ValueStateDescriptor<>("windows", TypeInformation.of(Windows.class)));
    }

    @Override
    public void processElement(Row row, Context ctx, Collector<Row> out) throws Exception {
        long ts = (Long) row.getField(timeField);
        Windows w = state.value();
        long[] oldEnds = null;
        if (w == null) {
            w = new Windows();
            w.latest = ts;
            w.buckets = new ArrayList<>();
            for (int i = 0; i < slides.size(); i++) {
                w.buckets.add(new TreeMap<>());
            }
            w.running = new ArrayList<>();
            for (int i = 0; i < runningSets; i++) {
                w.running.add(new HashMap<>());
            }
        } else {
            oldEnds = bucketEnds(w.latest);
            if (ts > w.latest) {
                w.previous = w.latest;
                w.hasPrevious = true;
                w.latest = ts;
            } else if (ts < w.latest && (!w.hasPrevious || ts > w.previous)) {
                w.previous = ts;
                w.hasPrevious = true;
            }
        }
        if (w.changed == null) {  // a new entity, or the state of a job from before online rows were coalesced
            w.changed = new ArrayList<>();
            for (int i = 0; i < slides.size(); i++) {
                w.changed.add(new TreeSet<>());
            }
        }
        w.version = Math.max(w.version + 1, w.latest * 1000);
        w.events++;
        long[] ends = bucketEnds(w.latest);
        if (oldEnds != null) {
            slideRunningSets(w, oldEnds, ends);
        }
        absorb(w, row, ts, ends);
        w.pending = true;
        state.update(w);
        out.collect(features(ctx.getCurrentKey(), w, ends, false));
        // One timer per entity per interval: Flink keeps a single timer per key and time.
        long now = ctx.timerService().currentProcessingTime();
        ctx.timerService().registerProcessingTimeTimer((now / coalesceMs + 1) * coalesceMs);
    }

    @Override
    public void onTimer(long timestamp, OnTimerContext ctx, Collector<Row> out) throws Exception {
        Windows w = state.value();
        if (w == null || !w.pending) {
            return;
        }
        Row row = features(ctx.getCurrentKey(), w, bucketEnds(w.latest), true);
        for (int s = 0; s < slides.size(); s++) {
            List<byte[]> tiles = new ArrayList<>();
            TreeMap<Long, Bucket> buckets = w.buckets.get(s);
            for (long index : w.changed.get(s)) {
                Bucket b = buckets.get(index);  // gone when it left every window since it changed
                if (b != null) {
                    tiles.add(TileBytes.encode(index, b));
                }
            }
            row.setField(TILES + s, tiles.isEmpty() ? NO_TILE : TileBytes.frame(tiles));
            w.changed.get(s).clear();
        }
        ctx.output(online, row);
        w.pending = false;
        state.update(w);
    }

    private long[] bucketEnds(long latest) {
        long[] ends = new long[slides.size()];
        for (int i = 0; i < ends.length; i++) {
            ends[i] = latest / slides.get(i).lengthMs;
        }
        return ends;
    }

    /** Take the buckets that left each distinct-count window out of its running value counts. */
    private void slideRunningSets(Windows w, long[] oldEnds, long[] ends) {
        for (Aggregation a : aggregations) {
            if (a.runningSet() < 0 || oldEnds[a.slide()] == ends[a.slide()]) {
                continue;
            }
            HashMap<Object, Integer> running = w.running.get(a.runningSet());
            for (Bucket b : w.buckets.get(a.slide()).subMap(oldEnds[a.slide()] - a.span(), false, ends[a.slide()] - a.span(), true).values()) {
                for (Map.Entry<Object, Integer> e : b.distinct.get(a.slot()).entrySet()) {
                    running.computeIfPresent(e.getKey(), (k, n) -> n.equals(e.getValue()) ? null : n - e.getValue());
                }
            }
        }
    }

    /** Add the event to its bucket of each slide (where one is kept) and note the buckets it changed. */
    private void absorb(Windows w, Row row, long ts, long[] ends) {
        for (int s = 0; s < slides.size(); s++) {
            Slide slide = slides.get(s);
            long index = ts / slide.lengthMs;
            TreeMap<Long, Bucket> buckets = w.buckets.get(s);
            if (index > ends[s] - slide.keptBuckets) {  // older ones are outside every window already
                Bucket b = buckets.computeIfAbsent(index, i -> new Bucket(slide.numericColumns.size(), slide.distinctColumns.size()));
                for (int c = 0; c < slide.numericColumns.size(); c++) {
                    double value = ((Number) row.getField(slide.numericColumns.get(c))).doubleValue();
                    b.totals[c] += (long) Math.rint(value * scale);
                    b.max[c] = b.count == 0 ? value : Math.max(b.max[c], value);
                    b.min[c] = b.count == 0 ? value : Math.min(b.min[c], value);
                }
                for (int c = 0; c < slide.distinctColumns.size(); c++) {
                    b.distinct.get(c).merge(row.getField(slide.distinctColumns.get(c)), 1, Integer::sum);
                }
                b.count++;
                w.changed.get(s).add(index);
            }
            buckets.headMap(ends[s] - slide.keptBuckets, true).clear();
        }
        for (Aggregation a : aggregations) {
            if (a.runningSet() >= 0 && ts / slides.get(a.slide()).lengthMs > ends[a.slide()] - a.span()) {
                w.running.get(a.runningSet()).merge(row.getField(a.column()), 1, Integer::sum);
            }
        }
    }

    /** The entity's row as of its latest event, with no tiles; with {@code online}, with its tiles' marker. */
    private Row features(String entity, Windows w, long[] ends, boolean online) {
        int features = TILES + slides.size();
        Row out = new Row(features + aggregations.size());
        out.setField(0, entity);
        out.setField(1, w.version);
        out.setField(2, w.latest);
        out.setField(3, w.events);
        if (online) {
            StringBuilder marker = new StringBuilder().append(w.latest);
            for (int s = 0; s < slides.size(); s++) {
                Slide slide = slides.get(s);
                marker.append(',').append(slide.lengthMs).append(':').append(slide.keptBuckets).append(':')
                        .append(w.buckets.get(s).firstKey());
            }
            out.setField(4, marker.toString());
        }
        for (int s = 0; s < slides.size(); s++) {
            out.setField(TILES + s, NO_TILE);
        }
        for (int i = 0; i < aggregations.size(); i++) {
            out.setField(features + i, value(aggregations.get(i), w, ends));
        }
        return out;
    }

    private Object value(Aggregation a, Windows w, long[] ends) {
        switch (a.function()) {
            case "time_since_previous":
                return w.hasPrevious ? (w.latest - w.previous) / 1000.0 : null;
            case "count_distinct":
                return (long) w.running.get(a.runningSet()).size();
            default:
                break;
        }
        long count = 0;
        long total = 0;
        double max = Double.NEGATIVE_INFINITY;
        double min = Double.POSITIVE_INFINITY;
        for (Bucket b : w.buckets.get(a.slide()).subMap(ends[a.slide()] - a.span(), false, ends[a.slide()], true).values()) {
            count += b.count;
            if (a.slot() >= 0) {
                total += b.totals[a.slot()];
                max = Math.max(max, b.max[a.slot()]);
                min = Math.min(min, b.min[a.slot()]);
            }
        }
        if (a.function().equals("count")) {
            return count;
        }
        if (count == 0) {
            return null;
        }
        switch (a.function()) {
            case "sum":
                return (double) total / scale;
            case "mean":
                return (double) total / count / scale;
            case "max":
                return max;
            default:
                return min;
        }
    }
}
