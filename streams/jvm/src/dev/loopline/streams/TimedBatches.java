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
        // Timers are checkpointed with the state, so one scheduled before a restart still fires after it.
        if (due.value() == null) {
            long at = ctx.timerService().currentProcessingTime() + intervalMs;
            due.update(at);
            ctx.timerService().registerProcessingTimeTimer(at);
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
