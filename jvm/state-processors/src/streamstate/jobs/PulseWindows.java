package streamstate.jobs;

import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

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
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * patient_heart_rate's windowed store in the JVM: the same rules and output rows as the Python
 * {@code PulseWindows} in spark_jobs/jobs/patient_heart_rate.py (Kafka Streams' 60 s tumbling windows
 * with grace, retention and suppress-until-close), without a Python-to-JVM round trip per state call.
 *
 * <p>Per patient, a map state (window start ms -> beats, closed) with event-time timers: a window
 * closes at end + grace (emitted once), is evicted at start + retention (tombstone); a pulse for a
 * closed window is late (an output row the job dead-letters); {@code checked_out} deletes every window.
 */
public final class PulseWindows {
  private PulseWindows() {}

  static final String CHANGE = "change";
  static final String LATE = "late";
  static final String CHECKED_OUT = "checked_out";

  /** The store's output rows (changes and late pulses, {@code outputDdl}) for watermarked events. */
  public static Dataset<Row> changes(Dataset<Row> events, String keyColumn, Dataset<Row> initial, String store,
                                     String outputDdl, long windowMs, long graceMs, long retentionMs,
                                     long restoredWatermarkMs) {
    StructType output = StructType.fromDDL(outputDdl);
    KeyValueGroupedDataset<String, Row> grouped =
        events.groupByKey((MapFunction<Row, String>) row -> row.getAs(keyColumn), Encoders.STRING());
    Windows windows = new Windows(store, windowMs, graceMs, retentionMs, restoredWatermarkMs, output.size());
    if (initial == null) {
      return grouped.transformWithState(windows, TimeMode.EventTime(), OutputMode.Append(), Encoders.row(output));
    }
    KeyValueGroupedDataset<String, Row> seeded =
        initial.groupByKey((MapFunction<Row, String>) row -> row.getAs(keyColumn), Encoders.STRING());
    return grouped.transformWithState(windows, TimeMode.EventTime(), OutputMode.Append(), seeded,
        Encoders.row(output), Encoders.row(initial.schema()));
  }

  /** One window's value: beat count and whether it has closed. */
  record Window(long beats, boolean closed) {}

  static final class Windows extends StatefulProcessorWithInitialState<String, Row, Row, Row> {
    private static final StructType VALUE = StructType.fromDDL("beats BIGINT, closed BOOLEAN");

    private final String store;
    private final long windowMs;
    private final long graceMs;
    private final long retentionMs;
    private final long restoredWatermarkMs;
    private final int outputWidth;
    private transient MapState<Long, Row> windows;

    Windows(String store, long windowMs, long graceMs, long retentionMs, long restoredWatermarkMs, int outputWidth) {
      this.store = store;
      this.windowMs = windowMs;
      this.graceMs = graceMs;
      this.retentionMs = retentionMs;
      this.restoredWatermarkMs = restoredWatermarkMs;
      this.outputWidth = outputWidth;
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      windows = getHandle().getMapState(store, Encoders.LONG(), Encoders.row(VALUE), TTLConfig.NONE());
    }

    // -- the window rules ----------------------------------------------------------------------
    long closesAt(long start) {
      return start + windowMs + graceMs;
    }

    long evictedAt(long start) {
      return start + retentionMs;
    }

    long deadline(long start, boolean closed) {
      return closed ? evictedAt(start) : closesAt(start);
    }

    long streamTime(TimerValues timerValues) {
      // A query started by a restore begins with watermark 0; stream time must not go back.
      return Math.max(timerValues.getCurrentWatermarkInMs(), restoredWatermarkMs);
    }

    void arm(long start, boolean closed) {
      // Fire at the deadline whether Spark expires timers at "<= watermark" or "< watermark": the
      // handler re-checks the rule and re-arms when it fired a millisecond early.
      getHandle().registerTimer(deadline(start, closed) - 1);
    }

