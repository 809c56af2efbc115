package dev.loopline.streams;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.TreeMap;

import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSchemaCompatibility;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.base.TypeSerializerSingleton;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputView;
import org.apache.flink.types.StringValue;

/**
 * The keyed state of {@link SlidingWindows} ({@link WindowPlan.Windows}) in a flat binary form, and its deep copy.
 *
 * <p>Flink's own serializer for it is a POJO serializer whose maps and sets go through Kryo: every checkpoint's
 * asynchronous snapshot wrote each entity through Kryo's reflection, and while it ran, every entity the job touched
 * was first copied through Kryo (the heap backend's copy-on-write), on the cores the events need, in a form that is
 * Kryo's rather than the job's. Here both are plain loops over the tiles, and the form is this class's: a state
 * checkpointed by the former cannot be restored by it: start the job once without its checkpoint
 * ({@code loopline stream submit --no-restore}), which rebuilds the windows from the retained events.
 *
 * <p>Form: the entity's latest and previous event times, whether it has a previous one, its version, events and
 * pending flag; each {@code last} aggregation's value and time; per slide, its tiles (index, count, per numeric column total, max and min, per distinct column its
 * values and how many are newest there); per slide and distinct column, each value's newest tile. A distinct value is
 * a tag and the value: null, a string, a long, an int, a double or a boolean (the types of the job's columns).
 */
public final class WindowsSerializer extends TypeSerializerSingleton<WindowPlan.Windows> {
    private static final long serialVersionUID = 1L;
    public static final WindowsSerializer INSTANCE = new WindowsSerializer();

    private static final byte NULL = 0, STRING = 1, LONG = 2, INT = 3, DOUBLE = 4, BOOLEAN = 5;

    @Override
    public boolean isImmutableType() {
        return false;
    }

    @Override
    public WindowPlan.Windows createInstance() {
        WindowPlan.Windows w = new WindowPlan.Windows();
        w.buckets = new ArrayList<>();
        w.newestTile = new ArrayList<>();
        w.lastValues = new Object[0];
        w.lastTimes = new long[0];
        w.absorbed = new long[0];
        return w;
    }

    @Override
    public WindowPlan.Windows copy(WindowPlan.Windows from) {
        WindowPlan.Windows to = new WindowPlan.Windows();
        to.latest = from.latest;
        to.previous = from.previous;
        to.hasPrevious = from.hasPrevious;
        to.version = from.version;
        to.events = from.events;
        to.pending = from.pending;
        to.lastValues = from.lastValues.clone();  // the values are immutable
        to.lastTimes = from.lastTimes.clone();
        to.absorbed = from.absorbed.clone();
        to.buckets = new ArrayList<>(from.buckets.size());
        for (TreeMap<Long, WindowPlan.Bucket> tiles : from.buckets) {
            TreeMap<Long, WindowPlan.Bucket> copied = new TreeMap<>();
            for (Map.Entry<Long, WindowPlan.Bucket> e : tiles.entrySet()) {
                copied.put(e.getKey(), copy(e.getValue()));
            }
            to.buckets.add(copied);
        }
        to.newestTile = new ArrayList<>(from.newestTile.size());
        for (HashMap<Object, Long> newest : from.newestTile) {
            to.newestTile.add(new HashMap<>(newest));  // keys and values are immutable
        }
        return to;
    }

    private static WindowPlan.Bucket copy(WindowPlan.Bucket from) {
        WindowPlan.Bucket to = new WindowPlan.Bucket();
        to.count = from.count;
        to.totals = from.totals.clone();
        to.max = from.max.clone();
        to.min = from.min.clone();
        to.newest = from.newest.clone();
        to.distinct = new ArrayList<>(from.distinct.size());
        for (HashSet<Object> values : from.distinct) {
            to.distinct.add(new HashSet<>(values));
        }
        return to;
    }

    @Override
    public WindowPlan.Windows copy(WindowPlan.Windows from, WindowPlan.Windows reuse) {
        return copy(from);
    }

