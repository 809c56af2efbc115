package dev.loopline.streams;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;

/**
 * A tile as the online store keeps it ({@code feature_store/window_tiles.py} reads it): the text
 * {@code <index>:<count>:}, then MessagePack {@code [totals, maxima, minima, distinct]} (integers
 * of 1/scale, doubles, doubles, and per distinct column its values). The text head lets the
 * store's compare-and-set order a slot's versions without decoding the rest.
 */
final class TileBytes {
    private TileBytes() {}

    static byte[] encode(long index, SlidingWindows.Bucket bucket) {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream(64);
        DataOutputStream out = new DataOutputStream(bytes);
        try {
            out.write((index + ":" + bucket.count + ":").getBytes(StandardCharsets.US_ASCII));
            arrayHeader(out, 4);
            arrayHeader(out, bucket.totals.length);
            for (long total : bucket.totals) {
                value(out, total);
            }
            for (double[] extremes : new double[][] {bucket.max, bucket.min}) {
                arrayHeader(out, extremes.length);
                for (double extreme : extremes) {
                    value(out, extreme);
                }
            }
            arrayHeader(out, bucket.distinct.size());
            for (Map<Object, Integer> values : bucket.distinct) {
                arrayHeader(out, values.size());
                for (Object v : values.keySet()) {
                    value(out, v);
                }
            }
        } catch (IOException impossible) {  // a ByteArrayOutputStream does not fail
            throw new IllegalStateException(impossible);
        }
        return bytes.toByteArray();
    }

    /** Several tiles in one value: each as {@code <length>:} (ASCII, its bytes) and then the tile. */
    static byte[] frame(List<byte[]> tiles) {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        for (byte[] tile : tiles) {
            bytes.writeBytes((tile.length + ":").getBytes(StandardCharsets.US_ASCII));
            bytes.writeBytes(tile);
        }
        return bytes.toByteArray();
    }

    private static void arrayHeader(DataOutputStream out, int size) throws IOException {
        if (size < 16) {
            out.writeByte(0x90 | size);
        } else if (size < 65536) {
            out.writeByte(0xdc);
            out.writeShort(size);
        } else {
            out.writeByte(0xdd);
            out.writeInt(size);
        }
    }

    /** One scalar: the types an event column holds (strings, whole numbers, doubles, booleans) or null. */
    private static void value(DataOutputStream out, Object v) throws IOException {
        if (v == null) {
            out.writeByte(0xc0);
        } else if (v instanceof Boolean b) {
            out.writeByte(b ? 0xc3 : 0xc2);
        } else if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
            out.writeByte(0xd3);
            out.writeLong(((Number) v).longValue());
        } else if (v instanceof Number n) {
            out.writeByte(0xcb);
            out.writeDouble(n.doubleValue());
        } else {
            byte[] text = v.toString().getBytes(StandardCharsets.UTF_8);
            if (text.length < 32) {
                out.writeByte(0xa0 | text.length);
            } else if (text.length < 256) {
                out.writeByte(0xd9);
                out.writeByte(text.length);
            } else if (text.length < 65536) {
                out.writeByte(0xda);
                out.writeShort(text.length);
            } else {
                out.writeByte(0xdb);
                out.writeInt(text.length);
            }
            out.write(text);
        }
    }
}
