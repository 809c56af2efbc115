package dev.loopline.feedback;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.metrics.Counter;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;

/**
 * Joins predictions with their labels by event id (keyed by event id), in event time.
 *
 * <p>Input rows are {@code (kind, event_id, json, ...)}: kind {@code "p"} for a prediction, {@code "l"}
 * for a label; a row's time is its record's event time (when the prediction was logged, when the
 * label was published), and the watermark decides when a horizon has passed. Output rows are
 * {@code (event_id, prediction_json, label_json)}, one per scored event:
 * <ul>
 *   <li>as soon as both are there, if the label came within {@code horizonMs} of the prediction
 *       (a label may come first: it waits, as long as the horizon, for its prediction);
 *   <li>else when the watermark passes the prediction's time plus the horizon, with no label
 *       ({@code label_json} null): the event is unlabeled at the horizon.
 * </ul>
 * A second prediction of the same event (a retried request) and a second label are ignored: each
 * event yields one example. The state of an event is kept for two horizons after it was settled
 * (by the watermark), so late duplicates are still recognised, then cleared. Counters:
 * {@code examples_labeled}, {@code examples_unlabeled}, {@code labels_too_late},
 * {@code labels_without_prediction}, {@code duplicates_ignored}.
 */
public final class FeedbackJoin extends KeyedProcessFunction<String, Row, Row> {
    private static final long serialVersionUID = 1L;

    private final long horizonMs;
    private transient ValueState<Pending> state;
    private transient Counter labeled;
    private transient Counter unlabeled;
    private transient Counter labelsTooLate;
    private transient Counter labelsWithoutPrediction;
    private transient Counter duplicates;

    public FeedbackJoin(long horizonMs) {
        this.horizonMs = horizonMs;
    }

    /** What is known of one event: its prediction, its label, and whether its example was emitted. */
    public static final class Pending {
        public String prediction;
        public long predictedAt;
        public String label;
        public long labelledAt;
        public boolean settled;
        public long clearAt;

        public Pending() {}
    }

    @Override
    public void open(OpenContext context) {
        state = getRuntimeContext().getState(new ValueStateDescriptor<>("pending", TypeInformation.of(Pending.class)));
        labeled = getRuntimeContext().getMetricGroup().counter("examples_labeled");
        unlabeled = getRuntimeContext().getMetricGroup().counter("examples_unlabeled");
        labelsTooLate = getRuntimeContext().getMetricGroup().counter("labels_too_late");
        labelsWithoutPrediction = getRuntimeContext().getMetricGroup().counter("labels_without_prediction");
        duplicates = getRuntimeContext().getMetricGroup().counter("duplicates_ignored");
    }

    @Override
    public void processElement(Row row, Context ctx, Collector<Row> out) throws Exception {
        String kind = (String) row.getField(0);
        String json = (String) row.getField(2);
        long time = ctx.timestamp();
        Pending p = state.value();
        if (p == null) {
            p = new Pending();
        }
        if (p.settled) {
            duplicates.inc();
            return;
        }
        if (kind.equals("p")) {
            if (p.prediction != null) {
                duplicates.inc();
                return;
            }
            p.prediction = json;
            p.predictedAt = time;
            ctx.timerService().registerEventTimeTimer(p.predictedAt + horizonMs);
        } else {
            if (p.label != null) {
                duplicates.inc();
                return;
            }
            p.label = json;
            p.labelledAt = time;
            if (p.prediction == null) {
                ctx.timerService().registerEventTimeTimer(p.labelledAt + horizonMs);
            }
        }
        if (p.prediction != null && p.label != null) {
            if (p.labelledAt <= p.predictedAt + horizonMs) {
                emit(ctx, out, p, p.label);
                labeled.inc();
                return;
            }
            labelsTooLate.inc();
            p.label = null;
        }
        state.update(p);
    }

    @Override
    public void onTimer(long timestamp, OnTimerContext ctx, Collector<Row> out) throws Exception {
        Pending p = state.value();
        if (p == null) {
            return;
        }
        if (p.settled) {
            if (timestamp >= p.clearAt) {
                state.clear();
            }
            return;
        }
        if (p.prediction != null && timestamp >= p.predictedAt + horizonMs) {
            emit(ctx, out, p, null);
            unlabeled.inc();
        } else if (p.prediction == null && p.label != null && timestamp >= p.labelledAt + horizonMs) {
            labelsWithoutPrediction.inc();
            state.clear();
        }
    }

    private void emit(Context ctx, Collector<Row> out, Pending p, String label) throws Exception {
        out.collect(Row.of(ctx.getCurrentKey(), p.prediction, label));
        p.settled = true;
        p.clearAt = Math.max(p.predictedAt, ctx.timerService().currentWatermark()) + 2 * horizonMs;
        p.prediction = null;
        p.label = null;
        state.update(p);
        ctx.timerService().registerEventTimeTimer(p.clearAt);
    }
}
