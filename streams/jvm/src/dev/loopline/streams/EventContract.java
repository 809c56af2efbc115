package dev.loopline.streams;

import java.io.IOException;
import java.io.Serializable;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Pattern;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericEnumSymbol;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.util.Utf8;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;

/**
 * One event contract, as {@code schemas/contracts.py} hands it over ({@code EventContract.jvm_spec}): decodes an event
 * of it, from JSON or from Avro binary, into its fields' values, by the rules the Python contract applies, so the job
 * and the offline recompute take the same events (a test feeds both the same payloads).
 *
 * <p>JSON: the payload is UTF-8, one JSON object and nothing after it, nested at most {@link #MAX_JSON_DEPTH} deep (the
 * object is level 1), with no lone UTF-16 surrogate in any text, every key and value counted, duplicates too; a key
 * given twice takes its last value. Avro: the contract's record in its binary encoding and nothing after it, every
 * text valid UTF-8. Then every field, in declaration order, is checked: present (or nullable, or with a default), of
 * its type (an integer for int and long, within 32 or 64 bits; any finite number for float and double, a float within
 * a 32-bit float's range), and within its constraints (numbers compared exactly, lengths in code points, a pattern
 * matching the whole text). The first field at fault is named.
 */
public final class EventContract implements Serializable {
    private static final long serialVersionUID = 1L;
    public static final String WHOLE_PAYLOAD = "<payload>";
    static final int MAX_JSON_DEPTH = 32;
    private static final double FLOAT32_MAX = 3.4028234663852886e38;
    /** A field the payload does not carry, and one it carries as null or as an object or array. */
    private static final Object ABSENT = new Object();
    private static final Object NULL = new Object();
    private static final Object COMPOSITE = new Object();

    /** A payload the contract refuses: the field at fault ({@link #WHOLE_PAYLOAD} for the payload as a whole) and why. */
    public static final class Violation extends Exception {
        private static final long serialVersionUID = 1L;
        public final String field;
        public final String reason;

        Violation(String field, String reason) {
            super(field + ": " + reason, null, false, false);
            this.field = field;
            this.reason = reason;
        }
    }

    /** One field: its type, whether it may be null or left out, its default, enum symbols and constraints. */
    static final class Field implements Serializable {
        private static final long serialVersionUID = 1L;
        String name;
        String type;
        boolean nullable;
        boolean hasDefault;
        Object defaultValue;
        Set<String> symbols;
        BigDecimal minimum;
        BigDecimal maximum;
        BigDecimal exclusiveMinimum;
        BigDecimal exclusiveMaximum;
        Integer minLength;
        Integer maxLength;
        String pattern;
        transient Pattern compiled;
    }

    private final String name;
    private final Field[] fields;
    private final Map<String, Integer> positions = new HashMap<>();
    private final String avroSchema;
    private transient JsonFactory json;
    private transient GenericDatumReader<GenericRecord> avro;
    private transient GenericDatumWriter<GenericRecord> canonical;
    private transient java.io.ByteArrayOutputStream rewritten;
    private transient BinaryDecoder reuse;
    private transient BinaryEncoder reuseEncoder;

    /** {@code spec}: the contract as {@code EventContract.jvm_spec} writes it. */
    public EventContract(String spec) {
        JsonObject root = com.google.gson.JsonParser.parseString(spec).getAsJsonObject();
        this.name = root.get("name").getAsString();
        this.avroSchema = root.get("avroSchema").getAsString();
        List<Field> parsed = new ArrayList<>();
        for (JsonElement element : root.getAsJsonArray("fields")) {
            JsonObject f = element.getAsJsonObject();
            Field field = new Field();
            field.name = f.get("name").getAsString();
            field.type = f.get("type").getAsString();
            field.nullable = f.get("nullable").getAsBoolean();
            field.hasDefault = f.get("hasDefault").getAsBoolean();
            field.defaultValue = field.hasDefault ? defaultOf(field.type, f.get("default")) : null;
            field.symbols = new HashSet<>();
            f.getAsJsonArray("symbols").forEach(s -> field.symbols.add(s.getAsString()));
            JsonObject c = f.getAsJsonObject("constraints");
            field.minimum = decimal(c, "minimum");
            field.maximum = decimal(c, "maximum");
            field.exclusiveMinimum = decimal(c, "exclusiveMinimum");
            field.exclusiveMaximum = decimal(c, "exclusiveMaximum");
            field.minLength = c.has("minLength") ? c.get("minLength").getAsInt() : null;
            field.maxLength = c.has("maxLength") ? c.get("maxLength").getAsInt() : null;
            field.pattern = c.has("pattern") ? c.get("pattern").getAsString() : null;
            if (field.pattern != null) {  // a pattern Java cannot read fails the job's start, naming it, not each event
                field.compiled = Pattern.compile(field.pattern, Pattern.UNICODE_CHARACTER_CLASS);
            }
            positions.put(field.name, parsed.size());
            parsed.add(field);
        }
        this.fields = parsed.toArray(new Field[0]);
    }

