package dev.loopline.streams;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;

/**
 * Holds rows in keyed state and releases them all at once every {@code intervalMs} of processing
 * time, so the step after it (an offline file append) sees few, large batches. The rows are
 * checkpointed while held: a restart releases them later instead of losing them.
 */
public final class TimedBatches extends KeyedProcessFunction<String, Row, Row> {
    private static final long serialVersionUID = 1L;
    private final long intervalMs;
    private final TypeInformation<Row> rowType;
    private transient ListState<Row> held;
    private transient ValueState<Long> due;

    public TimedBatches(long intervalMs, TypeInformation<Row> rowType) {
        this.intervalMs = intervalMs;
        this.rowType = rowType;
    }

    @Override
    public void open(OpenContext context) {
        held = getRuntimeContext().getListState(new ListStateDescriptor<>("held", rowType));
        due = getRuntimeContext().getState(new ValueStateDescriptor<>("due", Types.LONG));
    }

    @Override
    public void processElement(Row row, Context ctx, Collector<Row> out) throws Exception {
        held.add(row);
        long now = ctx.timerService().currentProcessingTime();
        Long scheduled = due.value();
        // A timer scheduled before a restore may be gone with the old process: schedule again once it is overdue.
        if (scheduled == null || scheduled < now) {
            due.update(now + intervalMs);
            ctx.timerService().registerProcessingTimeTimer(now + intervalMs);
        }
    }

    @Override
    public void onTimer(long timestamp, OnTimerContext ctx, Collector<Row> out) throws Exception {
        for (Row row : held.get()) {
            out.collect(row);
        }
        held.clear();
        due.clear();
    }
}
