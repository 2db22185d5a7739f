package streamstate.primitives;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

import streamstate.jobs.DeadLetters;

/**
 * The keyed-aggregate primitive in a store of kind {@code lru}: the aggregates of {@link KeyedAggregate},
 * kept for the {@code maxEntries} most recently used keys of each source partition, as Kafka Streams'
 * {@code Stores.lruMap(name, maxEntries)} behind a {@code groupByKey().aggregate()} keeps them per task.
 * Declared in Python (spark_jobs/primitives/keyed_aggregate.py, a store with {@code kind="lru"}).
 *
 * <p>The rules, record by record in offset order, as Kafka Streams' {@code MemoryLRUCache} (a
 * {@code LinkedHashMap} in access order) applies them to {@code KStreamAggregate}'s get-then-put:
 *
 * <ul>
 *   <li>an aggregated event makes its key the partition's <b>most recently used</b> (the get and the put
 *       both touch it; the put is the later, so the key's recency is that of its latest event);
 *   <li>a put of a key the store did not hold that makes the store exceed {@code maxEntries} <b>evicts the
 *       least recently used key</b>: a tombstone, in the changelog (what Kafka Streams' change-logging layer
 *       writes from an LRU's eviction listener; behind an aggregate's timestamped store it installs none, see
 *       docs/writing-jobs/lru-store.md, "Known differences") and in the outputs, which are the store projected to a table (Kafka
 *       Streams forwards nothing downstream for an eviction);
 *   <li>a deleting event ({@link Rows#DELETE_COLUMN}) removes the key, a tombstone even when the store did
 *       not hold it (as {@link KeyedAggregate} does); it makes no other key more or less recent;
 *   <li>an evicted key's next event starts it afresh.
 * </ul>
 *
 * <p>Recency is a per-partition sequence number, stored with each key's value ({@code recency}) and in the
 * change rows, so the changelog and snapshots carry it and a restore rebuilds the exact order: the
 * restored rows seed the keys and the partition's sequence continues above the largest restored one.
 *
 * <p>Input columns: those of {@link KeyedAggregate} plus the source's {@code partition}. Output rows: the
 * key, {@code tombstone}, the aggregates, {@code recency}, {@code source_partition}; one per key changed in
 * the micro-batch (its last change).
 *
 * <p>State per partition: each key's value and recency ({@code MapState}), the partition's last sequence
 * number and its number of keys. Finding the least recently used key costs one scan of the partition's
 * keys, at most once per micro-batch (the first eviction of the batch indexes the keys by recency; the
 * following ones take the smallest from that index): right for the small {@code maxEntries} an LRU store
 * is for, O(maxEntries) per micro-batch that evicts.
 */
public final class LruAggregate {
  private LruAggregate() {}

  /** The restored-state rows {@link #changes} takes: {@code source_partition}, {@code key}, the value
   * ({@code valuesDdl}) and {@code recency}. */
  public static String initialDdl(String valuesDdl) {
    return "source_partition INT, key STRING, " + valuesDdl + ", recency BIGINT";
  }

  /**
   * The store's change rows (see the class comment) for {@code events} grouped by {@code partitionColumn};
   * {@code initial} ({@link #initialDdl}, or null) seeds the store. {@code valuesDdl} names the aggregates
   * and their types, {@code kinds} their kinds (comma-separated). Rejected records among {@code events} pass
   * through (see {@link DeadLetters}).
   */
  public static Dataset<Row> changes(Dataset<Row> events, String partitionColumn, Dataset<Row> initial, String store,
                                     String changeDdl, String valuesDdl, String kinds, long maxEntries,
                                     String keyColumn) {
    StructType values = StructType.fromDDL(valuesDdl);
    Lru processor = new Lru(store, values, KeyedAggregate.Kind.parse(kinds, values.size()), maxEntries, keyColumn);
    return PartitionTask.changes(events, partitionColumn, initial, processor, OutputMode.Update(),
        StructType.fromDDL(changeDdl));
  }

  static final class Lru extends PartitionTask {
    private final String store;
    private final StructType values;
    private final KeyedAggregate.Kind[] kinds;
    private final long maxEntries;
    private final String keyColumn;
    /** A stored key: its aggregates, then its recency. */
    private final StructType keySchema;
    private transient MapState<String, Row> keys;
    /** the partition's last recency sequence number (absent: none given yet) */
    private transient ValueState<Long> lastRecency;
    /** the number of keys the partition holds */
    private transient ValueState<Long> size;

    Lru(String store, StructType values, KeyedAggregate.Kind[] kinds, long maxEntries, String keyColumn) {
      this.store = store;
      this.values = values;
      this.kinds = kinds;
      this.maxEntries = maxEntries;
      this.keyColumn = keyColumn;
      this.keySchema = values.add("recency", DataTypes.LongType);
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      keys = getHandle().getMapState(store, Encoders.STRING(), Encoders.row(keySchema), TTLConfig.NONE());
      lastRecency = getHandle().getValueState(store + "-last-recency", Encoders.LONG(), TTLConfig.NONE());
      size = getHandle().getValueState(store + "-size", Encoders.LONG(), TTLConfig.NONE());
    }

