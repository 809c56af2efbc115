package dev.loopline.streams;

import java.io.Serializable;
import java.math.BigDecimal;
import java.math.MathContext;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.TreeMap;

import org.apache.flink.types.Row;

/**
 * The windows of one stream feature view: how an event changes an entity's tiles, and what its windows hold.
 *
 * <p>Semantics, shared with the offline recompute ({@code streams/recompute.py}) and the online read
 * ({@code feature_store/window_tiles.py}):
 * <ul>
 *   <li>An aggregation with window {@code W} and slide {@code S} keeps, per entity, one tile per slide of event
 *       time that holds events (tile {@code k}: events with {@code floor(ts / S) == k}): their count, and per
 *       aggregated column the exact total (integers of {@code 1/scale}, rounded half to even), the extremes, or the
 *       distinct values.
 *   <li>Read with head tile {@code h}, the window covers the tiles {@code (h - W/S, h]}. At the entity's latest
 *       event {@code T} the head is {@code floor(T / S)}: these are the finished values of the rows.
 *   <li>{@code time_since_previous} is the seconds between {@code T} and the entity's latest earlier event time.
 *   <li>{@code last} is the column's value in the entity's latest event that has one (of events at the same
 *       millisecond, the greatest value: strings in UTF-16 order, numbers as {@link Double#compare}, false before
 *       true), so it depends on the set of events, not on their arrival order.
 *   <li>With the view's {@code ttl} ({@code ttlMs} above 0) both look back that far only: {@code time_since_previous}
 *       is none when the earlier event is more than {@code ttl} before {@code T}, {@code last} none when the event that
 *       has one is. So an entity silent for longer is a new one ({@link SlidingWindows} lets it leave the state).
 * </ul>
 *
 * <p>Steps: a request read at time {@code t >= T} has head {@code floor(t / S)}; no event lies after {@code T}, so
 * the window holds a suffix of the tiles the finished value holds, and its value changes only when a tile with
 * events leaves it. For each window (the aggregations sharing a slide and a length), {@link #steps} lists these
 * values: one step per tile {@code k} with events inside the window at {@code T}, oldest first, holding the window
 * over the tiles from {@code k} to the newest, valid for heads below {@code k + W/S}. A read takes the first step
 * valid for its head; past the last, the window is empty. So the store needs no tile at read time: the merge of
 * every suffix is done here, once per online row.
 *
 * <p>Distinct values are counted exactly, and additively: each value is counted in the newest tile it occurs in
 * ({@code Bucket.newest}), so a window's distinct count is the sum over its tiles, and a suffix costs one addition
 * per tile however many values the tiles hold.
 *
 * <p>The aggregations come as text, one per {@code ;}: {@code name,function,column,window_ms,slide_ms} with the
 * column as a position in the input row ({@code window_ms} and {@code slide_ms} are 0 for
 * {@code time_since_previous} and {@code last}).
 */
public final class WindowPlan implements Serializable {
    private static final long serialVersionUID = 1L;
    /** Totals up to this magnitude divide exactly as doubles; larger ones go through BigDecimal. */
    private static final long EXACT_IN_DOUBLE = 1L << 53;
    private static final MathContext QUOTIENT = new MathContext(60);

    private final int timeField;
    private final long scale;
    private final long ttlMs;
    private final List<Aggregation> aggregations = new ArrayList<>();
    /** Per distinct slide length: its length, the most tiles any window keeps, and the columns it tracks. */
    private final List<Slide> slides = new ArrayList<>();
    /** The windows (slide and length) of the aggregations, in order of first appearance; each with its aggregations. */
    private final List<Window> windows = new ArrayList<>();
    /** How many aggregations are {@code last}: each keeps its value in the state. */
    private int lasts;