    /** A bound as Python reads it from the contract's JSON: an integer exactly, a decimal as the double nearest it (so
     * {@code maximum: 0.1} takes the double 0.1 on both sides). */
    private static BigDecimal decimal(JsonObject constraints, String key) {
        if (!constraints.has(key)) {
            return null;
        }
        String text = constraints.get(key).getAsString();
        boolean integral = text.chars().noneMatch(c -> c == '.' || c == 'e' || c == 'E');
        return integral ? new BigDecimal(text) : new BigDecimal(Double.parseDouble(text));
    }

    private static Object defaultOf(String type, JsonElement value) {
        if (value == null || value.isJsonNull()) {
            return null;
        }
        switch (type) {
            case "boolean":
                return value.getAsBoolean();
            case "int":
            case "long":
                return value.getAsLong();
            case "float":
            case "double":
                return value.getAsDouble();
            default:
                return value.getAsString();
        }
    }

    public String name() {
        return name;
    }

    /** The fields' names, in declaration order (the decoded values' order). */
    public String[] fieldNames() {
        String[] names = new String[fields.length];
        for (int i = 0; i < fields.length; i++) {
            names[i] = fields[i].name;
        }
        return names;
    }

    /** The fields' types as the job's rows carry them: String, Long, Double or Boolean, in declaration order. */
    public Class<?>[] fieldClasses() {
        Class<?>[] classes = new Class<?>[fields.length];
        for (int i = 0; i < fields.length; i++) {
            switch (fields[i].type) {
                case "boolean":
                    classes[i] = Boolean.class;
                    break;
                case "int":
                case "long":
                    classes[i] = Long.class;
                    break;
                case "float":
                case "double":
                    classes[i] = Double.class;
                    break;
                default:
                    classes[i] = String.class;
            }
        }
        return classes;
    }

    /** The position of the field {@code field} among the decoded values. */
    public int position(String field) {
        Integer at = positions.get(field);
        if (at == null) {
            throw new IllegalArgumentException(name + " has no field " + field);
        }
        return at;
    }

    /** The event in {@code payload} (JSON, or Avro binary with {@code avro}) as its fields' values, in declaration
     * order; a {@link Violation} naming the field at fault otherwise. */
    public Object[] decode(byte[] payload, boolean avro) throws Violation {
        Object[] values = avro ? readAvro(payload) : readJson(payload);
        for (int i = 0; i < fields.length; i++) {
            values[i] = valid(fields[i], values[i]);
        }
        return values;
    }

    private Object[] readJson(byte[] payload) throws Violation {
        String problem = Utf8Text.problem(payload);
        if (problem != null) {
            throw new Violation(WHOLE_PAYLOAD, "not UTF-8 (" + problem + ")");
        }
        if (json == null) {
            json = JsonFactory.builder().streamReadConstraints(StreamReadConstraints.builder().maxNestingDepth(Integer.MAX_VALUE)
                    .maxNumberLength(Integer.MAX_VALUE).maxStringLength(Integer.MAX_VALUE).build()).build();
        }
        Object[] values = new Object[fields.length];
        java.util.Arrays.fill(values, ABSENT);
        // From text already checked to be UTF-8: Jackson, given bytes, would detect UTF-16 or 32 and skip a byte order
        // mark, which the Python decoder (and JSON itself) refuses.
        String text = new String(payload, java.nio.charset.StandardCharsets.UTF_8);
        if (text.startsWith("\uFEFF")) {
            throw new Violation(WHOLE_PAYLOAD, "not valid JSON (Unexpected UTF-8 BOM)");
        }
        try (JsonParser parser = json.createParser(text)) {
            JsonToken first = parser.nextToken();
            if (first != JsonToken.START_OBJECT) {
                throw new Violation(WHOLE_PAYLOAD, first == null ? "not valid JSON (empty)" : "expected a JSON object");
            }
            while (parser.nextToken() == JsonToken.FIELD_NAME) {
                String key = parser.currentName();
                checkText(key);
                JsonToken token = parser.nextToken();
                Integer at = positions.get(key);
                Object value = scalar(parser, token, 1);
                if (at != null) {
                    values[at] = value;
                }
            }
            if (parser.nextToken() != null) {
                throw new Violation(WHOLE_PAYLOAD, "not valid JSON (data after the object)");
            }
        } catch (IOException e) {
            throw new Violation(WHOLE_PAYLOAD, "not valid JSON (" + (e instanceof com.fasterxml.jackson.core.JsonProcessingException j ? j.getOriginalMessage() : e.getMessage()) + ")");
        }
        return values;
    }

