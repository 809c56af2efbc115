package dev.loopline.streams;

/**
 * UTF-8 as Python's strict decoder reads it (RFC 3629): no overlong form, no surrogate code point, nothing past
 * U+10FFFF. Bytes that break it make an event invalid, and a dead letter shows its key with each such byte as
 * {@code \xNN}, as Python's {@code backslashreplace} does.
 */
final class Utf8Text {
    private Utf8Text() {}

    /** Why {@code bytes} is not UTF-8 (the offending byte's position), or null when it is. */
    static String problem(byte[] bytes) {
        int i = 0;
        while (i < bytes.length) {
            int length = sequenceLength(bytes, i);
            if (length == 0) {
                return "invalid byte at " + i;
            }
            i += length;
        }
        return null;
    }

    /** {@code bytes} decoded, each byte that starts no valid sequence written as {@code \xNN}. */
    static String backslashReplaced(byte[] bytes) {
        StringBuilder out = new StringBuilder(bytes.length);
        int i = 0;
        while (i < bytes.length) {
            int length = sequenceLength(bytes, i);
            if (length == 0) {
                out.append(String.format("\\x%02x", bytes[i] & 0xFF));
                i++;
            } else {
                out.append(new String(bytes, i, length, java.nio.charset.StandardCharsets.UTF_8));
                i += length;
            }
        }
        return out.toString();
    }

    /** The length of the valid UTF-8 sequence starting at {@code i}, or 0 when none starts there. */
    private static int sequenceLength(byte[] bytes, int i) {
        int b0 = bytes[i] & 0xFF;
        if (b0 < 0x80) {
            return 1;
        }
        int length;
        int low = 0x80;
        int high = 0xBF;
        if (b0 >= 0xC2 && b0 <= 0xDF) {
            length = 2;
        } else if (b0 >= 0xE0 && b0 <= 0xEF) {
            length = 3;
            if (b0 == 0xE0) {
                low = 0xA0;  // no overlong form
            } else if (b0 == 0xED) {
                high = 0x9F;  // no surrogate
            }
        } else if (b0 >= 0xF0 && b0 <= 0xF4) {
            length = 4;
            if (b0 == 0xF0) {
                low = 0x90;
            } else if (b0 == 0xF4) {
                high = 0x8F;  // nothing past U+10FFFF
            }
        } else {
            return 0;
        }
        if (i + length > bytes.length) {
            return 0;
        }
        int b1 = bytes[i + 1] & 0xFF;
        if (b1 < low || b1 > high) {
            return 0;
        }
        for (int k = 2; k < length; k++) {
            int b = bytes[i + k] & 0xFF;
            if (b < 0x80 || b > 0xBF) {
                return 0;
            }
        }
        return length;
    }
}
