package streamstate.primitives;

import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessorWithInitialState;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

import streamstate.jobs.DeadLetters;

/**
 * The event-time windows primitive: per key, events counted in tumbling windows with Kafka Streams'
 * semantics, record by record: grace, retention and suppress-until-close, and an event that asks for it
 * ({@link Rows#DELETE_COLUMN}) deleting its key's windows. A job declares it in Python
 * (spark_jobs/primitives/windows.py: the declaration's conditions are evaluated by Spark before it;
 * patient_heart_rate is one).
 *
 * <p>The processor is keyed by <b>source partition</b>, the unit Kafka Streams calls a task: it sees the
 * partition's records of a micro-batch in offset order, and <b>stream time</b> is the partition's largest
 * event time so far, advanced by each record before it is applied. So whether an event is late, and
 * whether a window closed before a check-out, never depends on where micro-batches begin and end:
 *
 * <ul>
 *   <li>a window <b>closes</b> when stream time reaches its end + grace: emitted once (a change row with
 *       {@code closed = true}), kept in the store until retention;
 *   <li>an event whose window closes at or before the stream time is <b>late</b> (an output row the job
 *       dead-letters);
 *   <li>a closed window is <b>evicted</b> when stream time reaches its start + retention (a tombstone);
 *       one that closes and is evicted in one step is a tombstone that carries its final count;
 *   <li>a deleting event removes every window of its key (tombstones; open ones are not emitted,
 *       windows closed earlier in the batch are).
 * </ul>
 *
 * <p>Each batch emits one row per changed window (its latest value) plus one row per partition whose
 * stream time moved (the key null, {@code stream_time_ms} set), so a restore continues stream
 * time exactly. State per partition: the stream time, each key's open windows and closed window
 * starts, and the earliest close and eviction times, so closing and eviction scan the partition's
 * keys only when one is due (once per window of stream time), not per record.
 */
public final class WindowedCount {
  private WindowedCount() {}

  static final String CHANGE = "change";
  static final String LATE = "late";
  /** The restored-state row schema {@link #changes} expects: one row per key (its open windows' starts and
   * counts, its closed windows' starts; {@code key} null on the row of a partition's stream time). */
  public static final String INITIAL_DDL = "source_partition INT, key STRING, open_starts ARRAY<BIGINT>, "
      + "open_counts ARRAY<BIGINT>, closed_starts ARRAY<BIGINT>, stream_time_ms BIGINT";

  /**
   * The store's output rows ({@code outputDdl}: changes, stream times and late events) for {@code events}
   * (with {@code keyColumn}, {@code timeColumn}, {@link Rows#DELETE_COLUMN} and the source's {@code offset},
   * {@code timestamp} and {@code value}) grouped by {@code partitionColumn}; {@code initial}
   * ({@link #INITIAL_DDL}, or null) seeds the store. Rejected records among {@code events} pass through
   * (see {@link DeadLetters}).
   */
  public static Dataset<Row> changes(Dataset<Row> events, String partitionColumn, Dataset<Row> initial,
                                     String store, String outputDdl, long windowMs, long graceMs, long retentionMs,
                                     String keyColumn, String timeColumn) {
    StructType output = StructType.fromDDL(outputDdl);
    KeyValueGroupedDataset<Integer, Row> grouped =
        events.groupByKey((MapFunction<Row, Integer>) row -> row.getAs(partitionColumn), Encoders.INT());
    Windows windows = new Windows(store, windowMs, graceMs, retentionMs, output.size(), keyColumn, timeColumn);
    KeyValueGroupedDataset<Integer, Row> seeded = initial == null ? null
        : initial.groupByKey((MapFunction<Row, Integer>) row -> row.getAs("source_partition"), Encoders.INT());
    return DeadLetters.transform(grouped, events.schema(), windows, TimeMode.None(), OutputMode.Append(), output,
        seeded, initial == null ? null : initial.schema());
  }