    /** The value at {@code token}, in an object or array at level {@code depth}: a scalar as Java reads it, or
     * {@link #COMPOSITE} for an object or array (read through, its depth and texts checked). */
    private static Object scalar(JsonParser parser, JsonToken token, int depth) throws IOException, Violation {
        switch (token) {
            case VALUE_STRING: {
                String text = parser.getText();
                checkText(text);
                return text;
            }
            case VALUE_NUMBER_INT:
                return parser.getNumberType() == JsonParser.NumberType.BIG_INTEGER ? parser.getBigIntegerValue() : (Object) parser.getLongValue();
            case VALUE_NUMBER_FLOAT:
                return parser.getDoubleValue();
            case VALUE_TRUE:
                return Boolean.TRUE;
            case VALUE_FALSE:
                return Boolean.FALSE;
            case VALUE_NULL:
                return NULL;
            case START_OBJECT:
            case START_ARRAY:
                if (depth + 1 > MAX_JSON_DEPTH) {
                    throw new Violation(WHOLE_PAYLOAD, "JSON nested deeper than " + MAX_JSON_DEPTH + " levels");
                }
                JsonToken end = token == JsonToken.START_OBJECT ? JsonToken.END_OBJECT : JsonToken.END_ARRAY;
                for (JsonToken next = parser.nextToken(); next != end; next = parser.nextToken()) {
                    if (next == JsonToken.FIELD_NAME) {
                        checkText(parser.currentName());
                    } else {
                        scalar(parser, next, depth + 1);
                    }
                }
                return COMPOSITE;
            default:
                throw new Violation(WHOLE_PAYLOAD, "not valid JSON (unexpected " + token + ")");
        }
    }

