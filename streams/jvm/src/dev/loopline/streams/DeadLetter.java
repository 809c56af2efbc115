package dev.loopline.streams;

import java.io.IOException;
import java.io.StringWriter;
import java.util.Base64;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;

/**
 * A dead letter as {@code schemas/records.py}'s {@code DeadLetterRecord} (schema version 1) reads it: why a record
 * was not taken, and the record itself, exactly as it came (its value as UTF-8 text, or base64 when it is not UTF-8;
 * its key as text, bytes that are not UTF-8 written {@code \xNN}).
 */
final class DeadLetter {
    private static final JsonFactory JSON = new JsonFactory();

    private DeadLetter() {}

    /** The dead letter's JSON. */
    static String json(String consumer, String reason, String error, String errorField, String topic, int partition, long offset,
                       byte[] key, byte[] value) {
        byte[] payload = value == null ? new byte[0] : value;
        boolean utf8 = Utf8Text.problem(payload) == null;
        StringWriter text = new StringWriter(payload.length + 400);
        try (JsonGenerator out = JSON.createGenerator(text)) {
            out.writeStartObject();
            out.writeNumberField("schema_version", 1);
            out.writeStringField("reason", reason);
            out.writeStringField("error_field", errorField);
            out.writeStringField("error", error);
            out.writeStringField("source_topic", topic);
            out.writeNumberField("source_partition", partition);
            out.writeNumberField("source_offset", offset);
            out.writeStringField("key", key == null ? null : Utf8Text.backslashReplaced(key));
            out.writeStringField("payload", utf8 ? new String(payload, java.nio.charset.StandardCharsets.UTF_8)
                    : Base64.getEncoder().encodeToString(payload));
            out.writeStringField("payload_encoding", utf8 ? "utf-8" : "base64");
            out.writeStringField("consumer", consumer);
            out.writeNumberField("failed_at_ms", System.currentTimeMillis());
            out.writeEndObject();
        } catch (IOException impossible) {  // a StringWriter does not fail
            throw new IllegalStateException(impossible);
        }
        return text.toString();
    }
}
