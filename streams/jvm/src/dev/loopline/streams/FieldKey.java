package dev.loopline.streams;

import java.util.Arrays;

import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.types.Row;

/**
 * Keys a row by the text of some of its fields (by position): one field's text as it is; several fields' texts each
 * after its length and a colon ({@code 3:abc2:xy}), so no two different combinations make one key, and
 * {@link #parts} reads them back. No position puts every row under one key.
 */
public final class FieldKey implements KeySelector<Row, String> {
    private static final long serialVersionUID = 1L;
    private final int[] positions;

    public FieldKey(int... positions) {
        this.positions = positions.clone();
    }

    @Override
    public String getKey(Row row) {
        if (positions.length == 1) {
            return String.valueOf(row.getField(positions[0]));
        }
        StringBuilder key = new StringBuilder();
        for (int position : positions) {
            String part = String.valueOf(row.getField(position));
            key.append(part.length()).append(':').append(part);
        }
        return key.toString();
    }

    /** The field texts of a key this selector made of {@code count} fields. */
    public static String[] parts(String key, int count) {
        if (count == 1) {
            return new String[] {key};
        }
        String[] parts = new String[count];
        int at = 0;
        for (int i = 0; i < count; i++) {
            int colon = key.indexOf(':', at);
            int length = Integer.parseInt(key, at, colon, 10);
            parts[i] = key.substring(colon + 1, colon + 1 + length);
            at = colon + 1 + length;
        }
        return parts;
    }

    @Override
    public String toString() {
        return "FieldKey" + Arrays.toString(positions);
    }
}