  static final class Windows extends StatefulProcessorWithInitialState<Integer, Row, Row, Row> {
    // The state's own schemas: their field names are in every checkpoint written since patient_heart_rate v2.
    private static final StructType OPEN = StructType.fromDDL("starts ARRAY<BIGINT>, beats ARRAY<BIGINT>");
    private static final StructType CLOSED = StructType.fromDDL("starts ARRAY<BIGINT>");

    private final String store;
    private final long windowMs;
    private final long graceMs;
    private final long retentionMs;
    private final int outputWidth;
    private final String keyColumn;
    private final String timeColumn;
    private transient ValueState<Long> streamTime;
    private transient ValueState<Long> nextCloseAt;
    private transient ValueState<Long> nextEvictAt;
    /** key -> open windows (start -> count) */
    private transient MapState<String, Row> open;
    /** key -> starts of closed windows still in the store */
    private transient MapState<String, Row> closed;

    Windows(String store, long windowMs, long graceMs, long retentionMs, int outputWidth, String keyColumn,
            String timeColumn) {
      this.store = store;
      this.windowMs = windowMs;
      this.graceMs = graceMs;
      this.retentionMs = retentionMs;
      this.outputWidth = outputWidth;
      this.keyColumn = keyColumn;
      this.timeColumn = timeColumn;
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      streamTime = getHandle().getValueState(store + "-stream-time", Encoders.LONG(), TTLConfig.NONE());
      nextCloseAt = getHandle().getValueState(store + "-next-close", Encoders.LONG(), TTLConfig.NONE());
      nextEvictAt = getHandle().getValueState(store + "-next-evict", Encoders.LONG(), TTLConfig.NONE());
      open = getHandle().getMapState(store + "-open", Encoders.STRING(), Encoders.row(OPEN), TTLConfig.NONE());
      closed = getHandle().getMapState(store + "-closed", Encoders.STRING(), Encoders.row(CLOSED), TTLConfig.NONE());
    }

    // -- the window rules ----------------------------------------------------------------------
    long closesAt(long start) {
      return start + windowMs + graceMs;
    }

    long evictedAt(long start) {
      return start + retentionMs;
    }

    // -- Spark's callbacks ---------------------------------------------------------------------
    @Override
    public Iterator<Row> handleInputRows(Integer partition, Iterator<Row> rows, TimerValues timerValues) {
      List<Row> events = new ArrayList<>();
      while (rows.hasNext()) {
        events.add(rows.next());
      }
      events.sort(Comparator.comparingLong(row -> row.<Long>getAs("offset")));
      Batch batch = new Batch(partition);
      for (Row event : events) {
        long t = event.<Timestamp>getAs(timeColumn).getTime();
        batch.advance(t);
        String key = event.getAs(keyColumn);
        if (Boolean.TRUE.equals(event.getAs(Rows.DELETE_COLUMN))) {
          batch.checkOut(key);
          continue;
        }
        long start = t - Math.floorMod(t, windowMs);
        if (closesAt(start) <= batch.now) {
          batch.out.add(output(LATE, false, key, start, null, null, partition, batch.now,
              event.getAs("offset"), event.getAs("timestamp"), event.getAs("value")));
          continue;
        }
        batch.count(key, start);
      }
      return CollectionConverters.asScala(batch.finish().iterator());
    }

    @Override
    public Iterator<Row> handleExpiredTimer(Integer partition, TimerValues timerValues, ExpiredTimerInfo info) {
      throw new IllegalStateException("WindowedCount registers no timers");
    }

