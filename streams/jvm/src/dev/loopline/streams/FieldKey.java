package dev.loopline.streams;

import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.types.Row;

/** Keys a row by the text of one of its fields (by position); a negative position puts every row under one key. */
public final class FieldKey implements KeySelector<Row, String> {
    private static final long serialVersionUID = 1L;
    private final int position;

    public FieldKey(int position) {
        this.position = position;
    }

    @Override
    public String getKey(Row row) {
        return position < 0 ? "" : String.valueOf(row.getField(position));
    }
}