    @Override
    public int getLength() {
        return -1;
    }

    @Override
    public void serialize(WindowPlan.Windows w, DataOutputView out) throws IOException {
        out.writeLong(w.latest);
        out.writeLong(w.previous);
        out.writeBoolean(w.hasPrevious);
        out.writeLong(w.version);
        out.writeLong(w.events);
        out.writeBoolean(w.pending);
        out.writeInt(w.lastValues.length);
        for (int i = 0; i < w.lastValues.length; i++) {
            writeValue(w.lastValues[i], out);
            out.writeLong(w.lastTimes[i]);
        }
        out.writeInt(w.absorbed.length);
        for (long position : w.absorbed) {
            out.writeLong(position);
        }
        out.writeInt(w.buckets.size());
        for (TreeMap<Long, WindowPlan.Bucket> tiles : w.buckets) {
            out.writeInt(tiles.size());
            for (Map.Entry<Long, WindowPlan.Bucket> e : tiles.entrySet()) {
                out.writeLong(e.getKey());
                serialize(e.getValue(), out);
            }
        }
        out.writeInt(w.newestTile.size());
        for (HashMap<Object, Long> newest : w.newestTile) {
            out.writeInt(newest.size());
            for (Map.Entry<Object, Long> e : newest.entrySet()) {
                writeValue(e.getKey(), out);
                out.writeLong(e.getValue());
            }
        }
    }

    private static void serialize(WindowPlan.Bucket b, DataOutputView out) throws IOException {
        out.writeLong(b.count);
        out.writeInt(b.totals.length);
        for (int c = 0; c < b.totals.length; c++) {
            out.writeLong(b.totals[c]);
            out.writeDouble(b.max[c]);
            out.writeDouble(b.min[c]);
        }
        out.writeInt(b.distinct.size());
        for (int c = 0; c < b.distinct.size(); c++) {
            out.writeLong(b.newest[c]);
            out.writeInt(b.distinct.get(c).size());
            for (Object value : b.distinct.get(c)) {
                writeValue(value, out);
            }
        }
    }

    @Override
    public WindowPlan.Windows deserialize(DataInputView in) throws IOException {
        WindowPlan.Windows w = new WindowPlan.Windows();
        w.latest = in.readLong();
        w.previous = in.readLong();
        w.hasPrevious = in.readBoolean();
        w.version = in.readLong();
        w.events = in.readLong();
        w.pending = in.readBoolean();
        int lasts = in.readInt();
        w.lastValues = new Object[lasts];
        w.lastTimes = new long[lasts];
        for (int i = 0; i < lasts; i++) {
            w.lastValues[i] = readValue(in);
            w.lastTimes[i] = in.readLong();
        }
        w.absorbed = new long[in.readInt()];
        for (int p = 0; p < w.absorbed.length; p++) {
            w.absorbed[p] = in.readLong();
        }
        int slides = in.readInt();
        w.buckets = new ArrayList<>(slides);
        for (int s = 0; s < slides; s++) {
            TreeMap<Long, WindowPlan.Bucket> tiles = new TreeMap<>();
            for (int n = in.readInt(); n > 0; n--) {
                long index = in.readLong();
                tiles.put(index, deserializeBucket(in));
            }
            w.buckets.add(tiles);
        }
        int sets = in.readInt();
        w.newestTile = new ArrayList<>(sets);
        for (int s = 0; s < sets; s++) {
            int size = in.readInt();
            HashMap<Object, Long> newest = new HashMap<>(Math.max(16, size * 4 / 3 + 1));
            for (int n = 0; n < size; n++) {
                Object value = readValue(in);
                newest.put(value, in.readLong());
            }
            w.newestTile.add(newest);
        }
        return w;
    }