    @Override
    public void handleInitialState(Integer partition, Row initial, TimerValues timerValues) {
      if (initial.isNullAt(initial.fieldIndex("key"))) {
        long restored = initial.<Long>getAs("stream_time_ms");
        streamTime.update(streamTime.exists() ? Math.max(streamTime.get(), restored) : restored);
        return;
      }
      String key = initial.getAs("key");
      List<Long> openStarts = initial.getList(initial.fieldIndex("open_starts"));
      List<Long> openCounts = initial.getList(initial.fieldIndex("open_counts"));
      TreeMap<Long, Long> windows = new TreeMap<>();
      for (int i = 0; i < openStarts.size(); i++) {
        windows.put(openStarts.get(i), openCounts.get(i));
      }
      TreeSet<Long> closedStarts = new TreeSet<>(initial.<Long>getList(initial.fieldIndex("closed_starts")));
      if (!windows.isEmpty()) {
        open.updateValue(key, openRow(windows));
        lower(nextCloseAt, closesAt(windows.firstKey()));
      }
      if (!closedStarts.isEmpty()) {
        closed.updateValue(key, closedRow(closedStarts));
        lower(nextEvictAt, evictedAt(closedStarts.first()));
      }
    }

    /** One micro-batch of one partition: keys' windows cached, written back once at the end. */
    private final class Batch {
      final int partition;
      final long streamTimeBefore;
      /** the partition's stream time as this batch advances it */
      long now;
      final Map<String, TreeMap<Long, Long>> openCache = new HashMap<>();
      final Map<String, TreeSet<Long>> closedCache = new HashMap<>();
      /** latest change row per changelog key (key@start), in the order first changed */
      final Map<String, Row> changes = new LinkedHashMap<>();
      final List<Row> out = new ArrayList<>();

      Batch(int partition) {
        this.partition = partition;
        this.streamTimeBefore = streamTime.exists() ? streamTime.get() : Long.MIN_VALUE;
        this.now = streamTimeBefore;
      }

      void advance(long eventTime) {
        if (eventTime <= now) {
          return;
        }
        now = eventTime;
        if (nextCloseAt.exists() && nextCloseAt.get() <= now) {
          closeDue();
        }
        if (nextEvictAt.exists() && nextEvictAt.get() <= now) {
          evictDue();
        }
      }

      void count(String key, long start) {
        TreeMap<Long, Long> windows = openOf(key);
        long count = windows.merge(start, 1L, Long::sum);
        lower(nextCloseAt, closesAt(start));
        change(key, start, count, false);
      }

      void checkOut(String key) {
        for (long start : openOf(key).keySet()) {
          tombstone(key, start);
        }
        for (long start : closedOf(key)) {
          tombstone(key, start);
        }
        openOf(key).clear();
        closedOf(key).clear();
      }

      /** Close every open window of the partition due at the current stream time. */
      private void closeDue() {
        writeBack();
        long next = Long.MAX_VALUE;
        for (String key : keys(open)) {
          TreeMap<Long, Long> windows = openOf(key);
          while (!windows.isEmpty() && closesAt(windows.firstKey()) <= now) {
            Map.Entry<Long, Long> window = windows.pollFirstEntry();
            closedOf(key).add(window.getKey());
            lower(nextEvictAt, evictedAt(window.getKey()));
            change(key, window.getKey(), window.getValue(), true);
          }
          if (!windows.isEmpty()) {
            next = Math.min(next, closesAt(windows.firstKey()));
          }
        }
        setOrClear(nextCloseAt, next);
      }

      /** Drop every closed window of the partition whose retention has passed. */
      private void evictDue() {
        writeBack();
        long next = Long.MAX_VALUE;
        for (String key : keys(closed)) {
          TreeSet<Long> starts = closedOf(key);
          while (!starts.isEmpty() && evictedAt(starts.first()) <= now) {
            tombstone(key, starts.pollFirst());
          }
          if (!starts.isEmpty()) {
            next = Math.min(next, evictedAt(starts.first()));
          }
        }
        setOrClear(nextEvictAt, next);
      }

