package streamstate.primitives;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.collection.Iterator;

import streamstate.jobs.DeadLetters;

/**
 * The event-time windows primitive: per key, aggregates ({@link KeyedAggregate.Kind}: count, sum, min, max,
 * latest) of the events in each of their windows, tumbling or hopping, with Kafka Streams' semantics record
 * by record: grace, retention and suppress-until-close, and an event that asks for it
 * ({@link Rows#DELETE_COLUMN}) deleting its key's windows. A job declares it in Python
 * (spark_jobs/primitives/windows.py: the declaration's conditions and inputs are evaluated by Spark before
 * it; patient_heart_rate and temperature_averages are two).
 *
 * <p>The processor is keyed by <b>source partition</b> (its {@link PartitionTask#taskKey task key}), the unit
 * Kafka Streams calls a task: it sees the
 * partition's records of a micro-batch in offset order, and <b>stream time</b> is the partition's largest
 * event time so far, advanced by each record before it is applied. So whether an event is late, and
 * whether a window closed before a check-out, never depends on where micro-batches begin and end:
 *
 * <ul>
 *   <li>an event at time t belongs to every window [start, start + size) with start a multiple of the
 *       advance and start &lt;= t &lt; start + size (Kafka Streams' {@code TimeWindows.windowsFor}): one
 *       window when advance = size (tumbling), size / advance windows when they hop;
 *   <li>a window <b>closes</b> when stream time reaches its end + grace: emitted once (a change row with
 *       {@code closed = true}), kept in the store until retention;
 *   <li>an event is applied to its open windows; when some of its windows had already closed it is also
 *       <b>late</b> (an output row the job dead-letters, naming the latest closed window and how many open
 *       windows it was counted in);
 *   <li>a closed window is <b>evicted</b> when stream time reaches its start + retention (a tombstone);
 *       one that closes and is evicted in one step is a tombstone that carries its final values;
 *   <li>a deleting event removes every window of its key (tombstones: {@code closed = false} for an open
 *       window, which was never emitted; windows closed earlier in the batch carry their final values).
 * </ul>
 *
 * <p>Input columns: the key, the event time, {@link Rows#DELETE_COLUMN}, the source's {@code offset},
 * {@code timestamp} and {@code value}, and one {@link KeyedAggregate#INPUT_PREFIX}{@code i} column per
 * aggregate, already of its stored type (for count: 1 when the event counts, else 0).
 *
 * <p>Each batch emits one row per changed window (its latest value) plus one row per partition whose
 * stream time moved (the key null, {@code stream_time_ms} set), so a restore continues stream
 * time exactly. State per partition: the stream time, each key's open windows and closed window
 * starts, and the earliest close and eviction times, so closing and eviction look at the partition's
 * keys only when one is due (once per window advance of stream time), not per record. A batch holds
 * the keys it touched in memory and writes them back once, at its end; its first close reads every
 * key's open windows, so the batch's later closes do not read the store again.
 */
public final class WindowedAggregate {
  private WindowedAggregate() {}

  static final String CHANGE = "change";
  static final String LATE = "late";

  /** The restored-state row schema {@link #changes} expects: one row per key (its open windows, each its
   * start and values, and its closed windows' starts; {@code key} null on the row of a partition's stream
   * time), for the values {@code valuesDdl}. */
  public static String initialDdl(String valuesDdl) {
    return "source_partition INT, key STRING, open_windows ARRAY<STRUCT<window_start_ms BIGINT, " + valuesDdl
        + ">>, closed_starts ARRAY<BIGINT>, stream_time_ms BIGINT";
  }

  /**
   * The store's output rows ({@code outputDdl}: changes, stream times and late events) for {@code events}
   * (see the class comment) grouped by {@code partitionColumn}; {@code initial} ({@link #initialDdl}, or
   * null) seeds the store. {@code valuesDdl} names the stored values and their types, {@code kinds} their
   * aggregates (comma-separated, in order). Rejected records among {@code events} pass through (see
   * {@link DeadLetters}).
   */
  public static Dataset<Row> changes(Dataset<Row> events, String partitionColumn, Dataset<Row> initial,
                                     String store, String outputDdl, String valuesDdl, String kinds, long windowMs,
                                     long advanceMs, long graceMs, long retentionMs, String keyColumn,
                                     String timeColumn) {
    StructType output = StructType.fromDDL(outputDdl);
    StructType values = StructType.fromDDL(valuesDdl);
    Windows windows = new Windows(store, values, KeyedAggregate.Kind.parse(kinds, values.size()), windowMs, advanceMs,
        graceMs, retentionMs, output.size(), keyColumn, timeColumn);
    return PartitionTask.changes(events, partitionColumn, initial, windows, OutputMode.Append(), output);
  }