    // -- Spark's callbacks ---------------------------------------------------------------------
    @Override
    public Iterator<Row> handleInputRows(String patient, Iterator<Row> rows, TimerValues timerValues) {
      long watermark = streamTime(timerValues);
      Map<Long, Window> before = read();
      Map<Long, Window> current = new LinkedHashMap<>(before);
      List<Row> events = new ArrayList<>();
      while (rows.hasNext()) {
        events.add(rows.next());
      }
      events.sort(Comparator.comparingLong(row -> row.<Long>getAs("offset")));  // one patient: one partition
      List<Row> out = new ArrayList<>();
      for (Row event : events) {
        if (CHECKED_OUT.equals(event.getAs("type"))) {
          current.clear();
          continue;
        }
        long t = event.<Timestamp>getAs("event_time").getTime();
        long start = t - Math.floorMod(t, windowMs);
        Window window = current.get(start);
        if ((watermark > 0 && closesAt(start) <= watermark) || (window != null && window.closed())) {
          out.add(output(LATE, false, patient, start, null, null, event.getAs("partition"), event.getAs("offset"),
              event.getAs("timestamp"), event.getAs("value")));
          continue;
        }
        current.put(start, new Window(window == null ? 1 : window.beats() + 1, false));
      }
      write(patient, before, current, null, Set.of(), out);
      return CollectionConverters.asScala(out.iterator());
    }

    @Override
    public Iterator<Row> handleExpiredTimer(String patient, TimerValues timerValues, ExpiredTimerInfo info) {
      long watermark = streamTime(timerValues);
      Map<Long, Window> before = read();
      Map<Long, Window> current = new LinkedHashMap<>(before);
      Set<Long> closedOnEviction = new HashSet<>();
      for (Map.Entry<Long, Window> entry : before.entrySet()) {
        long start = entry.getKey();
        Window window = entry.getValue();
        if (evictedAt(start) <= watermark) {
          if (!window.closed()) {
            closedOnEviction.add(start);  // stream time jumped past both: still emit it, once
          }
          current.remove(start);
        } else if (!window.closed() && closesAt(start) <= watermark) {
          current.put(start, new Window(window.beats(), true));
        }
      }
      List<Row> out = new ArrayList<>();
      write(patient, before, current, watermark, closedOnEviction, out);
      return CollectionConverters.asScala(out.iterator());
    }

    @Override
    public void handleInitialState(String patient, Row initial, TimerValues timerValues) {
      long start = initial.<Long>getAs("window_start_ms");
      boolean closed = initial.<Boolean>getAs("closed");
      windows.updateValue(start, RowFactory.create(initial.<Long>getAs("beats"), closed));
      arm(start, closed);
    }

    private Map<Long, Window> read() {
      Map<Long, Window> found = new LinkedHashMap<>();
      Iterator<Tuple2<Long, Row>> entries = windows.iterator();
      while (entries.hasNext()) {
        Tuple2<Long, Row> entry = entries.next();
        found.put(entry._1(), new Window(entry._2().getLong(0), entry._2().getBoolean(1)));
      }
      return found;
    }

    /**
     * Persist {@code current} over {@code before} and emit one change row per window that changed. A
     * removed window is a tombstone; in {@code emitRemoved} it also carries its final count (closed), so
     * the output gets a window that closed and left the store in one batch.
     */
    private void write(String patient, Map<Long, Window> before, Map<Long, Window> current, Long rearmAfter,
                       Set<Long> emitRemoved, List<Row> out) {
      for (Map.Entry<Long, Window> entry : before.entrySet()) {
        long start = entry.getKey();
        if (current.containsKey(start)) {
          continue;
        }
        windows.removeKey(start);
        getHandle().deleteTimer(closesAt(start) - 1);
        getHandle().deleteTimer(evictedAt(start) - 1);
        boolean last = emitRemoved.contains(start);
        out.add(output(CHANGE, true, patient, start, last ? entry.getValue().beats() : null, last ? true : null,
            null, null, null, null));
      }
      for (Map.Entry<Long, Window> entry : current.entrySet()) {
        long start = entry.getKey();
        Window window = entry.getValue();
        Window previous = before.get(start);
        if (window.equals(previous)) {
          if (rearmAfter != null && deadline(start, window.closed()) - 1 <= rearmAfter) {
            getHandle().registerTimer(deadline(start, window.closed()));
          }
          continue;
        }
        windows.updateValue(start, RowFactory.create(window.beats(), window.closed()));
        if (previous == null || previous.closed() != window.closed()) {
          arm(start, window.closed());
        }
        out.add(output(CHANGE, false, patient, start, window.beats(), window.closed(), null, null, null, null));
      }
    }

    private Row output(String kind, boolean tombstone, String patient, long start, Long beats, Boolean closed,
                       Object partition, Object offset, Object timestamp, Object raw) {
      Object[] values = {kind, tombstone, patient, start, beats, closed, partition, offset, timestamp, raw};
      if (values.length != outputWidth) {
        throw new IllegalStateException("output DDL has " + outputWidth + " columns, the processor writes " + values.length);
      }
      return RowFactory.create(values);
    }
  }
}
