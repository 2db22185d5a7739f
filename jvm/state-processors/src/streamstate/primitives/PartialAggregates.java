package streamstate.primitives;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import streamstate.jobs.DeadLetters;

/**
 * {@link KeyedAggregate}'s input combined before the shuffle, as Spark's partial aggregation combines a
 * {@code groupBy().agg()}'s, but in the order the events happened: a delete in the middle of a key's events
 * must still reset what came before it.
 *
 * <p>Within one input partition (one offset range of one Kafka partition, read in offset order) a key's
 * events become at most two rows: its last delete (the events before it no longer matter), then one row
 * holding the aggregates of the events after it, merged with {@link KeyedAggregate.Kind#apply} (which is
 * associative: count and sum add, min and max compare, latest keeps the later non-null). Each row carries
 * the offset of the last event it stands for, so the processor, which applies a key's rows in offset order,
 * computes what it would have from the single events. A DOUBLE sum is not associative (the last bits of
 * a floating-point sum depend on the order of the additions), so such a store is never combined.
 *
 * <p>Rejected records ({@link DeadLetters#COLUMN} set) pass through as they are.
 */
final class PartialAggregates implements MapPartitionsFunction<Row, Row> {
  /** Keys held at once per partition before the partials are emitted (bounds the memory it takes; a key
   * emitted twice is two partials of disjoint offset ranges, still correct). */
  static final int MAX_KEYS = 1 << 16;

  private final int keyIndex;
  private final int offsetIndex;
  private final int deleteIndex;
  private final int letterIndex;
  private final int[] inputIndexes;
  private final KeyedAggregate.Kind[] kinds;
  private final StructType schema;

  private PartialAggregates(StructType schema, String keyColumn, KeyedAggregate.Kind[] kinds) {
    this.keyIndex = schema.fieldIndex(keyColumn);
    this.offsetIndex = schema.fieldIndex("offset");
    this.deleteIndex = schema.fieldIndex(Rows.DELETE_COLUMN);
    this.letterIndex = Arrays.asList(schema.fieldNames()).contains(DeadLetters.COLUMN)
        ? schema.fieldIndex(DeadLetters.COLUMN) : -1;
    this.inputIndexes = new int[kinds.length];
    for (int i = 0; i < kinds.length; i++) {
      inputIndexes[i] = schema.fieldIndex(KeyedAggregate.INPUT_PREFIX + i);
    }
    this.kinds = kinds;
    this.schema = schema;
  }

  /** True when the aggregates of {@code state} (its first {@code kinds.length} fields) may be combined. */
  static boolean combinable(KeyedAggregate.Kind[] kinds, StructType state) {
    for (int i = 0; i < kinds.length; i++) {
      if (kinds[i] == KeyedAggregate.Kind.SUM && state.fields()[i].dataType().equals(DataTypes.DoubleType)) {
        return false;
      }
    }
    return true;
  }

  /** {@code events} (the processor's input columns, see {@link KeyedAggregate}) combined per partition. */
  static Dataset<Row> combine(Dataset<Row> events, String keyColumn, KeyedAggregate.Kind[] kinds) {
    StructField[] fields = events.schema().fields().clone();
    for (int i = 0; i < fields.length; i++) {  // a delete's row has no inputs
      fields[i] = new StructField(fields[i].name(), fields[i].dataType(), true, fields[i].metadata());
    }
    StructType schema = new StructType(fields);
    return events.mapPartitions(new PartialAggregates(schema, keyColumn, kinds), Encoders.row(schema));
  }

  @Override
  public Iterator<Row> call(Iterator<Row> rows) {
    List<Row> out = new ArrayList<>();
    Map<String, Partial> partials = new LinkedHashMap<>();
    while (rows.hasNext()) {
      Row row = rows.next();
      if (letterIndex >= 0 && !row.isNullAt(letterIndex)) {
        out.add(row);
        continue;
      }
      String key = row.getString(keyIndex);
      Partial partial = partials.get(key);
      if (partial == null) {
        if (partials.size() == MAX_KEYS) {
          emit(partials, out);
        }
        partial = new Partial();
        partials.put(key, partial);
      }
      partial.add(row);
    }
    emit(partials, out);
    return out.iterator();
  }

  private void emit(Map<String, Partial> partials, List<Row> out) {
    for (Map.Entry<String, Partial> entry : partials.entrySet()) {
      Partial partial = entry.getValue();
      if (partial.deleteOffset >= 0) {
        out.add(row(entry.getKey(), partial.deleteOffset, true, null));
      }
      if (partial.aggregates != null) {
        out.add(row(entry.getKey(), partial.lastOffset, false, partial.aggregates));
      }
    }
    partials.clear();
  }

  private Row row(String key, long offset, boolean delete, Object[] aggregates) {
    Object[] values = new Object[schema.size()];
    values[keyIndex] = key;
    values[offsetIndex] = offset;
    values[deleteIndex] = delete;
    for (int i = 0; aggregates != null && i < kinds.length; i++) {
      values[inputIndexes[i]] = aggregates[i];
    }
    // with its schema: Spark hands these objects straight to the processor's grouping function, which reads
    // fields by name (the encoder's serialize-deserialize pair is optimised away)
    return new GenericRowWithSchema(values, schema);
  }

  /** One key's events of a partition so far: its last delete, and the aggregates of the events after it. */
  private final class Partial {
    long deleteOffset = -1;
    long lastOffset = -1;
    /** null: no event since the last delete (or at all) */
    Object[] aggregates;

    void add(Row event) {
      long offset = event.getLong(offsetIndex);
      if (offset < Math.max(deleteOffset, lastOffset)) {
        // a Kafka partition is read in offset order; combining out-of-order events would reorder them
        throw new IllegalStateException("input partition not in offset order: offset " + offset + " after "
            + Math.max(deleteOffset, lastOffset));
      }
      if (event.getBoolean(deleteIndex)) {
        deleteOffset = offset;
        aggregates = null;
        return;
      }
      if (aggregates == null) {
        aggregates = new Object[kinds.length];
      }
      for (int i = 0; i < kinds.length; i++) {
        aggregates[i] = kinds[i].apply(aggregates[i], event.get(inputIndexes[i]));
      }
      lastOffset = offset;
    }
  }
}