    /** {@code ttlMs}: how far back {@code time_since_previous} and {@code last} look (the class's javadoc); 0 for ever. */
    public WindowPlan(String aggregationSpec, int timeField, long scale, long ttlMs) {
        this.timeField = timeField;
        this.scale = scale;
        this.ttlMs = ttlMs;
        for (String item : aggregationSpec.split(";")) {
            String[] part = item.split(",");
            Aggregation a = place(part[1], Integer.parseInt(part[2]), Long.parseLong(part[3]), Long.parseLong(part[4]));
            aggregations.add(a);
            if (a.slide() >= 0) {
                window(a.slide(), a.span()).aggregations.add(a);
            }
        }
    }

    /** The aggregation with its slide, and the slot of its column among the slide's tracked columns. */
    private Aggregation place(String function, int column, long windowMs, long slideMs) {
        if (function.equals("time_since_previous")) {
            return new Aggregation(aggregations.size(), function, column, -1, 0, -1);
        }
        if (function.equals("last")) {
            return new Aggregation(aggregations.size(), function, column, -1, 0, lasts++);
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
        slide.keptTiles = Math.max(slide.keptTiles, span);
        if (function.equals("count")) {
            return new Aggregation(aggregations.size(), function, column, index, span, -1);
        }
        List<Integer> columns = function.equals("count_distinct") ? slide.distinctColumns : slide.numericColumns;
        if (!columns.contains(column)) {
            columns.add(column);
        }
        return new Aggregation(aggregations.size(), function, column, index, span, columns.indexOf(column));
    }

    private Window window(int slide, int span) {
        for (Window w : windows) {
            if (w.slide == slide && w.span == span) {
                return w;
            }
        }
        Window w = new Window(slide, span);
        windows.add(w);
        return w;
    }

    private static final class Slide implements Serializable {
        private static final long serialVersionUID = 1L;
        final long lengthMs;
        int keptTiles;
        final List<Integer> numericColumns = new ArrayList<>();
        final List<Integer> distinctColumns = new ArrayList<>();

        Slide(long lengthMs) {
            this.lengthMs = lengthMs;
        }
    }

    /** One feature: its position among the view's, function, input column, slide (index, or -1), window in tiles, and
     * column slot (or -1). */
    private record Aggregation(int index, String function, int column, int slide, int span, int slot) implements Serializable {}

    /** The aggregations sharing one slide and window length: one list of steps in the store. */
    private static final class Window implements Serializable {
        private static final long serialVersionUID = 1L;
        final int slide;
        final int span;
        final List<Aggregation> aggregations = new ArrayList<>();

        Window(int slide, int span) {
            this.slide = slide;
            this.span = span;
        }
    }

    /** One tile: event count, per numeric column exact total and extremes, per distinct column its values and how many
     * of them occur in no newer tile. */
    public static final class Bucket {
        public long count;
        public long[] totals;
        public double[] max;
        public double[] min;
        public ArrayList<HashSet<Object>> distinct;
        public long[] newest;

        public Bucket() {}

        Bucket(int numeric, int distinctColumns) {
            totals = new long[numeric];
            max = new double[numeric];
            min = new double[numeric];
            newest = new long[distinctColumns];
            distinct = new ArrayList<>();
            for (int i = 0; i < distinctColumns; i++) {
                distinct.add(new HashSet<>());
            }
        }
    }

    /** All window state of one entity (the operator's keyed state). */
    public static final class Windows {
        public long latest;
        public long previous;
        public boolean hasPrevious;
        public long version;
        public long events;
        /** Per slide, its tiles by index. */
        public ArrayList<TreeMap<Long, Bucket>> buckets;
        /** Per slide and distinct column (in slide order), the newest tile each value occurs in. */
        public ArrayList<HashMap<Object, Long>> newestTile;
        /** Whether an event came since the entity's last online row. */
        public boolean pending;
        /** Per {@code last} aggregation: its value (null: no event had one yet), and that event's time. */
        public Object[] lastValues;
        public long[] lastTimes;
        /** Per partition of the view's topic (by number), one more than the offset of the last event absorbed from it
         * (0: none): the events behind the entity's row, exactly, as the log has them. */
        public long[] absorbed = new long[0];

        public Windows() {}

        /** Note the event at {@code offset} of {@code partition} as absorbed (a partition's events come in order). */
        public void absorbedAt(int partition, long offset) {
            if (partition >= absorbed.length) {
                absorbed = java.util.Arrays.copyOf(absorbed, partition + 1);
            }
            absorbed[partition] = Math.max(absorbed[partition], offset + 1);
        }

        /** The partitions it absorbed events from. */
        public int[] absorbedPartitions() {
            return java.util.stream.IntStream.range(0, absorbed.length).filter(p -> absorbed[p] > 0).toArray();
        }

        /** The absorbed positions as the online row carries them: {@code partition:offset} of each partition's last
         * absorbed event, comma-separated, by partition. */
        public String absorbedPositions() {
            StringBuilder text = new StringBuilder();
            for (int p = 0; p < absorbed.length; p++) {
                if (absorbed[p] > 0) {
                    text.append(text.length() == 0 ? "" : ",").append(p).append(':').append(absorbed[p] - 1);
                }
            }
            return text.toString();
        }
    }

    /** A new entity's state, before its first event. */
    public Windows newState(long firstEventTime) {
        Windows w = new Windows();
        w.latest = firstEventTime;
        w.lastValues = new Object[lasts];
        w.lastTimes = new long[lasts];
        w.buckets = new ArrayList<>();
        w.newestTile = new ArrayList<>();
        for (Slide slide : slides) {
            w.buckets.add(new TreeMap<>());
            for (int c = 0; c < slide.distinctColumns.size(); c++) {
                w.newestTile.add(new HashMap<>());
            }
        }
        return w;
    }

    /** The event time of an input row. */
    public long eventTime(Row row) {
        return (Long) row.getField(timeField);
    }

    /** Why an event cannot be absorbed: the position of its column at fault in the input row, and why. */
    public record Refusal(int column, String why) {}

    /**
     * Why {@code row} cannot be absorbed into {@code w}, or null when it can. A tile's total (integers of
     * {@code 1/scale}) may reach {@code Long.MAX_VALUE / keptTiles} of its slide and no further, so that every
     * window's sum over its tiles stays exact in a long: an event whose value would take a tile past that is refused,
     * not wrapped. Checked before {@link #absorb} changes anything, so a refused event leaves the state as it was.
     * Which event of a tile near the bound is refused depends on the order the tile's events come in.
     */
    public Refusal refusal(Windows w, Row row) {
        long ts = eventTime(row);
        long latest = Math.max(w.latest, ts);
        for (int s = 0; s < slides.size(); s++) {
            Slide slide = slides.get(s);
            long index = ts / slide.lengthMs;
            if (index < latest / slide.lengthMs - slide.keptTiles + 1) {
                continue;  // too old for any window: absorb drops it
            }
            Bucket b = w.buckets.get(s).get(index);
            long limit = Long.MAX_VALUE / slide.keptTiles;
            for (int c = 0; c < slide.numericColumns.size(); c++) {
                int column = slide.numericColumns.get(c);
                double value = ((Number) row.getField(column)).doubleValue();
                long scaled = (long) Math.rint(value * scale);
                long total;
                try {
                    total = Math.addExact(b == null ? 0 : b.totals[c], scaled);
                } catch (ArithmeticException wrapped) {
                    total = Long.MIN_VALUE;
                }
                if (total == Long.MIN_VALUE || Math.abs(total) > limit) {
                    return new Refusal(column, String.format(java.util.Locale.ROOT,
                            "%s would take the total of its %d ms tile past ±%.6g, the most a window of %d tiles sums exactly",
                            BigDecimal.valueOf(value).toPlainString(), slide.lengthMs, (double) limit / scale, slide.keptTiles));
                }
            }
        }
        return null;
    }

    /**
     * Absorb one event: the entity's latest and previous event times, its row version ({@code T} in microseconds, or
     * one more than the last version when that is larger, so it grows with every event), its event count, and the
     * tile of each slide the event falls in (when that tile is still inside some window; older tiles are dropped).
     */
    public void absorb(Windows w, Row row) {
        long ts = eventTime(row);
        if (ts > w.latest) {
            w.previous = w.latest;
            w.hasPrevious = true;
            w.latest = ts;
        } else if (ts < w.latest && (!w.hasPrevious || ts > w.previous)) {
            w.previous = ts;
            w.hasPrevious = true;
        }
        w.version = Math.max(w.version + 1, w.latest * 1000);
        w.events++;
        for (Aggregation a : aggregations) {
            if (a.function().equals("last")) {
                Object value = row.getField(a.column());
                Object held = w.lastValues[a.slot()];
                long at = w.lastTimes[a.slot()];
                if (value != null && (held == null || ts > at || (ts == at && greater(value, held)))) {
                    w.lastValues[a.slot()] = value;
                    w.lastTimes[a.slot()] = ts;
                }
            }
        }
        int sets = 0;
        for (int s = 0; s < slides.size(); s++) {
            Slide slide = slides.get(s);
            TreeMap<Long, Bucket> buckets = w.buckets.get(s);
            long oldest = w.latest / slide.lengthMs - slide.keptTiles + 1;
            long index = ts / slide.lengthMs;
            if (index >= oldest) {
                Bucket b = buckets.computeIfAbsent(index, i -> new Bucket(slide.numericColumns.size(), slide.distinctColumns.size()));
                for (int c = 0; c < slide.numericColumns.size(); c++) {
                    double value = ((Number) row.getField(slide.numericColumns.get(c))).doubleValue();
                    b.totals[c] += (long) Math.rint(value * scale);
                    b.max[c] = b.count == 0 ? value : Math.max(b.max[c], value);
                    b.min[c] = b.count == 0 ? value : Math.min(b.min[c], value);
                }
                for (int c = 0; c < slide.distinctColumns.size(); c++) {
                    Object value = row.getField(slide.distinctColumns.get(c));
                    b.distinct.get(c).add(value);
                    HashMap<Object, Long> newest = w.newestTile.get(sets + c);
                    Long before = newest.get(value);
                    if (before == null || before < index) {
                        if (before != null) {
                            buckets.get(before).newest[c]--;
                        }
                        b.newest[c]++;
                        newest.put(value, index);
                    }
                }
                b.count++;
            }
            NavigableMap<Long, Bucket> gone = buckets.headMap(oldest, false);
            for (Map.Entry<Long, Bucket> e : gone.entrySet()) {
                for (int c = 0; c < slide.distinctColumns.size(); c++) {
                    HashMap<Object, Long> newest = w.newestTile.get(sets + c);
                    for (Object value : e.getValue().distinct.get(c)) {
                        newest.remove(value, e.getKey());
                    }
                }
            }
            gone.clear();
            sets += slide.distinctColumns.size();
        }
    }

    /** Whether an event at ``at`` is within the ttl before the entity's latest event. */
    private boolean within(Windows w, long at) {
        return ttlMs <= 0 || w.latest - at <= ttlMs;
    }

    /** Every aggregation's value as of the entity's latest event (Long for counts, Double or null otherwise). */
    public Object[] finished(Windows w) {
        Object[] values = new Object[aggregations.size()];
        for (Window window : windows) {
            long head = w.latest / slides.get(window.slide).lengthMs;
            Totals totals = new Totals(slides.get(window.slide));
            for (Bucket b : w.buckets.get(window.slide).subMap(head - window.span, false, head, true).values()) {
                totals.add(b);
            }
            for (Aggregation a : window.aggregations) {
                values[a.index()] = totals.value(a);
            }
        }
        for (Aggregation a : aggregations) {
            if (a.function().equals("last")) {
                values[a.index()] = within(w, w.lastTimes[a.slot()]) ? w.lastValues[a.slot()] : null;
            } else if (a.slide() < 0) {
                values[a.index()] = w.hasPrevious && within(w, w.previous) ? (w.latest - w.previous) / 1000.0 : null;
            }
        }
        return values;
    }

    /** Whether {@code a} orders after {@code b} (two values of one column): strings by UTF-16 units, numbers as
     * {@link Double#compare} (integers as longs), false before true. */
    @SuppressWarnings({"unchecked", "rawtypes"})
    private static boolean greater(Object a, Object b) {
        if (a instanceof Double x) {
            return Double.compare(x, (Double) b) > 0;
        }
        return ((Comparable) a).compareTo(b) > 0;
    }

    /**
     * Each window's steps (the class's javadoc), in window order: little-endian, the entity's latest event time
     * {@code T} (int64 ms), then each step's bound (the head tile from which it no longer holds, int64), oldest step
     * first, then each step's values, one per aggregation of the window in declaration order (int64 for counts,
     * float64 otherwise).
     */
    public byte[][] steps(Windows w) {
        byte[][] encoded = new byte[windows.size()][];
        for (int i = 0; i < windows.size(); i++) {
            Window window = windows.get(i);
            Slide slide = slides.get(window.slide);
            long head = w.latest / slide.lengthMs;
            NavigableMap<Long, Bucket> inside = w.buckets.get(window.slide).subMap(head - window.span, false, head, true);
            int steps = inside.size();
            int width = window.aggregations.size();
            ByteBuffer out = ByteBuffer.allocate(8 + 8 * steps * (1 + width)).order(ByteOrder.LITTLE_ENDIAN);
            out.putLong(0, w.latest);
            Totals totals = new Totals(slide);
            int step = steps - 1;
            for (Map.Entry<Long, Bucket> e : inside.descendingMap().entrySet()) {
                totals.add(e.getValue());
                out.putLong(8 + 8 * step, e.getKey() + window.span);
                int at = 8 + 8 * (steps + step * width);
                for (Aggregation a : window.aggregations) {
                    Object value = totals.value(a);
                    if (value instanceof Long n) {
                        out.putLong(at, n);
                    } else {
                        out.putDouble(at, (Double) value);
                    }
                    at += 8;
                }
                step--;
            }
            encoded[i] = out.array();
        }
        return encoded;
    }

    /** The sums of some tiles of one slide: counts, exact totals, extremes, and distinct values counted once. */
    private final class Totals {
        long count;
        final long[] totals;
        final double[] max;
        final double[] min;
        final long[] distinct;

        Totals(Slide slide) {
            totals = new long[slide.numericColumns.size()];
            max = new double[totals.length];
            min = new double[totals.length];
            distinct = new long[slide.distinctColumns.size()];
        }

        void add(Bucket b) {
            for (int c = 0; c < totals.length; c++) {
                totals[c] += b.totals[c];
                max[c] = count == 0 ? b.max[c] : Math.max(max[c], b.max[c]);
                min[c] = count == 0 ? b.min[c] : Math.min(min[c], b.min[c]);
            }
            for (int c = 0; c < distinct.length; c++) {
                distinct[c] += b.newest[c];
            }
            count += b.count;
        }

        Object value(Aggregation a) {
            switch (a.function()) {
                case "count":
                    return count;
                case "count_distinct":
                    return distinct[a.slot()];
                default:
                    break;
            }
            if (count == 0) {
                return null;
            }
            switch (a.function()) {
                case "sum":
                    return quotient(totals[a.slot()], scale);
                case "mean":
                    return quotient(totals[a.slot()], count) / scale;
                case "max":
                    return max[a.slot()];
                default:
                    return min[a.slot()];
            }
        }
    }

    /**
     * {@code total / divisor} rounded once to a double, as Python divides two integers (the recompute does): a total
     * beyond 2^53 is not exact as a double, so it is divided as a decimal first.
     */
    private static double quotient(long total, long divisor) {
        if (Math.abs(total) < EXACT_IN_DOUBLE) {
            return (double) total / divisor;
        }
        return new BigDecimal(total).divide(BigDecimal.valueOf(divisor), QUOTIENT).doubleValue();
    }
}