    @Override
    protected Iterator<Row> handlePartitionRows(int partition, Iterator<Row> rows) {
      List<Row> events = Rows.inOffsetOrder(rows);
      int[] inputs = Rows.inputIndexes(events, kinds.length);
      Batch batch = new Batch(partition);
      for (Row event : events) {
        String key = event.getAs(keyColumn);
        if (Boolean.TRUE.equals(event.getAs(Rows.DELETE_COLUMN))) {
          batch.remove(key);
          continue;
        }
        Entry current = batch.get(key);
        Object[] aggregates = current == null ? KeyedAggregate.Kind.fresh(kinds, values) : current.aggregates;
        KeyedAggregate.Kind.applyAll(kinds, aggregates, event, inputs);
        batch.put(key, aggregates);
      }
      return CollectionConverters.asScala(batch.finish().iterator());
    }

    @Override
    protected void handlePartitionState(int partition, Row initial) {
      Row value = Rows.select(initial, keySchema);
      String key = initial.getAs("key");
      if (!keys.containsKey(key)) {
        size.update(sizeOrZero() + 1);
      }
      keys.updateValue(key, value);
      long recency = value.getLong(kinds.length);
      if (!lastRecency.exists() || recency > lastRecency.get()) {
        lastRecency.update(recency);
      }
    }

    private long sizeOrZero() {
      return size.exists() ? size.get() : 0L;
    }

    /** A key's value in a batch: its aggregates and its recency. */
    private static final class Entry {
      final Object[] aggregates;
      final long recency;

      Entry(Object[] aggregates, long recency) {
        this.aggregates = aggregates;
        this.recency = recency;
      }
    }

    /** One micro-batch of one partition: the keys it reads cached, written back once at the end. */
    private final class Batch {
      final int partition;
      /** key -> its value, or null once removed or evicted in this batch */
      final Map<String, Entry> cache = new HashMap<>();
      /** recency -> key of every key the partition holds, once an eviction made the batch index them */
      TreeMap<Long, String> byRecency;
      /** latest change row per key, in the order first changed */
      final Map<String, Row> changes = new LinkedHashMap<>();
      long recency;
      long held;

      Batch(int partition) {
        this.partition = partition;
        this.recency = lastRecency.exists() ? lastRecency.get() : 0L;
        this.held = sizeOrZero();
      }

      Entry get(String key) {
        if (cache.containsKey(key)) {
          return cache.get(key);
        }
        Row row = keys.getValue(key);  // null: absent (one read: containsKey is a read too)
        Entry entry = row == null ? null
            : new Entry(KeyedAggregate.Kind.read(row, kinds.length), row.getLong(kinds.length));
        cache.put(key, entry);
        return entry;
      }

      /** {@code key} now holds {@code aggregates} and is the most recently used; a new key over the limit
       * evicts the least recently used. */
      void put(String key, Object[] aggregates) {
        Entry previous = get(key);
        if (previous != null && byRecency != null) {
          byRecency.remove(previous.recency);
        }
        Entry entry = new Entry(aggregates, ++recency);
        cache.put(key, entry);
        if (byRecency != null) {
          byRecency.put(entry.recency, key);
        }
        changes.put(key, change(key, entry));
        if (previous == null) {
          held++;
          while (held > maxEntries) {  // more than one only when a restored store held more keys than allowed
            evictLeastRecent();
          }
        }
      }

      void remove(String key) {
        Entry previous = get(key);
        if (previous != null) {
          held--;
          if (byRecency != null) {
            byRecency.remove(previous.recency);
          }
        }
        cache.put(key, null);
        changes.put(key, change(key, null));
      }

      private void evictLeastRecent() {
        if (byRecency == null) {
          index();
        }
        String evicted = byRecency.pollFirstEntry().getValue();
        cache.put(evicted, null);
        held--;
        changes.put(evicted, change(evicted, null));
      }

      /** Index every key the partition holds by recency (the batch's values win over the stored ones). */
      private void index() {
        byRecency = new TreeMap<>();
        Iterator<Tuple2<String, Row>> stored = keys.iterator();
        while (stored.hasNext()) {
          Tuple2<String, Row> entry = stored.next();
          if (!cache.containsKey(entry._1())) {
            byRecency.put(entry._2().getLong(kinds.length), entry._1());
          }
        }
        for (Map.Entry<String, Entry> cached : cache.entrySet()) {
          if (cached.getValue() != null) {
            byRecency.put(cached.getValue().recency, cached.getKey());
          }
        }
      }

      List<Row> finish() {
        for (Map.Entry<String, Entry> entry : cache.entrySet()) {
          Entry value = entry.getValue();
          if (value == null) {
            keys.removeKey(entry.getKey());
          } else if (changes.containsKey(entry.getKey())) {
            keys.updateValue(entry.getKey(),
                RowFactory.create(KeyedAggregate.Kind.stored(value.aggregates, value.recency)));
          }
        }
        lastRecency.update(recency);
        size.update(held);
        return new ArrayList<>(changes.values());
      }

      /** A change row: the key's value, recency and partition, or a tombstone (null {@code entry}). */
      private Row change(String key, Entry entry) {
        Object[] value = new Object[kinds.length + 2];
        if (entry != null) {
          System.arraycopy(entry.aggregates, 0, value, 0, kinds.length);
          value[kinds.length] = entry.recency;
        }
        value[kinds.length + 1] = partition;
        return Rows.change(key, entry == null, value);
      }
    }
  }
}
