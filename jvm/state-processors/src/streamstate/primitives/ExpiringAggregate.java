package streamstate.primitives;

import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.collection.Iterator;

import streamstate.jobs.DeadLetters;

/**
 * The keyed-aggregate primitive with a TTL in <b>event time</b>: the aggregates of {@link KeyedAggregate},
 * and a key leaves the store when the stream's event time has moved on {@code ttl} past the key's own.
 * Declared in Python (spark_jobs/primitives/keyed_aggregate.py, {@code time=} and a store with
 * {@code ttl_clock="event_time"}).
 *
 * <p>Like {@link WindowedAggregate} the processor is keyed by <b>source partition</b> (Kafka Streams'
 * task): it sees the partition's records of a micro-batch in offset order, and <b>stream time</b> is the
 * partition's largest event time so far, advanced by each record before it is applied. So expiry never
 * depends on where micro-batches begin and end:
 *
 * <ul>
 *   <li>a key's event time is the largest event time of the events aggregated since it was (re)started
 *       (Kafka Streams gives an aggregate's result the largest timestamp of its inputs);
 *   <li>a key <b>expires</b> when stream time reaches its event time + ttl: a tombstone, and a later event
 *       starts it afresh;
 *   <li>an event for a key the store does not hold whose own time + ttl has already passed is <b>late</b>:
 *       it would expire on arrival, so it is refused (an output row the job dead-letters), never applied
 *       silently and dropped. An old event for a key that is alive is aggregated;
 *   <li>a deleting event ({@link Rows#DELETE_COLUMN}) removes the key (a tombstone even when the store did
 *       not hold it, as {@link KeyedAggregate} does).
 * </ul>
 *
 * <p>Input columns: those of {@link KeyedAggregate}, plus the event time and the source's
 * {@code partition}, {@code timestamp} and {@code value}. Output rows ({@code outputDdl}): {@code kind}
 * ({@code change} or {@code late}), {@code key}, {@code tombstone}, the aggregates, {@code event_time_ms},
 * {@code source_partition}, {@code stream_time_ms} and, for a late event, its {@code source_offset},
 * {@code source_timestamp} and {@code raw} value. Per batch: one change row per changed key, and one row
 * with a null key per partition whose stream time moved, so a restore continues stream time exactly.
 *
 * <p>State per partition: its stream time, each key's value and the earliest expiry. When an advance
 * passes that earliest expiry the batch indexes the partition's keys by expiry once (one scan of the
 * partition's keys per micro-batch that expires any), then expires in order as stream time moves.
 */
public final class ExpiringAggregate {
  static final String CHANGE = "change";
  static final String LATE = "late";

  private ExpiringAggregate() {}

  /** The restored-state rows {@link #changes} takes: {@code source_partition}, {@code key}, the value
   * ({@code valuesDdl}), {@code event_time_ms}, and {@code stream_time_ms} (set, with key null, on the row
   * of a partition's stream time). */
  public static String initialDdl(String valuesDdl) {
    return "source_partition INT, key STRING, " + valuesDdl + ", event_time_ms BIGINT, stream_time_ms BIGINT";
  }

  /**
   * The store's output rows (see the class comment) for {@code events} grouped by {@code partitionColumn};
   * {@code initial} ({@link #initialDdl}, or null) seeds the store. {@code valuesDdl} names the aggregates
   * and their types, {@code kinds} their kinds (comma-separated). Rejected records among {@code events}
   * pass through (see {@link DeadLetters}).
   */
  public static Dataset<Row> changes(Dataset<Row> events, String partitionColumn, Dataset<Row> initial, String store,
                                     String outputDdl, String valuesDdl, String kinds, long ttlMs, String keyColumn,
                                     String timeColumn) {
    StructType output = StructType.fromDDL(outputDdl);
    StructType values = StructType.fromDDL(valuesDdl);
    Expiring processor = new Expiring(store, values, KeyedAggregate.Kind.parse(kinds, values.size()), ttlMs,
        output.size(), keyColumn, timeColumn);
    return PartitionTask.changes(events, partitionColumn, initial, processor, OutputMode.Update(), output);
  }

  static final class Expiring extends AggregateTask {
    /** A stored key: its aggregates, then its event time. */
    private final StructType keySchema;
    private final long ttlMs;
    /** no key of the partition expires before this (it may be earlier than the true earliest expiry) */
    private transient ValueState<Long> nextExpiry;
    private transient MapState<String, Row> keys;

    Expiring(String store, StructType values, KeyedAggregate.Kind[] kinds, long ttlMs, int outputWidth,
             String keyColumn, String timeColumn) {
      super(store, values, kinds, outputWidth, keyColumn, timeColumn);
      this.keySchema = values.add("event_time_ms", DataTypes.LongType);
      this.ttlMs = ttlMs;
    }

    @Override
    protected void initStores() {
      nextExpiry = getHandle().getValueState(store + "-next-expiry", Encoders.LONG(), TTLConfig.NONE());
      keys = getHandle().getMapState(store, Encoders.STRING(), Encoders.row(keySchema), TTLConfig.NONE());
    }

    @Override
    protected Batch newBatch(int partition) {
      return new Batch(partition);
    }

    @Override
    protected void restoreKey(String key, Row initial) {
      Row value = Rows.select(initial, keySchema);
      keys.updateValue(key, value);
      long expiresAt = value.getLong(kinds.length) + ttlMs;
      if (!nextExpiry.exists() || expiresAt < nextExpiry.get()) {
        nextExpiry.update(expiresAt);
      }
    }

    /** A key's value in a batch: its aggregates and its event time. */
    private static final class Entry {
      final Object[] aggregates;
      final long eventTime;

