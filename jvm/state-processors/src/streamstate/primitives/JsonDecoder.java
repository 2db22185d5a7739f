package streamstate.primitives;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.RoundingMode;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.ZoneId;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.core.JsonEncoding;
import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.exc.InputCoercionException;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.catalyst.util.DateTimeUtils;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.types.UTF8String;

import scala.Option;

/**
 * A job's JSON events decoded in one pass over each record's bytes (spark_jobs/io/dead_letter.py): what
 * Spark's {@code from_json} and {@code try_parse_json} found between them, parsing each record once.
 *
 * <p>Output, per record, a struct of:
 * <ul>
 *   <li>{@code object}: the value is UTF-8 holding one JSON object, as {@code try_parse_json} accepts it
 *       (no duplicate keys and no unpaired surrogate escapes at any depth; text after the object is not
 *       read), and nothing else first but blanks;</li>
 *   <li>{@code event}: the flat schema's fields, each converted as {@code from_json} converts it (a value
 *       that does not convert is null, the other fields kept); all null when {@code object} is false;</li>
 *   <li>{@code written}: each field as the record wrote it, as {@code variant_get(json, '$.f', 'string')}
 *       renders it (a number as the variant holds it: a long, a decimal without trailing zeros, or a
 *       double); null when absent or JSON null. A nested object or array is its compact JSON, in the order
 *       written (the variant sorts keys: only a dead letter's message can show the difference).</li>
 * </ul>
 *
 * <p>Field types read: string, boolean, byte, short, int, long, float, double, decimal, timestamp
 * ({@link #reads}); the Python side decodes other schemas with Spark's own functions.
 */
public final class JsonDecoder implements UDF1<byte[], Row> {
  private static final long serialVersionUID = 1L;
  private static final int MANY_KEYS = 16;

  private enum Kind { STRING, BOOLEAN, BYTE, SHORT, INT, LONG, FLOAT, DOUBLE, DECIMAL, TIMESTAMP }

  private final String[] names;
  private final Kind[] kinds;
  private final int[] precisions;
  private final int[] scales;
  private final String zoneId;
  private transient JsonFactory factory;
  private transient ZoneId zone;
  private transient Map<String, Integer> fieldIndex;

  private JsonDecoder(StructType schema, String zoneId) {
    int n = schema.size();
    names = new String[n];
    kinds = new Kind[n];
    precisions = new int[n];
    scales = new int[n];
    for (int i = 0; i < n; i++) {
      StructField field = schema.fields()[i];
      names[i] = field.name();
      kinds[i] = kind(field.dataType());
      if (field.dataType() instanceof DecimalType decimal) {
        precisions[i] = decimal.precision();
        scales[i] = decimal.scale();
      }
    }
    this.zoneId = zoneId;
  }

  /** True when every field of {@code schemaJson} (a struct type's JSON) is of a type this decoder reads. */
  public static boolean reads(String schemaJson) {
    for (StructField field : ((StructType) DataType.fromJson(schemaJson)).fields()) {
      if (kind(field.dataType()) == null) {
        return false;
      }
    }
    return true;
  }

  /** The decoded struct (see the class comment) of {@code value} (binary) to the schema {@code schemaJson}. */
  public static Column decode(Column value, String schemaJson, String zoneId) {
    StructType schema = (StructType) DataType.fromJson(schemaJson);
    StructType written = new StructType();
    for (StructField field : schema.fields()) {
      written = written.add(field.name(), DataTypes.StringType);
    }
    StructType output = new StructType()
        .add("object", DataTypes.BooleanType, false)
        .add("event", schema)
        .add("written", written);
    return functions.udf(new JsonDecoder(schema, zoneId), output).apply(value);
  }

