package streamstate.primitives;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
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
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The windowed stream-stream join primitive: records of two streams with the same key whose times are at most
 * {@code window} apart, joined, as Kafka Streams' {@code KStream#join / leftJoin / outerJoin(KStream, joiner,
 * JoinWindows.ofTimeDifferenceAndGrace(window, grace))} does (4.3.1, without spurious early left/outer results).
 * A job declares it in Python (spark_jobs/primitives/stream_stream_join.py); the rules are stated, each with the
 * Kafka Streams class it comes from, in spark_jobs/reference/generators/payments.py, whose plain-Python task this processor
 * follows step by step. In short, per task (a partition of both topics):
 * <ul>
 *   <li>records are taken in timestamp order, each side's in offset order; on a tie, the side not taken last;
 *       across micro-batches: a side's records wait in the store while the other side has records written but
 *       not yet read ({@link InputMerge}), so the order does not depend on how the input was cut;
 *   <li>stream time is the largest time of either side; each side's window store keeps that side's records, a
 *       lookup finding only those at or after that side's latest time - retention + 1 (retention = 2 window +
 *       grace); a record is put in its own side's store after its lookup;
 *   <li>a record joins every record of the other side with its key within [t - window, t + window];
 *   <li>an unmatched record of an outer side (left: the left; outer: both) waits in the outer store until its
 *       window closes (time + window + grace before stream time), then is emitted alone, unless a later record
 *       joins it first; one already more than {@code window} behind stream time is emitted alone at once; the
 *       outer store is scanned only by a record at stream time, and only once stream time passes the scan's
 *       {@code minTime} + window + grace (Kafka Streams' hold-back, kept as it is).
 * </ul>
 * A key's records leave their side's store once no lookup can find them: when a batch puts a record of the key on
 * that side, and in a sweep of the task's other entries each time stream time crosses a multiple of half the
 * retention (an entry only read, by the other side's lookups, included). The sweep reads each entry's newest time
 * from a map of its own (not changelogged: rebuilt from the window store after a restore), not the entry's records.
 *
 * <p>Input columns: {@code partition}, {@code offset}, the key ({@code keyColumn}), {@code _right}, {@code _time_ms},
 * {@code _left_row} and {@code _right_row}. Output rows ({@code outputDdl}): {@code kind}, {@code key},
 * {@code tombstone}, {@code source_partition}, {@code side}, {@code records} (a change row: one per changed store
 * entry, keyed as its changelog is; a record waiting for the other side is an entry of its own,
 * {@code ~waiting@<partition>@<side>@<offset>@<key>}), {@code stream_time_ms}, {@code min_time_ms}, {@code left_time_ms},
 * {@code right_time_ms}, {@code last_side} (the partition's times), then {@code left_offset}, {@code right_offset},
 * {@code left_row}, {@code right_row}, {@code result_time_ms} (a joined row: -1 for an absent side's offset).
 */
public final class StreamStreamJoin {
  static final String CHANGE = "change";
  static final String JOINED = "joined";
  static final String LEFT = "left";
  static final String RIGHT = "right";
  static final String WINDOW_PREFIX = "~window@";
  static final String PENDING_PREFIX = "~pending@";
  static final String TIMES_PREFIX = "~stream-time@";
  static final String WAITING_PREFIX = "~waiting@";
  private static final int WIDTH = 16;

  private StreamStreamJoin() {}

  /**
   * The processor's rows (see the class comment) for {@code events} grouped by {@code partitionColumn};
   * {@code initial} (the restored store, or null) seeds it. {@code join}: inner, left or outer.
   */
  public static Dataset<Row> changes(Dataset<Row> events, String partitionColumn, Dataset<Row> initial, String store,
                                     String outputDdl, long windowMs, long graceMs, String join, String keyColumn) {
    StructType output = StructType.fromDDL(outputDdl);
    Joiner joiner = new Joiner(store, output, windowMs, graceMs, join, keyColumn);
    return PartitionTask.changes(events, partitionColumn, initial, joiner, OutputMode.Append(), output);
  }

  /** A record in a task's stores: its side, time, offset and row. */
  record Stored(String side, long time, long offset, String key, Row row) {
    Row stored() {
      return RowFactory.create(time, offset, side.equals(LEFT) ? row : null, side.equals(RIGHT) ? row : null);
    }

    static Stored of(String side, String key, Row stored) {
      Row row = stored.getStruct(side.equals(LEFT) ? 2 : 3);
      return new Stored(side, stored.getLong(0), stored.getLong(1), key, row);
    }
  }

  /** An outer-store entry's key: Kafka Streams orders them by time, then side (the right's byte first), then key. */
  record PendingKey(long time, String side, String key) {
    static final Comparator<PendingKey> ORDER = Comparator.comparingLong(PendingKey::time)
        .thenComparing(k -> k.side().equals(RIGHT) ? 0 : 1)
        .thenComparing(PendingKey::key, StreamStreamJoin::compareUtf8);

    String changelogKey(int partition) {
      return PENDING_PREFIX + partition + "@" + time + "@" + side + "@" + key;
    }
  }

  /** Kafka Streams compares keys as bytes (unsigned): the same as UTF-16 order for ASCII, not beyond. */
  static int compareUtf8(String a, String b) {
    byte[] x = a.getBytes(java.nio.charset.StandardCharsets.UTF_8);
    byte[] y = b.getBytes(java.nio.charset.StandardCharsets.UTF_8);
    return java.util.Arrays.compareUnsigned(x, y);
  }

  static final class Joiner extends PartitionTask {
    private final String store;
    private final long windowMs;
    private final long graceMs;
    private final long retentionMs;
    private final Set<String> outerSides;
    private final String keyColumn;
    private final StructType recordsSchema;
    private final StructType timesSchema;
    /** side + "@" + key -> that side's records of the key, in put order */
    private transient MapState<String, Row> windows;
    /** pending (outer store) changelog key -> its records, in put order */
    private transient MapState<String, Row> pending;
    /** stream time, minTime, each side's latest time, the side taken last */
    private transient ValueState<Row> times;
    /** side + "@" + key -> the newest time of that window entry's records: what a sweep reads (a long, not a list
     * of rows to decode) to find the expired entries */
    private transient MapState<String, Long> newest;
    /** present once {@code newest} covers every window entry: absent after a restore (the changelog holds the
     * windows only) and in a checkpoint written before {@code newest} existed, until the next sweep fills it */
    private transient ValueState<Boolean> newestIndexed;
    /** the changelog key of a record waiting for the other side ({@link InputMerge}) -> it, as a one-record entry */
    private transient MapState<String, Row> waiting;

    Joiner(String store, StructType output, long windowMs, long graceMs, String join, String keyColumn) {
      if (output.size() != WIDTH) {
        throw new IllegalStateException("output DDL has " + output.size() + " columns, the processor writes " + WIDTH);
      }
      this.store = store;
      this.windowMs = windowMs;
      this.graceMs = graceMs;
      this.retentionMs = 2 * windowMs + graceMs;
      this.outerSides = switch (join) {
        case "inner" -> Set.of();
        case "left" -> Set.of(LEFT);
        case "outer" -> Set.of(LEFT, RIGHT);
        default -> throw new IllegalArgumentException("unknown join " + join);
      };
      this.keyColumn = keyColumn;
      this.recordsSchema = new StructType().add("side", output.apply("side").dataType())
          .add("records", output.apply("records").dataType());
      this.timesSchema = new StructType().add("stream_time_ms", "bigint").add("min_time_ms", "bigint")
          .add("left_time_ms", "bigint").add("right_time_ms", "bigint").add("last_side", "string");
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      windows = getHandle().getMapState(store, Encoders.STRING(), Encoders.row(recordsSchema), TTLConfig.NONE());
      pending = getHandle().getMapState(store + "-pending", Encoders.STRING(), Encoders.row(recordsSchema),
          TTLConfig.NONE());
      times = getHandle().getValueState(store + "-times", Encoders.row(timesSchema), TTLConfig.NONE());
      newest = getHandle().getMapState(store + "-newest", Encoders.STRING(), Encoders.LONG(), TTLConfig.NONE());
      newestIndexed = getHandle().getValueState(store + "-newest-indexed", Encoders.BOOLEAN(), TTLConfig.NONE());
      waiting = getHandle().getMapState(store + "-waiting", Encoders.STRING(), Encoders.row(recordsSchema),
          TTLConfig.NONE());
    }

    /** The side of a window entry's key ({@code WINDOW_PREFIX partition @ side @ key}). */
    static String sideOf(String windowKey) {
      int at = windowKey.indexOf('@', WINDOW_PREFIX.length());
      return windowKey.startsWith(LEFT, at + 1) ? LEFT : RIGHT;
    }

    /** The newest time among a window entry's stored records. */
    static long newestOf(Row entry) {
      long newestTime = Long.MIN_VALUE;
      for (Row record : entry.<Row>getList(1)) {
        newestTime = Math.max(newestTime, record.getLong(0));
      }
      return newestTime;
    }

    @Override
    protected void handlePartitionState(int partition, Row initial) {
      String key = initial.getAs("key");
      if (key.startsWith(TIMES_PREFIX)) {
        times.update(RowFactory.create(initial.getAs("stream_time_ms"), initial.getAs("min_time_ms"),
            initial.getAs("left_time_ms"), initial.getAs("right_time_ms"), initial.getAs("last_side")));
        return;
      }
      Row value = RowFactory.create(initial.getAs("side"), initial.getAs("records"));
      if (key.startsWith(WAITING_PREFIX)) {
        waiting.updateValue(key, value);
      } else if (key.startsWith(PENDING_PREFIX)) {
        pending.updateValue(key, value);
      } else {
        windows.updateValue(key, value);
      }
    }

    @Override
    protected Iterator<Row> handlePartitionRows(int partition, Iterator<Row> rows) {
      Rows.Sides sides = Rows.sidesInOffsetOrder(rows, "_right");
      Batch batch = new Batch(partition);
      List<InputMerge.Input> leftWaiting = new ArrayList<>();
      List<InputMerge.Input> rightWaiting = new ArrayList<>();
      Set<String> waitedBefore = new HashSet<>();
      Iterator<Tuple2<String, Row>> stored = waiting.iterator();
      while (stored.hasNext()) {
        Tuple2<String, Row> entry = stored.next();
        String[] parts = entry._1().substring(WAITING_PREFIX.length()).split("@", 4);
        Stored record = Stored.of(parts[1], parts[3], entry._2().<Row>getList(1).get(0));
        (record.side().equals(RIGHT) ? rightWaiting : leftWaiting).add(input(record));
        waitedBefore.add(entry._1());
      }
      Boolean rightBefore = batch.lastSide == null ? null : batch.lastSide.equals(RIGHT);
      InputMerge.Outcome outcome = InputMerge.merge(
          List.of(InputMerge.waitingFirst(leftWaiting, inputs(sides.unflagged(), false)),
              InputMerge.waitingFirst(rightWaiting, inputs(sides.flagged(), true))),
          InputMerge.laggingInputs(2, partition), InputMerge.twoInputRecency(rightBefore),
          record -> batch.process(new Stored(sideOf(record), record.time(), record.offset(), record.key(),
              record.row())));
      InputMerge.keepWaiting(outcome, waitedBefore,
          record -> WAITING_PREFIX + partition + "@" + sideOf(record) + "@" + record.offset() + "@"
              + record.key(),
          (key, record) -> {
            String side = sideOf(record);
            List<Stored> one = List.of(new Stored(side, record.time(), record.offset(), record.key(), record.row()));
            waiting.updateValue(key, batch.entryValue(side, one));
            batch.out.add(batch.entryChange(key, side, one));
          },
          key -> {
            waiting.removeKey(key);
            batch.out.add(batch.entryChange(key, null, List.of()));
          });
      return CollectionConverters.asScala(batch.finish().iterator());
    }

    /** A side's input rows as the merge takes them. */
    private List<InputMerge.Input> inputs(List<Row> rows, boolean right) {
      List<InputMerge.Input> records = new ArrayList<>(rows.size());
      for (Row row : rows) {
        records.add(new InputMerge.Input(right ? 1 : 0, time(row), row.<Long>getAs("offset"), row.getAs(keyColumn), false,
            row.getAs(right ? "_right_row" : "_left_row")));
      }
      return records;
    }

    private static InputMerge.Input input(Stored record) {
      return new InputMerge.Input(record.side().equals(RIGHT) ? 1 : 0, record.time(), record.offset(), record.key(), false,
          record.row());
    }

    private static String sideOf(InputMerge.Input record) {
      return record.input() == 1 ? RIGHT : LEFT;
    }

    private static long time(Row row) {
      return row.<Long>getAs("_time_ms");
    }

    /** One micro-batch of one partition: the entries it touches cached, written back at the end. */
    private final class Batch {
      final int partition;
      final Row timesBefore;
      long streamTime;
      long minTime;
      final Map<String, Long> observed = new HashMap<>();
      String lastSide;
      /** side@key -> records (read once) */
      final Map<String, List<Stored>> window = new HashMap<>();
      final Set<String> windowChanged = new HashSet<>();
      /** the outer store, read once when first needed, in Kafka Streams' order */
      TreeMap<PendingKey, List<Stored>> outer;
      final Set<PendingKey> outerChanged = new HashSet<>();
      final List<Row> out = new ArrayList<>();

      Batch(int partition) {
        this.partition = partition;
        this.timesBefore = times.exists() ? times.get() : null;
        streamTime = timesBefore == null ? -1 : timesBefore.getLong(0);
        minTime = timesBefore == null ? Long.MAX_VALUE : timesBefore.getLong(1);
        observed.put(LEFT, timesBefore == null ? -1 : timesBefore.getLong(2));
        observed.put(RIGHT, timesBefore == null ? -1 : timesBefore.getLong(3));
        lastSide = timesBefore == null ? null : timesBefore.getString(4);
      }

      String windowKey(String side, String key) {
        return WINDOW_PREFIX + partition + "@" + side + "@" + key;
      }

      List<Stored> windowOf(String side, String key) {
        return window.computeIfAbsent(windowKey(side, key), k -> {
          List<Stored> list = new ArrayList<>();
          Row entry = windows.getValue(k);  // null: absent (one read: containsKey is a read too)
          if (entry != null) {
            for (Row stored : entry.<Row>getList(1)) {
              list.add(Stored.of(side, key, stored));
            }
          }
          return list;
        });
      }

      TreeMap<PendingKey, List<Stored>> outerStore() {
        if (outer == null) {
          outer = new TreeMap<>(PendingKey.ORDER);
          Iterator<Tuple2<String, Row>> stored = pending.iterator();
          while (stored.hasNext()) {
            Tuple2<String, Row> entry = stored.next();
            String[] parts = entry._1().substring(PENDING_PREFIX.length()).split("@", 4);
            String side = parts[2];
            List<Stored> records = new ArrayList<>();
            for (Row record : entry._2().<Row>getList(1)) {
              records.add(Stored.of(side, parts[3], record));
            }
            outer.put(new PendingKey(Long.parseLong(parts[1]), side, parts[3]), records);
          }
        }
        return outer;
      }

      void process(Stored record) {
        String other = record.side().equals(LEFT) ? RIGHT : LEFT;
        lastSide = record.side();
        streamTime = Math.max(streamTime, record.time());
        if (!outerSides.isEmpty() && record.time() == streamTime) {
          emitClosed();
        }
        long from = Math.max(0L, Math.max(record.time() - windowMs, observed.get(other) - retentionMs + 1));
        long to = Math.max(0L, record.time() + windowMs);
        List<Stored> found = new ArrayList<>();
        for (Stored candidate : windowOf(other, record.key())) {
          if (candidate.time() >= from && candidate.time() <= to) {
            found.add(candidate);
          }
        }
        found.sort(Comparator.comparingLong(Stored::time));  // stable: put order within a time
        for (Stored match : found) {
          PendingKey matched = new PendingKey(match.time(), other, record.key());
          if (outerStore().remove(matched) != null) {
            outerChanged.add(matched);
          }
          emit(record, match);
        }
        if (outerSides.contains(record.side()) && found.isEmpty()) {
          if (record.time() + windowMs >= streamTime) {
            minTime = Math.min(minTime, record.time());
            PendingKey waiting = new PendingKey(record.time(), record.side(), record.key());
            outerStore().computeIfAbsent(waiting, k -> new ArrayList<>()).add(record);
            outerChanged.add(waiting);
          } else {
            emit(record, null);
          }
        }
        List<Stored> own = windowOf(record.side(), record.key());
        own.add(record);
        windowChanged.add(windowKey(record.side(), record.key()));
        observed.put(record.side(), Math.max(observed.get(record.side()), record.time()));
      }

      /** Kafka Streams' {@code emitNonJoinedOuterRecords}: the closed entries emitted alone, minTime moved. */
      void emitClosed() {
        if (!(minTime + windowMs + graceMs < streamTime)) {  // Java long arithmetic, as Kafka Streams'
          return;
        }
        minTime = Long.MAX_VALUE;
        Set<String> openSides = new HashSet<>();
        List<PendingKey> emitted = new ArrayList<>();
        scan:
        for (Map.Entry<PendingKey, List<Stored>> entry : outerStore().entrySet()) {
          for (Stored stored : entry.getValue()) {
            minTime = entry.getKey().time();
            if (openSides.size() == 2) {
              break scan;
            }
            if (entry.getKey().time() + windowMs + graceMs >= streamTime) {
              openSides.add(entry.getKey().side());
              continue;
            }
            emit(stored, null);
            if (emitted.isEmpty() || !emitted.get(emitted.size() - 1).equals(entry.getKey())) {
              emitted.add(entry.getKey());
            }
          }
        }
        for (PendingKey key : emitted) {
          outerStore().remove(key);
          outerChanged.add(key);
        }
      }

      void emit(Stored self, Stored other) {
        Stored left = self.side().equals(LEFT) ? self : other;
        Stored right = self.side().equals(LEFT) ? other : self;
        Object[] row = new Object[WIDTH];
        row[0] = JOINED;
        row[1] = self.key();
        row[2] = false;
        row[3] = partition;
        row[11] = left == null ? -1L : left.offset();
        row[12] = right == null ? -1L : right.offset();
        row[13] = left == null ? null : left.row();
        row[14] = right == null ? null : right.row();
        row[15] = other == null ? self.time() : Math.max(self.time(), other.time());
        out.add(RowFactory.create(row));
      }

      List<Row> finish() {
        sweepIfDue();
        for (String key : windowChanged) {
          String side = sideOf(key);
          List<Stored> kept = new ArrayList<>();
          long cutoff = observed.get(side) - retentionMs + 1;  // older records are never found again
          long newestTime = Long.MIN_VALUE;
          for (Stored stored : window.get(key)) {
            if (stored.time() >= cutoff) {
              kept.add(stored);
              newestTime = Math.max(newestTime, stored.time());
            }
          }
          out.add(entryChange(key, side, kept));
          if (kept.isEmpty()) {
            windows.removeKey(key);
            newest.removeKey(key);
          } else {
            windows.updateValue(key, entryValue(side, kept));
            newest.updateValue(key, newestTime);
          }
        }
        for (PendingKey key : outerChanged) {
          List<Stored> records = outer == null ? null : outer.get(key);
          String changelogKey = key.changelogKey(partition);
          if (records == null || records.isEmpty()) {
            pending.removeKey(changelogKey);
            out.add(entryChange(changelogKey, key.side(), List.of()));
          } else {
            pending.updateValue(changelogKey, entryValue(key.side(), records));
            out.add(entryChange(changelogKey, key.side(), records));
          }
        }
        Row now = RowFactory.create(streamTime, minTime, observed.get(LEFT), observed.get(RIGHT), lastSide);
        if (!now.equals(timesBefore)) {
          times.update(now);
          Object[] row = new Object[WIDTH];
          row[0] = CHANGE;
          row[1] = TIMES_PREFIX + partition;
          row[2] = false;
          row[3] = partition;
          row[6] = streamTime;
          row[7] = minTime;
          row[8] = observed.get(LEFT);
          row[9] = observed.get(RIGHT);
          row[10] = lastSide;
          out.add(RowFactory.create(row));
        }
        return out;
      }

      /**
       * A key's records leave its side's store when no lookup can find them (older than that side's time -
       * retention + 1), but only the entries this batch put to are pruned by it: every time stream time crosses
       * a multiple of half the retention, the task's other entries are swept, those the other side's lookups read
       * this batch too (a key whose one side stopped would keep that side's records forever; Kafka Streams drops a
       * whole segment of its window store as stream time moves, each segment half the retention long). The sweep
       * reads the entries' newest times ({@code newest}), filled from the window store first if it is not yet.
       */
      void sweepIfDue() {
        long every = Math.max(retentionMs / 2, 1);
        long before = timesBefore == null ? -1 : timesBefore.getLong(0);
        if (before >= 0 && Math.floorDiv(before, every) == Math.floorDiv(streamTime, every)) {
          return;
        }
        if (!newestIndexed.exists()) {
          indexNewest();
        }
        List<String> expired = new ArrayList<>();
        Iterator<Tuple2<String, Long>> entries = newest.iterator();
        while (entries.hasNext()) {
          Tuple2<String, Long> entry = entries.next();
          if (windowChanged.contains(entry._1())) {
            continue;  // put to by this batch: pruned below (one only read by a lookup is swept like the others)
          }
          if (entry._2() < observed.get(sideOf(entry._1())) - retentionMs + 1) {
            expired.add(entry._1());
          }
        }
        for (String key : expired) {
          windows.removeKey(key);
          newest.removeKey(key);
          out.add(entryChange(key, null, List.of()));
        }
      }

      /** {@code newest} filled from the window store: once per task after a restore or an older checkpoint. */
      void indexNewest() {
        Iterator<Tuple2<String, Row>> stored = windows.iterator();
        while (stored.hasNext()) {
          Tuple2<String, Row> entry = stored.next();
          newest.updateValue(entry._1(), newestOf(entry._2()));
        }
        newestIndexed.update(true);
      }

      Row entryValue(String side, List<Stored> records) {
        List<Row> stored = new ArrayList<>();
        for (Stored record : records) {
          stored.add(record.stored());
        }
        return RowFactory.create(side, CollectionConverters.asScala(stored).toSeq());
      }

      Row entryChange(String key, String side, List<Stored> records) {
        Object[] row = new Object[WIDTH];
        row[0] = CHANGE;
        row[1] = key;
        row[2] = records.isEmpty();
        row[3] = partition;
        if (!records.isEmpty()) {
          Row value = entryValue(side, records);
          row[4] = value.get(0);
          row[5] = value.get(1);
        }
        return RowFactory.create(row);
      }
    }
  }
}
