package streamstate.primitives;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.StructType;

import scala.collection.Iterator;

import streamstate.jobs.DeadLetters;

/**
 * The keyed-aggregate primitive: per key, a value of aggregates (count, sum, min, max, latest) over the
 * key's events, deleted by an event that asks for it, and optionally evicted after a processing-time TTL.
 * A job declares it in Python (spark_jobs/primitives/keyed_aggregate.py); this processor is generic: the
 * declaration's expressions are evaluated by Spark before it, and it reads them as columns.
 *
 * <p>Input columns: the key, {@code offset} (a key's events all sit in one source partition, so offset
 * order is the order they happened), {@link Rows#DELETE_COLUMN} (true: the event deletes the key) and one
 * {@link #INPUT_PREFIX}{@code i} column per aggregate, already of the aggregate's stored type (for count:
 * 1 when the event counts, else 0). The stored value is the aggregates in order, then {@code touched_at_ms}
 * (processing time of the last change: a restored TTL timer keeps its deadline).
 *
 * <p>Per micro-batch, one change row per key the batch saw: its new value, or a tombstone when the key's
 * last event of the batch deleted it, even when the store did not hold the key (created and deleted inside
 * the batch: the outputs may hold a row the store never recorded, and the delete must reach them, as a
 * Kafka Streams aggregate forwards its tombstone). After a delete, a later event starts the key afresh.
 */
public final class KeyedAggregate {
  /** Input columns {@code _in_0, _in_1, ...}: each aggregate's input. */
  public static final String INPUT_PREFIX = "_in_";

  private KeyedAggregate() {}

  /**
   * The change stream of {@code events} grouped by {@code keyColumn} through the aggregate {@code kinds}
   * (comma-separated: count, sum, min, max, latest; one per value field of {@code stateDdl} but the last,
   * {@code touched_at_ms}); {@code initial} (key + value columns, or null) seeds the store after a restore.
   * Rejected records among {@code events} pass through (see {@link DeadLetters}). When each input
   * partition holds its events in offset order ({@code offsetOrdered}: a Kafka source's do), they are
   * combined per partition before the shuffle ({@link PartialAggregates}), unless a sum is DOUBLE.
   */
  public static Dataset<Row> changes(Dataset<Row> events, String keyColumn, Dataset<Row> initial, String store,
                                     String stateDdl, String changeDdl, long ttlMs, String kinds,
                                     boolean offsetOrdered) {
    StructType state = StructType.fromDDL(stateDdl);
    Kind[] parsed = Kind.parse(kinds, state.size() - 1);
    Dataset<Row> input = offsetOrdered && PartialAggregates.combinable(parsed, state)
        ? PartialAggregates.combine(events, keyColumn, parsed) : events;
    TimeMode timeMode = ttlMs > 0 ? TimeMode.ProcessingTime() : TimeMode.None();
    return KeyedValueProcessor.changes(input, events.schema(), keyColumn, initial,
        new Aggregator(store, state, parsed, ttlMs), timeMode, StructType.fromDDL(changeDdl));
  }

  /**
   * The rules of a key, record by record: the aggregates of {@code current} (a stored value, or null when
   * the store does not hold the key) with {@code events} (at least one, in offset order) applied; null when
   * the last of them deleted the key (a delete resets what came before it; a later event starts afresh).
   */
  static Object[] aggregate(Kind[] kinds, StructType stateSchema, Row current, List<Row> events) {
    boolean alive = current != null;
    Object[] aggregates = alive ? Kind.read(current, kinds.length) : Kind.fresh(kinds, stateSchema);
    int[] inputs = Rows.inputIndexes(events, kinds.length);
    for (Row event : events) {
      if (Boolean.TRUE.equals(event.getAs(Rows.DELETE_COLUMN))) {
        alive = false;
        aggregates = Kind.fresh(kinds, stateSchema);
        continue;
      }
      alive = true;
      Kind.applyAll(kinds, aggregates, event, inputs);
    }
    return alive ? aggregates : null;
  }

  /** What an aggregate keeps of its inputs. Null inputs are skipped; a count's input is how many events
   * it counts (0 or 1 for one event, more for {@link PartialAggregates}' combined events). */
  enum Kind {
    COUNT, SUM, MIN, MAX, LATEST;

    static Kind[] parse(String kinds, int expected) {
      String[] names = kinds.split(",");
      if (names.length != expected) {
        throw new IllegalArgumentException(names.length + " aggregates (" + kinds + ") for " + expected + " value fields");
      }
      Kind[] parsed = new Kind[names.length];
      for (int i = 0; i < names.length; i++) {
        parsed[i] = Kind.valueOf(names[i].trim().toUpperCase(Locale.ROOT));
      }
      return parsed;
    }