  private static Kind kind(DataType type) {
    if (type instanceof StringType) {
      return Kind.STRING;
    } else if (type instanceof BooleanType) {
      return Kind.BOOLEAN;
    } else if (type instanceof ByteType) {
      return Kind.BYTE;
    } else if (type instanceof ShortType) {
      return Kind.SHORT;
    } else if (type instanceof IntegerType) {
      return Kind.INT;
    } else if (type instanceof LongType) {
      return Kind.LONG;
    } else if (type instanceof FloatType) {
      return Kind.FLOAT;
    } else if (type instanceof DoubleType) {
      return Kind.DOUBLE;
    } else if (type instanceof DecimalType) {
      return Kind.DECIMAL;
    } else if (type instanceof TimestampType) {
      return Kind.TIMESTAMP;
    }
    return null;
  }

  @Override
  public Row call(byte[] value) {
    Object[] event = new Object[names.length];
    Object[] written = new Object[names.length];
    boolean object = value != null && opensObject(value) && UTF8String.fromBytes(value).isValid()
        && parse(value, event, written);
    if (!object) {
      event = new Object[names.length];
      written = new Object[names.length];
    }
    return RowFactory.create(object, RowFactory.create(event), RowFactory.create(written));
  }

  /**
   * Blanks, then '{'. No NUL byte among the first four: Jackson would read such bytes as UTF-16 or UTF-32
   * (no JSON text holds a raw NUL, so this refuses nothing valid).
   */
  private static boolean opensObject(byte[] value) {
    for (int i = 0; i < Math.min(4, value.length); i++) {
      if (value[i] == 0) {
        return false;
      }
    }
    for (byte b : value) {
      if (b == '{') {
        return true;
      }
      if (b != ' ' && b != '\t' && b != '\n' && b != '\r') {
        return false;
      }
    }
    return false;
  }

  private boolean parse(byte[] value, Object[] event, Object[] written) {
    boolean escapes = contains(value, (byte) '\\');
    try (JsonParser parser = factory().createParser(value)) {
      if (parser.nextToken() != JsonToken.START_OBJECT) {
        return false;
      }
      Keys keys = new Keys();
      while (parser.nextToken() == JsonToken.FIELD_NAME) {
        String name = parser.currentName();
        if (!keys.add(name) || escapes && unpairedSurrogate(name)) {
          return false;
        }
        JsonToken token = parser.nextToken();
        Integer index = fieldIndex().get(name);
        if (index == null) {
          if (!skipChecked(parser, token, escapes)) {
            return false;
          }
          continue;
        }
        int i = index;
        if (token == JsonToken.START_OBJECT || token == JsonToken.START_ARRAY) {
          int start = (int) parser.currentTokenLocation().getByteOffset();
          if (!skipChecked(parser, token, escapes)) {
            return false;
          }
          int end = (int) parser.currentLocation().getByteOffset();
          String compact = compactJson(value, start, end);
          written[i] = compact;
          event[i] = kinds[i] == Kind.STRING ? compact : null;
          continue;
        }
        if (token == JsonToken.VALUE_STRING && escapes && unpairedSurrogate(parser.getText())) {
          return false;
        }
        written[i] = written(parser, token);
        event[i] = converted(parser, token, i);
      }
      return parser.currentToken() == JsonToken.END_OBJECT;
    } catch (IOException | RuntimeException e) {
      return false;
    }
  }

  /** Skips the value at {@code token}, refusing what a variant refuses inside it. */
  private static boolean skipChecked(JsonParser parser, JsonToken token, boolean escapes) throws IOException {
    if (token == JsonToken.VALUE_STRING) {
      return !(escapes && unpairedSurrogate(parser.getText()));
    }
    if (token == JsonToken.START_ARRAY) {
      JsonToken next;
      while ((next = parser.nextToken()) != JsonToken.END_ARRAY) {
        if (next == null || !skipChecked(parser, next, escapes)) {
          return false;
        }
      }
      return true;
    }
    if (token == JsonToken.START_OBJECT) {
      Keys keys = new Keys();
      JsonToken next;
      while ((next = parser.nextToken()) == JsonToken.FIELD_NAME) {
        String name = parser.currentName();
        if (!keys.add(name) || escapes && unpairedSurrogate(name)) {
          return false;
        }
        if (!skipChecked(parser, parser.nextToken(), escapes)) {
          return false;
        }
      }
      return next == JsonToken.END_OBJECT;
    }
    return token != null;
  }