  static final class Windows extends AggregateTask {
    private static final StructType CLOSED = StructType.fromDDL("starts ARRAY<BIGINT>");

    /** A key's open windows: their starts, then one array per value (for a count named {@code beats}, the
     * schema every patient_heart_rate checkpoint since v2 holds). */
    private final StructType openSchema;
    private final long windowMs;
    private final long advanceMs;
    private final long graceMs;
    private final long retentionMs;
    private transient ValueState<Long> nextCloseAt;
    private transient ValueState<Long> nextEvictAt;
    /** key -> open windows (starts, then each value's array) */
    private transient MapState<String, Row> open;
    /** key -> starts of closed windows still in the store */
    private transient MapState<String, Row> closed;

    Windows(String store, StructType values, KeyedAggregate.Kind[] kinds, long windowMs, long advanceMs, long graceMs,
            long retentionMs, int outputWidth, String keyColumn, String timeColumn) {
      super(store, values, kinds, outputWidth, keyColumn, timeColumn);
      this.windowMs = windowMs;
      this.advanceMs = advanceMs;
      this.graceMs = graceMs;
      this.retentionMs = retentionMs;
      this.openSchema = openSchema(values);
    }

    /** {@link #openSchema} for the values {@code values}. */
    private static StructType openSchema(StructType values) {
      StructType open = new StructType().add("starts", DataTypes.createArrayType(DataTypes.LongType));
      for (StructField field : values.fields()) {
        open = open.add(field.name(), DataTypes.createArrayType(field.dataType()));
      }
      return open;
    }

    @Override
    protected void initStores() {
      nextCloseAt = getHandle().getValueState(store + "-next-close", Encoders.LONG(), TTLConfig.NONE());
      nextEvictAt = getHandle().getValueState(store + "-next-evict", Encoders.LONG(), TTLConfig.NONE());
      open = getHandle().getMapState(store + "-open", Encoders.STRING(), Encoders.row(openSchema), TTLConfig.NONE());
      closed = getHandle().getMapState(store + "-closed", Encoders.STRING(), Encoders.row(CLOSED), TTLConfig.NONE());
    }

    // -- the window rules ----------------------------------------------------------------------
    /** The first window an event at {@code t} belongs to (Kafka Streams' {@code TimeWindows.windowsFor}). */
    long firstStart(long t) {
      return Math.max(0, t - windowMs + advanceMs) / advanceMs * advanceMs;
    }

    long closesAt(long start) {
      return start + windowMs + graceMs;
    }

    long evictedAt(long start) {
      return start + retentionMs;
    }

    // -- Spark's callbacks ---------------------------------------------------------------------
    @Override
    protected Batch newBatch(int partition) {
      return new Batch(partition);
    }

