package dev.loopline.streams;

import org.apache.flink.streaming.api.functions.ProcessFunction;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

/**
 * Sends rows whose dead-letter field is set (the decoder's verdict, an encoded dead-letter record)
 * to the {@code deadLetters} side output, and every other row on.
 */
public final class DeadLetterSplit extends ProcessFunction<Row, Row> {
    private static final long serialVersionUID = 1L;
    private final int deadLetterField;
    private final OutputTag<String> deadLetters;

    public DeadLetterSplit(int deadLetterField, OutputTag<String> deadLetters) {
        this.deadLetterField = deadLetterField;
        this.deadLetters = deadLetters;
    }

    @Override
    public void processElement(Row row, Context ctx, Collector<Row> out) {
        Object deadLetter = row.getField(deadLetterField);
        if (deadLetter != null) {
            ctx.output(deadLetters, (String) deadLetter);
        } else {
            out.collect(row);
        }
    }
}