  /**
   * The field as {@code variant_get(..., 'string')} renders what the record wrote. From the token's text
   * only: reading a number as some type changes what Jackson reads and writes it as afterwards.
   */
  private static String written(JsonParser parser, JsonToken token) throws IOException {
    switch (token) {
      case VALUE_STRING:
        return parser.getText();
      case VALUE_TRUE:
        return "true";
      case VALUE_FALSE:
        return "false";
      case VALUE_NUMBER_INT:
        try {
          return Long.toString(Long.parseLong(parser.getText()));
        } catch (NumberFormatException tooLarge) {
          return writtenDecimal(parser.getText());
        }
      case VALUE_NUMBER_FLOAT:
        return writtenDecimal(parser.getText());
      default:
        return null;
    }
  }

  /** A variant holds a number written without an exponent as a decimal when it fits 38 digits, else a double. */
  private static String writtenDecimal(String text) {
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      if (c != '-' && c != '.' && (c < '0' || c > '9')) {
        return Double.toString(Double.parseDouble(text));
      }
    }
    BigDecimal decimal = new BigDecimal(text);
    if (decimal.scale() <= 38 && decimal.precision() <= 38) {
      return decimal.stripTrailingZeros().toPlainString();
    }
    return Double.toString(Double.parseDouble(text));
  }

  /** The field converted as Spark's from_json converts it (JacksonParser); null when it does not convert. */
  private Object converted(JsonParser parser, JsonToken token, int i) throws IOException {
    if (token == JsonToken.VALUE_NULL) {
      return null;
    }
    try {
      switch (kinds[i]) {
        case STRING:
          return token == JsonToken.VALUE_STRING ? parser.getText() : generated(parser);
        case BOOLEAN:
          return token == JsonToken.VALUE_TRUE ? Boolean.TRUE : token == JsonToken.VALUE_FALSE ? Boolean.FALSE : null;
        case BYTE:
          return token == JsonToken.VALUE_NUMBER_INT ? (Object) parser.getByteValue() : null;
        case SHORT:
          return token == JsonToken.VALUE_NUMBER_INT ? (Object) parser.getShortValue() : null;
        case INT:
          return token == JsonToken.VALUE_NUMBER_INT ? (Object) parser.getIntValue() : null;
        case LONG:
          return token == JsonToken.VALUE_NUMBER_INT ? (Object) parser.getLongValue() : null;
        case FLOAT:
          if (token == JsonToken.VALUE_NUMBER_INT || token == JsonToken.VALUE_NUMBER_FLOAT) {
            return parser.getFloatValue();
          }
          Double special = nonNumeric(parser, token);
          return special == null ? null : (Object) special.floatValue();
        case DOUBLE:
          if (token == JsonToken.VALUE_NUMBER_INT || token == JsonToken.VALUE_NUMBER_FLOAT) {
            return parser.getDoubleValue();
          }
          return nonNumeric(parser, token);
        case DECIMAL:
          return decimal(parser, token, precisions[i], scales[i]);
        case TIMESTAMP:
          return timestamp(parser, token);
        default:
          return null;
      }
    } catch (InputCoercionException | NumberFormatException | ArithmeticException notThisType) {
      return null;
    }
  }

  /** JSON options' allowNonNumericNumbers: these strings are a float's or double's special values. */
  private static Double nonNumeric(JsonParser parser, JsonToken token) throws IOException {
    if (token != JsonToken.VALUE_STRING) {
      return null;
    }
    switch (parser.getText()) {
      case "NaN":
        return Double.NaN;
      case "+INF":
      case "+Infinity":
      case "Infinity":
        return Double.POSITIVE_INFINITY;
      case "-INF":
      case "-Infinity":
        return Double.NEGATIVE_INFINITY;
      default:
        return null;
    }
  }

  /** Rounded half up to the scale (Spark's Decimal.set); null when it then needs more digits than the precision. */
  private static BigDecimal decimal(JsonParser parser, JsonToken token, int precision, int scale) throws IOException {
    BigDecimal read;
    if (token == JsonToken.VALUE_NUMBER_INT || token == JsonToken.VALUE_NUMBER_FLOAT) {
      read = parser.getDecimalValue();
    } else if (token == JsonToken.VALUE_STRING && parser.getTextLength() >= 1) {
      read = new BigDecimal(parser.getText().replace(",", "")); // the en-US decimal parser of JSON options
    } else {
      return null;
    }
    BigDecimal rounded = read.setScale(scale, RoundingMode.HALF_UP);
    return rounded.precision() > precision ? null : rounded;
  }

  /**
   * A string as from_json reads a timestamp without a format (Spark's cast of a string, then the same
   * with "GMT" taken out, its fallback for older writers), or an integer as epoch seconds.
   */
  private Instant timestamp(JsonParser parser, JsonToken token) throws IOException {
    long micros;
    if (token == JsonToken.VALUE_NUMBER_INT) {
      micros = parser.getLongValue() * 1_000_000L;
    } else if (token == JsonToken.VALUE_STRING && parser.getTextLength() >= 1) {
      UTF8String text = UTF8String.fromString(parser.getText());
      Option<Object> parsed = DateTimeUtils.stringToTimestamp(text, zone());
      if (parsed.isEmpty()) {
        parsed = DateTimeUtils.stringToTimestamp(DateTimeUtils.cleanLegacyTimestampStr(text), zone());
      }
      if (parsed.isEmpty()) {
        return null;
      }
      micros = (Long) parsed.get();
    } else {
      return null;
    }
    return Instant.ofEpochSecond(Math.floorDiv(micros, 1_000_000L), Math.floorMod(micros, 1_000_000L) * 1_000L);
  }

  /** What from_json makes of a non-string JSON scalar read as a string: Jackson writing the token again. */
  private String generated(JsonParser parser) throws IOException {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    try (JsonGenerator generator = factory().createGenerator(out, JsonEncoding.UTF8)) {
      generator.copyCurrentStructure(parser);
    }
    return out.toString(StandardCharsets.UTF_8);
  }

  /** A nested object or array, parsed again and written compactly, as from_json reads it into a string. */
  private String compactJson(byte[] value, int start, int end) throws IOException {
    try (JsonParser nested = factory().createParser(value, start, end - start)) {
      nested.nextToken();
      return generated(nested);
    }
  }

  private static boolean contains(byte[] value, byte b) {
    for (byte v : value) {
      if (v == b) {
        return true;
      }
    }
    return false;
  }

  /** A lone or reversed UTF-16 surrogate, which only a \\u escape can write and a variant refuses. */
  private static boolean unpairedSurrogate(String text) {
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      if (Character.isHighSurrogate(c)) {
        if (i + 1 >= text.length() || !Character.isLowSurrogate(text.charAt(i + 1))) {
          return true;
        }
        i++;
      } else if (Character.isLowSurrogate(c)) {
        return true;
      }
    }
    return false;
  }

  private JsonFactory factory() {
    if (factory == null) {
      factory = new JsonFactory();
    }
    return factory;
  }

  private ZoneId zone() {
    if (zone == null) {
      zone = ZoneId.of(zoneId);
    }
    return zone;
  }

  private Map<String, Integer> fieldIndex() {
    if (fieldIndex == null) {
      Map<String, Integer> index = new HashMap<>();
      for (int i = 0; i < names.length; i++) {
        index.put(names[i], i);
      }
      fieldIndex = index;
    }
    return fieldIndex;
  }

  /** An object's keys so far: a list while few (the usual event), a set beyond. */
  private static final class Keys {
    private final List<String> few = new ArrayList<>();
    private Set<String> many;

    /** False when the key was already there. */
    boolean add(String key) {
      if (many != null) {
        return many.add(key);
      }
      for (String seen : few) {
        if (seen.equals(key)) {
          return false;
        }
      }
      few.add(key);
      if (few.size() > MANY_KEYS) {
        many = new HashSet<>(few);
      }
      return true;
    }
  }
}