      Entry(Object[] aggregates, long eventTime) {
        this.aggregates = aggregates;
        this.eventTime = eventTime;
      }
    }

    /** One micro-batch of one partition: the keys it reads cached, written back once at the end. */
    private final class Batch extends EventBatch {
      /** key -> its value, or null once removed in this batch */
      final Map<String, Entry> cache = new HashMap<>();
      /** expiry time -> keys, once an advance made the batch index the partition (null until then) */
      TreeMap<Long, Set<String>> byExpiry;
      /** latest change row per key, in the order first changed */
      final Map<String, Row> changes = new LinkedHashMap<>();
      /** the partition's earliest expiry until the batch indexes it ({@link Long#MAX_VALUE}: none), held here:
       * a state read per record was a large part of a batch's time */
      private long expiry;

      Batch(int partition) {
        super(partition);
        expiry = nextExpiry.exists() ? nextExpiry.get() : Long.MAX_VALUE;
      }

      @Override
      protected void onAdvance() {
        if (byExpiry == null && expiry <= now) {
          index();
        }
        if (byExpiry != null) {
          while (!byExpiry.isEmpty() && byExpiry.firstKey() <= now) {
            for (String key : byExpiry.pollFirstEntry().getValue()) {
              cache.put(key, null);
              changes.put(key, output(CHANGE, true, key, null, null, partition, null, null, null, null));
            }
          }
        }
      }

      /** The event applied to its key's value; late when the key had expired (or never was) and the event
       * is older than the ttl. */
      @Override
      void apply(String key, long t, Row event, int[] inputs) {
        Entry current = get(key);
        if (current == null && t + ttlMs <= now) {
          out.add(output(LATE, false, key, null, t, partition, now, event.getAs("offset"), event.getAs("timestamp"),
              event.getAs("value")));
          return;
        }
        Object[] aggregates = current == null ? KeyedAggregate.Kind.fresh(kinds, values) : current.aggregates;
        KeyedAggregate.Kind.applyAll(kinds, aggregates, event, inputs);
        put(key, new Entry(aggregates, current == null ? t : Math.max(current.eventTime, t)));
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

      void put(String key, Entry entry) {
        unindex(key);
        cache.put(key, entry);
        long expiresAt = entry.eventTime + ttlMs;
        if (byExpiry != null) {
          byExpiry.computeIfAbsent(expiresAt, at -> new LinkedHashSet<>()).add(key);
        } else {
          expiry = Math.min(expiry, expiresAt);
        }
        Object[] value = KeyedAggregate.Kind.stored(entry.aggregates, entry.eventTime);
        changes.put(key, output(CHANGE, false, key, value, null, partition, null, null, null, null));
      }

      @Override
      void delete(String key) {
        unindex(key);
        cache.put(key, null);
        changes.put(key, output(CHANGE, true, key, null, null, partition, null, null, null, null));
      }

      /** Index every key of the partition by its expiry (the cached values win over the stored ones). */
      private void index() {
        byExpiry = new TreeMap<>();
        Iterator<Tuple2<String, Row>> stored = keys.iterator();
        while (stored.hasNext()) {
          Tuple2<String, Row> entry = stored.next();
          if (!cache.containsKey(entry._1())) {
            byExpiry.computeIfAbsent(entry._2().getLong(kinds.length) + ttlMs, at -> new LinkedHashSet<>())
                .add(entry._1());
          }
        }
        for (Map.Entry<String, Entry> cached : cache.entrySet()) {
          if (cached.getValue() != null) {
            byExpiry.computeIfAbsent(cached.getValue().eventTime + ttlMs, at -> new LinkedHashSet<>())
                .add(cached.getKey());
          }
        }
      }

      private void unindex(String key) {
        Entry previous = byExpiry == null ? null : get(key);
        if (previous != null) {
          Set<String> due = byExpiry.get(previous.eventTime + ttlMs);
          if (due != null) {
            due.remove(key);
            if (due.isEmpty()) {
              byExpiry.remove(previous.eventTime + ttlMs);
            }
          }
        }
      }

      @Override
      List<Row> finish() {
        for (Map.Entry<String, Entry> entry : cache.entrySet()) {
          Entry value = entry.getValue();
          if (value == null) {
            keys.removeKey(entry.getKey());
            continue;
          }
          if (changes.containsKey(entry.getKey())) {
            keys.updateValue(entry.getKey(),
                RowFactory.create(KeyedAggregate.Kind.stored(value.aggregates, value.eventTime)));
          }
        }
        if (byExpiry != null) {
          expiry = byExpiry.isEmpty() ? Long.MAX_VALUE : byExpiry.firstKey();
        }
        if (expiry == Long.MAX_VALUE) {
          nextExpiry.clear();
        } else {
          nextExpiry.update(expiry);
        }
        out.addAll(changes.values());
        if (saveStreamTime()) {
          out.add(output(CHANGE, false, null, null, null, partition, now, null, null, null));
        }
        return out;
      }
    }

    /** An output row (see the class comment): {@code value} is the aggregates and the key's event time. */
    private Row output(String kind, boolean tombstone, String key, Object[] value, Long lateEventTime,
                       Integer partition, Long streamTimeMs, Object offset, Object timestamp, Object raw) {
      Object[] row = outputFields(kinds.length + 9);
      row[0] = kind;
      row[1] = key;
      row[2] = tombstone;
      if (value != null) {
        System.arraycopy(value, 0, row, 3, value.length);
      }
      int rest = 3 + kinds.length;
      row[rest] = value != null ? value[kinds.length] : lateEventTime;
      Object[] tail = {partition, streamTimeMs, offset, timestamp, raw};
      System.arraycopy(tail, 0, row, rest + 1, tail.length);
      return RowFactory.create(row);
    }
  }
}
