package dev.loopline.streams;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.metrics.Counter;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

/**
 * Drops events that are late for their Kafka partition, keyed by partition.
 *
 * <p>The partition's watermark is the newest event time seen in it minus the allowed
 * out-of-orderness (the per-split watermark Flink's Kafka source keeps before merging
 * partitions). Unlike the merged watermark it does not depend on how fast the other partitions
 * happen to be read, so a replay reaches the same verdicts. Late rows go to the {@code late}
 * side output with how many milliseconds behind they were appended; they are counted in
 * {@code late_events}.
 */
public final class PartitionLateness extends KeyedProcessFunction<String, Row, Row> {
    private static final long serialVersionUID = 1L;
    private final int eventTimeField;
    private final long outOfOrdernessMs;
    private final OutputTag<Row> late;
    private transient ValueState<Long> newest;
    private transient Counter lateEvents;

    public PartitionLateness(int eventTimeField, long outOfOrdernessMs, OutputTag<Row> late) {
        this.eventTimeField = eventTimeField;
        this.outOfOrdernessMs = outOfOrdernessMs;
        this.late = late;
    }

    @Override
    public void open(OpenContext context) {
        newest = getRuntimeContext().getState(new ValueStateDescriptor<>("newest_event_time", Types.LONG));
        lateEvents = getRuntimeContext().getMetricGroup().counter("late_events");
    }

    @Override
    public void processElement(Row row, Context ctx, Collector<Row> out) throws Exception {
        long eventTime = (Long) row.getField(eventTimeField);
        Long seen = newest.value();
        if (seen != null && eventTime < seen - outOfOrdernessMs) {
            lateEvents.inc();
            Row behind = new Row(row.getArity() + 1);
            for (int i = 0; i < row.getArity(); i++) {
                behind.setField(i, row.getField(i));
            }
            behind.setField(row.getArity(), seen - outOfOrdernessMs - eventTime);
            ctx.output(late, behind);
            return;
        }
        if (seen == null || eventTime > seen) {
            newest.update(eventTime);
        }
        out.collect(row);
    }
}
