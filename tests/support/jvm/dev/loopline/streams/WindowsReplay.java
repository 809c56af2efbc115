package dev.loopline.streams;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HexFormat;

import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.types.Row;

/**
 * Drives {@link WindowPlan} for {@code tests/streams/test_window_plan.py}: one entity's events in, its finished values and
 * steps out, one command per line on standard input, one answer line per query.
 * <ul>
 *   <li>{@code plan <spec>}: a new plan ({@link WindowPlan}'s text form; columns 1 amount and 2 merchant) and a new
 *       entity;
 *   <li>{@code event <time ms> <amount> <merchant>}: absorb one event, then take the state through what a checkpoint
 *       and its restore do ({@link WindowsSerializer}: written, read back, and copied, as the heap backend copies it
 *       while a snapshot runs), so every answer also holds the serializer to the plan;
 *   <li>{@code offer <time ms> <amount> <merchant>}: absorb it as the job does, unless {@link WindowPlan#refusal}
 *       refuses it; answers {@code absorbed}, or {@code refused <column> <why>};
 *   <li>{@code read}: answers (nothing but {@code |} while every event was refused) each window's steps in hex, then {@code |}, then each finished value
 *       ({@code null} for none), space-separated.
 * </ul>
 */
public final class WindowsReplay {
    private WindowsReplay() {}

    /** The last state read back from its bytes, and those bytes: the copy taken of it must share nothing with it. */
    private static WindowPlan.Windows restored;
    private static byte[] written;

    /** The state as a job restored from a checkpoint holds it, after the heap backend's copy of it; fails when the
     * previous copy, absorbing an event since, changed the state it was copied from (a shallow copy). */
    private static WindowPlan.Windows checkpointed(WindowPlan.Windows state) throws IOException {
        if (restored != null && !Arrays.equals(bytes(restored), written)) {
            throw new IllegalStateException("WindowsSerializer.copy shares state with its original");
        }
        restored = WindowsSerializer.INSTANCE.deserialize(new DataInputDeserializer(bytes(state)));
        written = bytes(restored);  // of the object itself: a set's order of iteration is the object's
        return WindowsSerializer.INSTANCE.copy(restored);
    }

    private static byte[] bytes(WindowPlan.Windows state) throws IOException {
        DataOutputSerializer out = new DataOutputSerializer(256);
        WindowsSerializer.INSTANCE.serialize(state, out);
        return out.getCopyOfBuffer();
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        WindowPlan plan = null;
        WindowPlan.Windows state = null;
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] part = line.split(" ");
            switch (part[0]) {
                case "plan" -> {
                    plan = new WindowPlan(part[1], 0, 1_000_000L, part.length > 2 ? Long.parseLong(part[2]) : 0);
                    state = null;
                    restored = null;
                }
                case "event", "offer" -> {
                    Row row = Row.of(Long.parseLong(part[1]), Double.parseDouble(part[2]), part[3]);
                    WindowPlan.Windows next = state == null ? plan.newState(plan.eventTime(row)) : state;
                    WindowPlan.Refusal refusal = part[0].equals("offer") ? plan.refusal(next, row) : null;
                    if (refusal == null) {
                        plan.absorb(next, row);
                        state = checkpointed(next);
                    }
                    if (part[0].equals("offer")) {
                        out.println(refusal == null ? "absorbed" : "refused " + refusal.column() + " " + refusal.why());
                        out.flush();
                    }
                }
                case "read" -> {
                    if (state == null) {  // every event offered was refused: no state, nothing to read
                        out.println("|");
                        out.flush();
                        continue;
                    }
                    StringBuilder answer = new StringBuilder();
                    for (byte[] steps : plan.steps(state)) {
                        answer.append(HexFormat.of().formatHex(steps)).append(' ');
                    }
                    answer.append('|');
                    for (Object value : plan.finished(state)) {
                        answer.append(' ').append(value);
                    }
                    out.println(answer);
                    out.flush();
                }
                default -> throw new IllegalArgumentException("unknown command: " + line);
            }
        }
    }
}