    @Override
    protected void restoreKey(String key, Row initial) {
      TreeMap<Long, Object[]> windows = new TreeMap<>();
      for (Row window : initial.<Row>getList(initial.fieldIndex("open_windows"))) {
        Object[] aggregates = new Object[kinds.length];
        for (int i = 0; i < kinds.length; i++) {
          aggregates[i] = window.get(i + 1);
        }
        windows.put(window.getLong(0), aggregates);
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
    private final class Batch extends EventBatch {
      final Map<String, TreeMap<Long, Object[]>> openCache = new HashMap<>();
      final Map<String, TreeSet<Long>> closedCache = new HashMap<>();
      /** each changed window's latest change, in the order first changed (rows built at {@link #finish}) */
      final Map<WindowKey, Change> changes = new LinkedHashMap<>();
      /** the partition's earliest close and eviction times ({@link Long#MAX_VALUE}: none), held here for the
       * batch: every window update may lower them, and a state read per update was most of a batch's time */
      private long closeAt;
      private long evictAt;
      /** whether every key's open (closed) windows are in the cache */
      private boolean openLoaded;
      private boolean closedLoaded;

      Batch(int partition) {
        super(partition);
        closeAt = nextCloseAt.exists() ? nextCloseAt.get() : Long.MAX_VALUE;
        evictAt = nextEvictAt.exists() ? nextEvictAt.get() : Long.MAX_VALUE;
      }

      @Override
      protected void onAdvance() {
        if (closeAt <= now) {
          closeDue();
        }
        if (evictAt <= now) {
          evictDue();
        }
      }

      /** The event applied to each of its windows still open; late when some of them closed already. */
      @Override
      void apply(String key, long t, Row event, int[] inputs) {
        Long latestClosed = null;
        int counted = 0;
        for (long start = firstStart(t); start <= t; start += advanceMs) {
          if (closesAt(start) <= now) {
            latestClosed = start;
          } else {
            applyTo(key, start, event, inputs);
            counted++;
          }
        }
        if (latestClosed != null) {
          out.add(output(LATE, false, key, latestClosed, null, null, partition, now, event.getAs("offset"),
              event.getAs("timestamp"), event.getAs("value"), counted));
        }
      }

      private void applyTo(String key, long start, Row event, int[] inputs) {
        Object[] aggregates = openOf(key).computeIfAbsent(start, s -> KeyedAggregate.Kind.fresh(kinds, values));
        KeyedAggregate.Kind.applyAll(kinds, aggregates, event, inputs);
        closeAt = Math.min(closeAt, closesAt(start));
        change(key, start, aggregates, false);
      }

      @Override
      void delete(String key) {
        for (long start : openOf(key).keySet()) {
          tombstone(key, start, true);
        }
        for (long start : closedOf(key)) {
          tombstone(key, start, false);
        }
        openOf(key).clear();
        closedOf(key).clear();
      }

      /** Close every open window of the partition due at the current stream time. The first close of a batch
       * reads every key's open windows into the cache; the batch's later closes (one per advance of the
       * window's start: about once per minute of event time for temperatures) then scan the cache only. */
      private void closeDue() {
        if (!openLoaded) {  // every key is in the cache from here on: the batch writes them back at its end
          Iterator<Tuple2<String, Row>> entries = open.iterator();
          while (entries.hasNext()) {
            Tuple2<String, Row> entry = entries.next();
            openCache.computeIfAbsent(entry._1(), k -> openWindows(entry._2()));
          }
          openLoaded = true;
        }
        long next = Long.MAX_VALUE;
        for (Map.Entry<String, TreeMap<Long, Object[]>> entry : openCache.entrySet()) {
          String key = entry.getKey();
          TreeMap<Long, Object[]> windows = entry.getValue();
          while (!windows.isEmpty() && closesAt(windows.firstKey()) <= now) {
            Map.Entry<Long, Object[]> window = windows.pollFirstEntry();
            closedOf(key).add(window.getKey());
            evictAt = Math.min(evictAt, evictedAt(window.getKey()));
            change(key, window.getKey(), window.getValue(), true);
          }
          if (!windows.isEmpty()) {
            next = Math.min(next, closesAt(windows.firstKey()));
          }
        }
        closeAt = next;
      }

      /** Drop every closed window of the partition whose retention has passed (read like {@link #closeDue}). */
      private void evictDue() {
        if (!closedLoaded) {
          Iterator<Tuple2<String, Row>> entries = closed.iterator();
          while (entries.hasNext()) {
            Tuple2<String, Row> entry = entries.next();
            closedCache.computeIfAbsent(entry._1(), k -> new TreeSet<>(entry._2().<Long>getList(0)));
          }
          closedLoaded = true;
        }
        long next = Long.MAX_VALUE;
        for (Map.Entry<String, TreeSet<Long>> entry : closedCache.entrySet()) {
          String key = entry.getKey();
          TreeSet<Long> starts = entry.getValue();
          while (!starts.isEmpty() && evictedAt(starts.first()) <= now) {
            tombstone(key, starts.pollFirst(), false);
          }
          if (!starts.isEmpty()) {
            next = Math.min(next, evictedAt(starts.first()));
          }
        }
        evictAt = next;
      }

      private TreeMap<Long, Object[]> openOf(String key) {
        return openCache.computeIfAbsent(key, k -> openWindows(open.getValue(k)));
      }

      private TreeSet<Long> closedOf(String key) {
        return closedCache.computeIfAbsent(key, k -> {
          Row row = closed.getValue(k);  // null: absent
          return row == null ? new TreeSet<>() : new TreeSet<>(row.<Long>getList(0));
        });
      }

      /** The window's latest value: {@code aggregates} is the window's own array, which later events of the
       * batch update in place (each update calls this again). */
      private void change(String key, long start, Object[] aggregates, boolean isClosed) {
        changes.put(new WindowKey(key, start), new Change(false, aggregates, isClosed));
      }

      /** A window leaves the store. One closed in this batch keeps its final values for the outputs; an open
       * one ({@code wasOpen}, deleted) says {@code closed = false}: outputs that show open windows drop it. */
      private void tombstone(String key, long start, boolean wasOpen) {
        WindowKey window = new WindowKey(key, start);
        Change previous = changes.get(window);
        boolean closedNow = !wasOpen && previous != null && Boolean.TRUE.equals(previous.closed);
        changes.put(window, new Change(true, closedNow ? previous.aggregates : null,
            wasOpen ? Boolean.FALSE : closedNow ? Boolean.TRUE : null));
      }

      /** Write the cached windows back to the state store. */
      private void writeBack() {
        for (Map.Entry<String, TreeMap<Long, Object[]>> entry : openCache.entrySet()) {
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

      @Override
      List<Row> finish() {
        writeBack();
        setOrClear(nextCloseAt, closeAt);
        setOrClear(nextEvictAt, evictAt);
        for (Map.Entry<WindowKey, Change> entry : changes.entrySet()) {
          WindowKey window = entry.getKey();
          Change change = entry.getValue();
          out.add(output(CHANGE, change.tombstone, window.key, window.start, change.aggregates, change.closed,
              partition, null, null, null, null, null));
        }
        if (saveStreamTime()) {
          out.add(output(CHANGE, false, null, null, null, null, partition, now, null, null, null, null));
        }
        return out;
      }
    }

    /** A window of a key: what a change row is about. */
    private record WindowKey(String key, long start) {}

    /** A window's latest change in a batch: a tombstone or its values, and whether it is closed (null on a
     * tombstone of a window closed before the batch). */
    private record Change(boolean tombstone, Object[] aggregates, Boolean closed) {}

    /** A key's open windows as its stored row ({@link #openSchema}, or null: none) holds them. */
    private TreeMap<Long, Object[]> openWindows(Row row) {
      TreeMap<Long, Object[]> windows = new TreeMap<>();
      if (row != null) {
        List<Long> starts = row.getList(0);
        List<List<Object>> columns = Rows.columnsOf(row, 1, kinds.length);
        for (int w = 0; w < starts.size(); w++) {
          windows.put(starts.get(w), Rows.valuesAt(columns, w));
        }
      }
      return windows;
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

    private Row openRow(TreeMap<Long, Object[]> windows) {
      Object[] columns = new Object[kinds.length + 1];
      columns[0] = Rows.seq(new ArrayList<Object>(windows.keySet()));
      List<List<Object>> values = Rows.columns(windows.values(), kinds.length);
      for (int i = 0; i < kinds.length; i++) {
        columns[i + 1] = Rows.seq(values.get(i));
      }
      return RowFactory.create(columns);
    }

    private static Row closedRow(TreeSet<Long> starts) {
      return RowFactory.create(Rows.seq(new ArrayList<Object>(starts)));
    }

    /** Where {@code closed} sits in an output row: kind, tombstone, key, window_start_ms, the values. */
    private int closedIndex() {
      return 4 + kinds.length;
    }

    private Row output(String kind, boolean tombstone, String key, Long start, Object[] aggregates, Boolean isClosed,
                       Integer partition, Long streamTimeMs, Object offset, Object timestamp, Object raw,
                       Integer openWindows) {
      Object[] row = outputFields(closedIndex() + 7);
      row[0] = kind;
      row[1] = tombstone;
      row[2] = key;
      row[3] = start;
      if (aggregates != null) {
        System.arraycopy(aggregates, 0, row, 4, kinds.length);
      }
      Object[] rest = {isClosed, partition, streamTimeMs, offset, timestamp, raw, openWindows};
      System.arraycopy(rest, 0, row, closedIndex(), rest.length);
      return RowFactory.create(row);
    }
  }
}
