package dev.loopline.streams;

import org.apache.flink.streaming.api.operators.AbstractStreamOperator;
import org.apache.flink.streaming.api.operators.OneInputStreamOperator;
import org.apache.flink.streaming.api.watermark.Watermark;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;
import org.apache.flink.streaming.runtime.watermarkstatus.WatermarkStatus;

/**
 * Marks, every {@code intervalMs} of processing time, how far the raw records have been read: a watermark whose value
 * is the read time, behind every record this subtask passed on before it. Flink carries watermarks in band, behind
 * the records before them on every channel and through every operator (each takes the least over its inputs), so an
 * operator that has seen mark {@code M} has seen every record read before {@code M} by every subtask upstream.
 *
 * <p>The feature job uses them as such, not as event time: the windows send their entities' pending rows when a mark
 * passes ({@link SlidingWindows}), the decoder says how far it read each partition ({@link EventDecoder}), the row
 * sink tells which marks its rows reached Redis behind ({@link OnlineRowSink}), and the progress publisher pairs the
 * two ({@link ProgressSink}), so the progress it publishes is of rows written, never of records merely read. Records
 * pass unchanged; the source's own watermarks and idleness (none, for the job's Kafka table) are not passed on, so a
 * subtask with no partition still marks its channels.
 */
public final class ReadMarks extends AbstractStreamOperator<Object> implements OneInputStreamOperator<Object, Object> {
    private static final long serialVersionUID = 1L;
    private final long intervalMs;
    private transient long last;

    public ReadMarks(long intervalMs) {
        this.intervalMs = intervalMs;
    }

    @Override
    public void open() throws Exception {
        super.open();
        last = Long.MIN_VALUE;
        schedule();
    }

    @Override
    public void processElement(StreamRecord<Object> record) {
        output.collect(record);
    }

    @Override
    public void processWatermark(Watermark mark) {
        if (mark.getTimestamp() == Long.MAX_VALUE) {  // the end of a bounded input: every timer downstream fires
            output.emitWatermark(mark);
        }
    }

    @Override
    public void processWatermarkStatus(WatermarkStatus status) {}

    private void schedule() {
        long now = getProcessingTimeService().getCurrentProcessingTime();
        getProcessingTimeService().registerTimer(now + intervalMs, at -> {
            // Strictly increasing, so each mark moves every operator's watermark (and fires its timers) on.
            last = Math.max(last + 1, getProcessingTimeService().getCurrentProcessingTime());
            output.emitWatermark(new Watermark(last));
            schedule();
        });
    }
}