    private static WindowPlan.Bucket deserializeBucket(DataInputView in) throws IOException {
        WindowPlan.Bucket b = new WindowPlan.Bucket();
        b.count = in.readLong();
        int numeric = in.readInt();
        b.totals = new long[numeric];
        b.max = new double[numeric];
        b.min = new double[numeric];
        for (int c = 0; c < numeric; c++) {
            b.totals[c] = in.readLong();
            b.max[c] = in.readDouble();
            b.min[c] = in.readDouble();
        }
        int distinctColumns = in.readInt();
        b.newest = new long[distinctColumns];
        b.distinct = new ArrayList<>(distinctColumns);
        for (int c = 0; c < distinctColumns; c++) {
            b.newest[c] = in.readLong();
            int size = in.readInt();
            HashSet<Object> values = new HashSet<>(Math.max(16, size * 4 / 3 + 1));
            for (int n = 0; n < size; n++) {
                values.add(readValue(in));
            }
            b.distinct.add(values);
        }
        return b;
    }

    @Override
    public WindowPlan.Windows deserialize(WindowPlan.Windows reuse, DataInputView in) throws IOException {
        return deserialize(in);
    }

    @Override
    public void copy(DataInputView in, DataOutputView out) throws IOException {
        serialize(deserialize(in), out);
    }

    private static void writeValue(Object value, DataOutputView out) throws IOException {
        if (value == null) {
            out.writeByte(NULL);
        } else if (value instanceof String s) {
            out.writeByte(STRING);
            StringValue.writeString(s, out);
        } else if (value instanceof Long l) {
            out.writeByte(LONG);
            out.writeLong(l);
        } else if (value instanceof Integer i) {
            out.writeByte(INT);
            out.writeInt(i);
        } else if (value instanceof Double d) {
            out.writeByte(DOUBLE);
            out.writeDouble(d);
        } else if (value instanceof Boolean b) {
            out.writeByte(BOOLEAN);
            out.writeBoolean(b);
        } else {
            throw new IOException("a value of type " + value.getClass().getName() + " cannot be checkpointed: "
                    + "count_distinct and last take string, integer, floating-point or boolean columns");
        }
    }

    private static Object readValue(DataInputView in) throws IOException {
        byte tag = in.readByte();
        return switch (tag) {
            case NULL -> null;
            case STRING -> StringValue.readString(in);
            case LONG -> in.readLong();
            case INT -> in.readInt();
            case DOUBLE -> in.readDouble();
            case BOOLEAN -> in.readBoolean();
            default -> throw new IOException("corrupt window state: unknown value tag " + tag);
        };
    }

    @Override
    public TypeSerializerSnapshot<WindowPlan.Windows> snapshotConfiguration() {
        return new Snapshot();
    }

    /** Which layout of the state a checkpoint holds: a checkpoint of another layout (an earlier Loopline's) is refused
     * when the job is restored from it, rather than misread; the job then starts once with {@code --no-restore}. */
    public static final class Snapshot implements TypeSerializerSnapshot<WindowPlan.Windows> {
        /** 4: with the {@code last} values and the absorbed log positions (3 was the layout before them, written by
         * Flink's SimpleTypeSerializerSnapshot, whose version was 3). */
        static final int LAYOUT = 4;
        private int read = LAYOUT;

        public Snapshot() {}

        @Override
        public int getCurrentVersion() {
            return LAYOUT;
        }

        @Override
        public void writeSnapshot(DataOutputView out) {}

        @Override
        public void readSnapshot(int readVersion, DataInputView in, ClassLoader classLoader) {
            read = readVersion;
        }

        @Override
        public TypeSerializer<WindowPlan.Windows> restoreSerializer() {
            return INSTANCE;
        }

        @Override
        public TypeSerializerSchemaCompatibility<WindowPlan.Windows> resolveSchemaCompatibility(
                TypeSerializerSnapshot<WindowPlan.Windows> old) {
            return old instanceof Snapshot written && written.read == LAYOUT ? TypeSerializerSchemaCompatibility.compatibleAsIs()
                    : TypeSerializerSchemaCompatibility.incompatible();
        }
    }
}
