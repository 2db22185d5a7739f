package streamstate.primitives;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;

import org.apache.spark.api.java.function.FlatMapGroupsWithStateFunction;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.GroupState;
import org.apache.spark.sql.streaming.GroupStateTimeout;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;

import streamstate.jobs.DeadLetters;

/**
 * The keyed-aggregate primitive in a store of kind {@code in_memory}: {@link KeyedAggregate}'s rules and
 * change rows, kept in Spark's in-memory state store. Declared in Python (spark_jobs/primitives/keyed_aggregate.py,
 * a store with {@code kind="in_memory"}).
 *
 * <p>Spark runs {@code transformWithState} on RocksDB only; its other state store,
 * {@code HDFSBackedStateStoreProvider}, keeps each partition's keys in a JVM hash map, writes each
 * micro-batch's changes to a delta file in the checkpoint (its changelog) and, now and then, the whole map
 * (its snapshot), and on a start or on another executor loads the map in full from those files: Kafka
 * Streams' in-memory store ({@code Stores.inMemoryKeyValueStore}: no local database, a full restore on every
 * start). That store serves Spark's older stateful API, {@code flatMapGroupsWithState}, with one value per
 * key: this processor. The job's query must run with that provider (the pipeline sets it for the query:
 * spark_jobs/driver/session.py {@code IN_MEMORY_PROVIDER}; an existing checkpoint keeps the provider it was started with).
 *
 * <p>Input columns: those of {@link KeyedAggregate}. The stored value and the change rows are
 * {@link KeyedAggregate}'s ({@code touched_at_ms} is the micro-batch's processing time), so the changelog,
 * snapshots and a restore are the same as for a {@code key_value} store. No TTL: Kafka Streams' in-memory
 * store has none either.
 */
public final class InMemoryAggregate {
  private InMemoryAggregate() {}

  /**
   * The change stream of {@code events} grouped by {@code keyColumn} through the aggregate {@code kinds},
   * as {@link KeyedAggregate#changes} (the same arguments: a declaration picks the class by its store's
   * kind) but without a TTL ({@code ttlMs} must be 0); {@code initial} (key + value columns, or null) seeds
   * the store after a restore. Rejected records among {@code events} pass through (see {@link DeadLetters}).
   */
  public static Dataset<Row> changes(Dataset<Row> events, String keyColumn, Dataset<Row> initial, String store,
                                     String stateDdl, String changeDdl, long ttlMs, String kinds,
                                     boolean offsetOrdered) {
    if (ttlMs != 0) {
      throw new IllegalArgumentException("store " + store + ": an in-memory store has no TTL, got " + ttlMs + " ms");
    }
    StructType state = StructType.fromDDL(stateDdl);
    KeyedAggregate.Kind[] parsed = KeyedAggregate.Kind.parse(kinds, state.size() - 1);
    Dataset<Row> input = offsetOrdered && PartialAggregates.combinable(parsed, state)
        ? PartialAggregates.combine(events, keyColumn, parsed) : events;
    StructType change = StructType.fromDDL(changeDdl);
    boolean letters = Arrays.asList(events.schema().fieldNames()).contains(DeadLetters.COLUMN);
    StructType rows = letters ? change.add(events.schema().apply(DeadLetters.COLUMN)) : change;
    Update update = new Update(parsed, state, change.size(), letters);
    KeyValueGroupedDataset<String, Row> grouped = Rows.byColumn(input, keyColumn);
    if (initial == null) {
      return grouped.flatMapGroupsWithState(update, OutputMode.Update(), Encoders.row(state), Encoders.row(rows),
          GroupStateTimeout.NoTimeout());
    }
    KeyValueGroupedDataset<String, Row> seeded = Rows.byColumn(initial, KeyedValueProcessor.INITIAL_KEY)
        .mapValues((MapFunction<Row, Row>) row -> Rows.select(row, state), Encoders.row(state));
    return grouped.flatMapGroupsWithState(update, OutputMode.Update(), Encoders.row(state), Encoders.row(rows),
        GroupStateTimeout.NoTimeout(), seeded);
  }

  /** One key's micro-batch: its rejected records passed on, its events applied to its stored value. */
  static final class Update implements FlatMapGroupsWithStateFunction<String, Row, Row, Row> {
    private final KeyedAggregate.Kind[] kinds;
    private final StructType state;
    private final int width;
    private final boolean letters;

    Update(KeyedAggregate.Kind[] kinds, StructType state, int width, boolean letters) {
      this.kinds = kinds;
      this.state = state;
      this.width = width;
      this.letters = letters;
    }

    @Override
    public Iterator<Row> call(String key, Iterator<Row> rows, GroupState<Row> stored) {
      List<Row> events = new ArrayList<>();
      List<Row> out = new ArrayList<>();
      while (rows.hasNext()) {
        Row row = rows.next();
        Object letter = letters ? row.getAs(DeadLetters.COLUMN) : null;
        if (letter == null) {
          events.add(row);
        } else {
          out.add(widen(null, letter));
        }
      }
      if (events.isEmpty()) {  // only rejected records: the store is not touched
        return out.iterator();
      }
      List<Row> ordered = Rows.inOffsetOrder(CollectionConverters.asScala(events.iterator()));
      Object[] aggregates = KeyedAggregate.aggregate(kinds, state, stored.exists() ? stored.get() : null, ordered);
      Object[] value;
      if (aggregates == null) {
        stored.remove();
        value = new Object[state.size()];
      } else {
        value = KeyedAggregate.Kind.stored(aggregates, stored.getCurrentProcessingTimeMs());
        stored.update(RowFactory.create(value));
      }
      out.add(widen(Rows.change(key, aggregates == null, value), null));
      return out.iterator();
    }

    /** A change row (or all nulls), then the dead letter column when the input has one. */
    private Row widen(Row change, Object letter) {
      return letters ? DeadLetters.widen(change, letter, width) : change;
    }
  }
}