    /** Fresh values of {@code kinds}, typed by the first fields of {@code schema}. */
    static Object[] fresh(Kind[] kinds, StructType schema) {
      Object[] aggregates = new Object[kinds.length];
      for (int i = 0; i < kinds.length; i++) {
        aggregates[i] = kinds[i].initial(schema.fields()[i].dataType());
      }
      return aggregates;
    }

    /** {@code aggregates} with the inputs of {@code event} (at {@code inputs}: {@link Rows#inputIndexes})
     * applied, in place. */
    static void applyAll(Kind[] kinds, Object[] aggregates, Row event, int[] inputs) {
      for (int i = 0; i < kinds.length; i++) {
        aggregates[i] = kinds[i].apply(aggregates[i], event.get(inputs[i]));
      }
    }

    /** The aggregates of a stored value: its first {@code count} fields (a time follows them). */
    static Object[] read(Row stored, int count) {
      Object[] aggregates = new Object[count];
      for (int i = 0; i < count; i++) {
        aggregates[i] = stored.get(i);
      }
      return aggregates;
    }

    /** A stored value: the aggregates, then {@code timeMs} (the key's processing or event time). */
    static Object[] stored(Object[] aggregates, long timeMs) {
      Object[] value = Arrays.copyOf(aggregates, aggregates.length + 1);
      value[aggregates.length] = timeMs;
      return value;
    }

    /** The value of a key that has no events yet: count and sum start at zero, the others at null. */
    Object initial(DataType type) {
      if (this == COUNT) {
        return 0L;
      }
      if (this != SUM) {
        return null;
      }
      if (type instanceof DecimalType) {
        return BigDecimal.ZERO.setScale(((DecimalType) type).scale());
      }
      return type.equals(DataTypes.DoubleType) ? (Object) 0.0 : (Object) 0L;
    }

    /**
     * {@code current} with {@code input} applied; associative, so inputs combined first give the same
     * result ({@link PartialAggregates}). A null input leaves {@code current}; a null {@code current} (a
     * combination's start, or a min/max/latest without input yet) takes the input.
     */
    @SuppressWarnings("unchecked")
    Object apply(Object current, Object input) {
      if (input == null || current == null) {
        return input == null ? current : input;
      }
      switch (this) {
        case COUNT:
          return (Long) current + (Long) input;
        case SUM:
          if (current instanceof BigDecimal) {
            return ((BigDecimal) current).add((BigDecimal) input);
          }
          if (current instanceof Double) {
            return (Double) current + (Double) input;
          }
          return Math.addExact((Long) current, (Long) input);
        case MIN:
        case MAX:
          int order = ((Comparable<Object>) input).compareTo(current);
          return (this == MIN ? order < 0 : order > 0) ? input : current;
        default:  // LATEST
          return input;
      }
    }
  }

  static final class Aggregator extends KeyedValueProcessor {
    private final Kind[] kinds;
    private final long ttlMs;

    Aggregator(String store, StructType stateSchema, Kind[] kinds, long ttlMs) {
      super(store, stateSchema);
      this.kinds = kinds;
      this.ttlMs = ttlMs;
    }

    @Override
    public Iterator<Row> handleInputRows(String key, Iterator<Row> rows, TimerValues timerValues) {
      Object[] aggregates = aggregate(kinds, stateSchema, stored.get(), Rows.inOffsetOrder(rows));
      if (aggregates == null) {
        return Rows.one(delete(key));
      }
      long now = nowMs(timerValues);
      Object[] value = Kind.stored(aggregates, now);
      stored.update(RowFactory.create(value));
      restartTtl(now);
      return Rows.one(Rows.change(key, false, value));
    }

    @Override
    public Iterator<Row> handleExpiredTimer(String key, TimerValues timerValues, ExpiredTimerInfo info) {
      return stored.exists() ? Rows.one(delete(key)) : Rows.none();
    }

    @Override
    public void handleInitialState(String key, Row initial, TimerValues timerValues) {
      super.handleInitialState(key, initial, timerValues);
      if (ttlMs > 0) {
        getHandle().registerTimer(initial.<Long>getAs("touched_at_ms") + ttlMs);
      }
    }

    private void restartTtl(long now) {
      if (ttlMs <= 0) {
        return;
      }
      deleteTimers();
      getHandle().registerTimer(now + ttlMs);
    }

    private Row delete(String key) {
      stored.clear();
      if (ttlMs > 0) {
        deleteTimers();
      }
      return Rows.change(key, true, new Object[stateSchema.size()]);
    }

    private void deleteTimers() {
      List<Long> deadlines = new ArrayList<>();
      Iterator<Object> timers = getHandle().listTimers();
      while (timers.hasNext()) {
        deadlines.add((Long) timers.next());
      }
      for (long deadline : deadlines) {
        getHandle().deleteTimer(deadline);
      }
    }

    private static long nowMs(TimerValues timerValues) {
      long now = timerValues.getCurrentProcessingTimeInMs();
      return now > 0 ? now : System.currentTimeMillis();
    }
  }
}