    private static void checkText(String text) throws Violation {
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < text.length() && Character.isLowSurrogate(text.charAt(i + 1))) {
                i++;
            } else if (Character.isSurrogate(c)) {
                throw new Violation(WHOLE_PAYLOAD, "text holds a lone UTF-16 surrogate (not valid Unicode)");
            }
        }
    }

    private Object[] readAvro(byte[] payload) throws Violation {
        if (avro == null) {
            Schema schema = new Schema.Parser().parse(avroSchema);
            avro = new GenericDatumReader<>(schema);
            canonical = new GenericDatumWriter<>(schema);
            rewritten = new java.io.ByteArrayOutputStream(256);
        }
        Object[] values = new Object[fields.length];
        try {
            BinaryDecoder decoder = DecoderFactory.get().binaryDecoder(payload, reuse);
            reuse = decoder;
            GenericRecord record = avro.read(null, decoder);
            if (!decoder.isEnd()) {
                throw new Violation(WHOLE_PAYLOAD, "bytes after the Avro record");
            }
            // Avro writers write one form of a record (each number in its fewest bytes); a record in another is refused
            // here and by the Python contract alike, where Avro readers would differ on it.
            rewritten.reset();
            reuseEncoder = EncoderFactory.get().binaryEncoder(rewritten, reuseEncoder);
            canonical.write(record, reuseEncoder);
            reuseEncoder.flush();
            if (!java.util.Arrays.equals(rewritten.toByteArray(), payload)) {
                throw new Violation(WHOLE_PAYLOAD, "not the canonical Avro encoding of its record");
            }
            for (int i = 0; i < fields.length; i++) {
                values[i] = avroValue(record.get(i));
            }
        } catch (IOException | RuntimeException e) {
            throw new Violation(WHOLE_PAYLOAD, "not valid Avro of this contract (" + e + ")");
        }
        return values;
    }

    private static Object avroValue(Object value) throws Violation {
        if (value == null) {
            return NULL;
        }
        if (value instanceof Utf8 text) {
            byte[] bytes = java.util.Arrays.copyOf(text.getBytes(), text.getByteLength());
            String problem = Utf8Text.problem(bytes);
            if (problem != null) {
                throw new Violation(WHOLE_PAYLOAD, "not valid Avro of this contract (text not UTF-8: " + problem + ")");
            }
            return text.toString();
        }
        if (value instanceof Integer i) {
            return (long) i;
        }
        if (value instanceof Float f) {
            return (double) f;
        }
        if (value instanceof GenericEnumSymbol<?> symbol) {
            return symbol.toString();
        }
        return value;
    }

    /** The field's value as the job carries it, or the Violation naming it. */
    private static Object valid(Field f, Object value) throws Violation {
        if (value == ABSENT) {
            if (f.hasDefault) {
                return f.defaultValue;
            }
            if (f.nullable) {
                return null;
            }
            throw new Violation(f.name, "Field required");
        }
        if (value == NULL) {
            if (f.nullable) {
                return null;
            }
            throw new Violation(f.name, "Input should be a valid " + f.type);
        }
        switch (f.type) {
            case "string":
            case "enum":
                if (!(value instanceof String text)) {
                    throw new Violation(f.name, "Input should be a valid string");
                }
                checkString(f, text);
                return text;
            case "boolean":
                if (!(value instanceof Boolean)) {
                    throw new Violation(f.name, "Input should be a valid boolean");
                }
                return value;
            case "int":
            case "long": {
                if (!(value instanceof Long) && !(value instanceof BigInteger)) {
                    throw new Violation(f.name, "Input should be a valid integer");
                }
                BigDecimal exact = value instanceof Long l ? BigDecimal.valueOf(l) : new BigDecimal((BigInteger) value);
                long bound = f.type.equals("int") ? Integer.MAX_VALUE : Long.MAX_VALUE;
                if (exact.compareTo(BigDecimal.valueOf(bound)) > 0 || exact.compareTo(BigDecimal.valueOf(-bound - 1)) < 0) {
                    throw new Violation(f.name, "beyond a " + (f.type.equals("int") ? 32 : 64) + "-bit integer");
                }
                checkRange(f, exact);
                return exact.longValueExact();
            }
            default: {
                double number;
                if (value instanceof Long l) {
                    number = (double) l;
                } else if (value instanceof BigInteger big) {
                    number = big.doubleValue();
                } else if (value instanceof Double d) {
                    number = d;
                } else {
                    throw new Violation(f.name, "Input should be a valid number");
                }
                if (!Double.isFinite(number)) {
                    throw new Violation(f.name, "Input should be a finite number");
                }
                if (f.type.equals("float") && Math.abs(number) > FLOAT32_MAX) {
                    throw new Violation(f.name, "beyond a 32-bit float's range");
                }
                checkRange(f, new BigDecimal(number));
                return number;
            }
        }
    }

    private static void checkRange(Field f, BigDecimal value) throws Violation {
        if (f.minimum != null && value.compareTo(f.minimum) < 0) {
            throw new Violation(f.name, "Input should be greater than or equal to " + f.minimum.toPlainString());
        }
        if (f.exclusiveMinimum != null && value.compareTo(f.exclusiveMinimum) <= 0) {
            throw new Violation(f.name, "Input should be greater than " + f.exclusiveMinimum.toPlainString());
        }
        if (f.maximum != null && value.compareTo(f.maximum) > 0) {
            throw new Violation(f.name, "Input should be less than or equal to " + f.maximum.toPlainString());
        }
        if (f.exclusiveMaximum != null && value.compareTo(f.exclusiveMaximum) >= 0) {
            throw new Violation(f.name, "Input should be less than " + f.exclusiveMaximum.toPlainString());
        }
    }

    private static void checkString(Field f, String text) throws Violation {
        if (f.type.equals("enum")) {
            if (!f.symbols.contains(text)) {
                throw new Violation(f.name, "Input should be one of " + f.symbols);
            }
            return;
        }
        int length = text.codePointCount(0, text.length());
        if (f.minLength != null && length < f.minLength) {
            throw new Violation(f.name, "String should have at least " + f.minLength + " characters");
        }
        if (f.maxLength != null && length > f.maxLength) {
            throw new Violation(f.name, "String should have at most " + f.maxLength + " characters");
        }
        if (f.pattern != null) {
            if (f.compiled == null) {
                f.compiled = Pattern.compile(f.pattern, Pattern.UNICODE_CHARACTER_CLASS);
            }
            if (!f.compiled.matcher(text).matches()) {
                throw new Violation(f.name, "does not match the pattern '" + f.pattern + "'");
            }
        }
    }
}