      private TreeMap<Long, Long> openOf(String key) {
        return openCache.computeIfAbsent(key, p -> {
          TreeMap<Long, Long> windows = new TreeMap<>();
          Row row = open.containsKey(p) ? open.getValue(p) : null;
          if (row != null) {
            List<Long> starts = row.getList(0);
            List<Long> count = row.getList(1);
            for (int i = 0; i < starts.size(); i++) {
              windows.put(starts.get(i), count.get(i));
            }
          }
          return windows;
        });
      }

      private TreeSet<Long> closedOf(String key) {
        return closedCache.computeIfAbsent(key, p -> {
          Row row = closed.containsKey(p) ? closed.getValue(p) : null;
          return row == null ? new TreeSet<>() : new TreeSet<>(row.<Long>getList(0));
        });
      }

      private void change(String key, long start, long count, boolean isClosed) {
        changes.put(key + "@" + start, output(CHANGE, false, key, start, count, isClosed, partition, null,
            null, null, null));
      }

      /** A window leaves the store; one closed in this batch keeps its final count for the outputs. */
      private void tombstone(String key, long start) {
        Row previous = changes.get(key + "@" + start);
        boolean closedNow = previous != null && Boolean.TRUE.equals(previous.getAs(5));
        changes.put(key + "@" + start, output(CHANGE, true, key, start,
            closedNow ? previous.<Long>getAs(4) : null, closedNow ? Boolean.TRUE : null, partition, null,
            null, null, null));
      }

      /** Write the cached windows back to the state store. */
      private void writeBack() {
        for (Map.Entry<String, TreeMap<Long, Long>> entry : openCache.entrySet()) {
          if (entry.getValue().isEmpty()) {
            open.removeKey(entry.getKey());
          } else {
            open.updateValue(entry.getKey(), openRow(entry.getValue()));
          }
        }
        for (Map.Entry<String, TreeSet<Long>> entry : closedCache.entrySet()) {
          if (entry.getValue().isEmpty()) {
            closed.removeKey(entry.getKey());
          } else {
            closed.updateValue(entry.getKey(), closedRow(entry.getValue()));
          }
        }
        openCache.clear();
        closedCache.clear();
      }

      List<Row> finish() {
        writeBack();
        out.addAll(changes.values());
        if (now != streamTimeBefore) {
          streamTime.update(now);
          out.add(output(CHANGE, false, null, null, null, null, partition, now, null, null, null));
        }
        return out;
      }
    }

    /** The keys of a per-key map state, read before the map is changed. */
    private static List<String> keys(MapState<String, Row> state) {
      List<String> keys = new ArrayList<>();
      Iterator<Tuple2<String, Row>> entries = state.iterator();
      while (entries.hasNext()) {
        keys.add(entries.next()._1());
      }
      return keys;
    }

    private static void lower(ValueState<Long> time, long candidate) {
      if (!time.exists() || candidate < time.get()) {
        time.update(candidate);
      }
    }

    private static void setOrClear(ValueState<Long> time, long value) {
      if (value == Long.MAX_VALUE) {
        time.clear();
      } else {
        time.update(value);
      }
    }

    private static Row openRow(TreeMap<Long, Long> windows) {
      return RowFactory.create(seq(new ArrayList<>(windows.keySet())), seq(new ArrayList<>(windows.values())));
    }

    private static Row closedRow(TreeSet<Long> starts) {
      return RowFactory.create(seq(new ArrayList<>(starts)));
    }

    private static scala.collection.immutable.Seq<Long> seq(List<Long> values) {
      return CollectionConverters.asScala(values).toList();
    }

    private Row output(String kind, boolean tombstone, String key, Long start, Long count, Boolean isClosed,
                       Integer partition, Long streamTimeMs, Object offset, Object timestamp, Object raw) {
      Object[] values = {kind, tombstone, key, start, count, isClosed, partition, streamTimeMs, offset, timestamp,
          raw};
      if (values.length != outputWidth) {
        throw new IllegalStateException("output DDL has " + outputWidth + " columns, the processor writes " + values.length);
      }
      return RowFactory.create(values);
    }
  }
}
