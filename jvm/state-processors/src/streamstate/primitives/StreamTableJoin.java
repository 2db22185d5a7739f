package streamstate.primitives;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.PriorityQueue;
import java.util.Set;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;


/**
 * The stream-table join primitive: each record of a stream joined with one or more tables' rows for its key, as
 * Kafka Streams' {@code KStream#join / leftJoin(KTable)} does (several tables: {@code
 * stream.leftJoin(first).leftJoin(second)}, each table keyed as the stream is). A job declares it in Python
 * (spark_jobs/primitives/stream_table_join.py), which decodes the topics and says which input a record is.
 *
 * <p>Like Kafka Streams' task, the processor is keyed by <b>source partition</b> ({@link PartitionTask}): the
 * partition of every input topic (they are co-partitioned). Rules, per partition:
 * <ul>
 *   <li><b>Order.</b> The inputs' records are taken in timestamp order across micro-batches, each input's in
 *       offset order, on a tie the input taken least recently, and an input's records wait in the store while
 *       another has records written but not yet read ({@link InputMerge}: a Kafka Streams task's order, however
 *       the input is cut into micro-batches). A stream record's time is its event time; a table record's, its
 *       Kafka timestamp.
 *   <li><b>The tables.</b> A {@code versioned} store keeps each key's versions (valid from their record's
 *       time; a tombstone is a version without a row) for {@code retention} of table time (the largest record
 *       time seen of that table): a record older than that is dropped, as a versioned store's expired put is. A
 *       {@code key_value} store keeps each key's latest row, in arrival order.
 *   <li><b>The join.</b> A stream record is joined with each table's row valid at its own time (versioned) or
 *       current row ({@code key_value}); an inner join emits only when every table has one, a left join always
 *       (a table's fields null without a row). A versioned lookup older than the retention finds nothing.
 *   <li><b>Grace</b> ({@code grace > 0}, versioned, one table only): a stream record is held in the partition's
 *       buffer until the stream time (the largest stream record time buffered, Kafka Streams' buffer's observed
 *       stream time) reaches its time + grace, then joined, the due ones in (time, key, offset) order; so a
 *       table update up to {@code grace} late still counts. A record already older than stream time - grace
 *       when it arrives is joined at once (Kafka Streams' {@code KStreamKTableJoinProcessor} does the same).
 * </ul>
 *
 * <p>Input columns: {@code partition}, {@code offset}, the key ({@code keyColumn}), {@code _input} (0 a stream
 * record, {@code t + 1} a record of table {@code t}), {@code _time_ms}, {@link Rows#DELETE_COLUMN} (a table
 * tombstone), {@code _stream_row} and {@code _table_row} (the record's fields: a table record's in the struct of
 * every table's fields, the others' null). Output rows ({@code outputDdl}):
 * {@code kind}, {@code key}, {@code tombstone}, {@code source_partition}, {@code versions},
 * {@code buffered}, {@code stream_time_ms}, {@code table_time_ms}, {@code last_side} (a {@code change} row: one
 * per changed store entry, keyed as its changelog is: a table key ({@code ~table@<t>@<key>} for a table after
 * the first), {@code ~buffer@<partition>@<offset>} for a held stream record,
 * {@code ~waiting@<partition>@<side>@<offset>} for a record waiting for another input ({@link InputMerge}: a
 * stream record's in {@code buffered}, a table record's key and time there too and its version in
 * {@code versions}), {@code ~stream-time@<partition>} for the partition's times and the input it took last (the
 * inputs' recency with several tables), {@code ~table-time@<partition>@<t>} for a further table's time), then
 * {@code source_offset}, {@code event_time_ms}, {@code stream_row}, {@code table_rows} (a {@code joined} row: the
 * stream record's result, with each table's row, null for none).
 */
public final class StreamTableJoin {
  static final String CHANGE = "change";
  static final String JOINED = "joined";
  static final String BUFFER_PREFIX = "~buffer@";
  static final String TIMES_PREFIX = "~stream-time@";
  static final String WAITING_PREFIX = "~waiting@";
  /** a further table's (the second's and after) key: {@code ~table@<table>@<key>} */
  static final String TABLE_PREFIX = "~table@";
  /** a further table's time: {@code ~table-time@<partition>@<table>} */
  static final String TABLE_TIME_PREFIX = "~table-time@";
  static final String STREAM = "stream";
  static final String TABLE = "table";
  // the output row's columns (outputDdl)
  private static final int KIND = 0;
  private static final int KEY = 1;
  private static final int TOMBSTONE = 2;
  private static final int PARTITION = 3;
  private static final int VERSIONS = 4;
  private static final int BUFFERED = 5;
  private static final int STREAM_TIME = 6;
  private static final int TABLE_TIME = 7;
  private static final int LAST_SIDE = 8;
  private static final int SOURCE_OFFSET = 9;
  private static final int EVENT_TIME = 10;
  private static final int STREAM_ROW = 11;
  private static final int TABLE_ROWS = 12;
  private static final int WIDTH = 13;

  private StreamTableJoin() {}

  /**
   * The processor's rows (see the class comment) for {@code events} grouped by {@code partitionColumn};
   * {@code initial} (the restored store: {@code source_partition}, {@code key} and the value columns, or null)
   * seeds it. {@code versioned}: versioned tables ({@code retentionMs} of history), else the latest row;
   * {@code tables}: how many tables (input 0 is the stream, input {@code t + 1} table {@code t}; a stream record
   * is joined with each, by its key, in one step). Rejected records among {@code events} pass through.
   */
  public static Dataset<Row> changes(Dataset<Row> events, String partitionColumn, Dataset<Row> initial, String store,
                                     String outputDdl, boolean versioned, long retentionMs, long graceMs,
                                     boolean leftJoin, int tables, String keyColumn) {
    StructType output = StructType.fromDDL(outputDdl);
    Joiner joiner = new Joiner(store, output, versioned, retentionMs, graceMs, leftJoin, tables, keyColumn);
    return PartitionTask.changes(events, partitionColumn, initial, joiner, OutputMode.Append(), output);
  }

  /** A table version: valid from {@code validFrom}; {@code row} null for a tombstone. */
  record Version(long validFrom, Row row) {
    Row stored() {
      return RowFactory.create(validFrom, row != null, row);
    }

    static Version of(Row stored) {
      return new Version(stored.getLong(0), stored.getBoolean(1) ? stored.getStruct(2) : null);
    }
  }

  /** A stream record held for its grace period. */
  record Held(long time, long offset, String key, Row row) {
    static final Comparator<Held> DUE_ORDER =
        Comparator.comparingLong(Held::time).thenComparing(Held::key).thenComparingLong(Held::offset);

    Row stored() {
      return RowFactory.create(time, offset, key, row);
    }

    static Held of(Row stored) {
      return new Held(stored.getLong(0), stored.getLong(1), stored.getString(2), stored.getStruct(3));
    }
  }

  static final class Joiner extends PartitionTask {
    private final String store;
    private final boolean versioned;
    private final long retentionMs;
    private final long graceMs;
    private final boolean leftJoin;
    private final int tables;
    private final String keyColumn;
    private final StructType versionsSchema;
    private final StructType heldSchema;
    private final StructType waitingSchema;
    /** table key ({@link #tableKey}) -> its versions (oldest first) */
    private transient MapState<String, Row> table;
    /** offset -> a stream record held for its grace period */
    private transient MapState<Long, Row> buffer;
    /** the largest record time seen of the (first) table (the versioned store's observed stream time) */
    private transient ValueState<Long> tableTime;
    /** the same of each further table (by table index; only with more than one) */
    private transient MapState<Integer, Long> furtherTableTimes;
    /** the side the task took last ({@link #STREAM} or {@link #TABLE}): a tie goes to the other; with more than one
     * table, the inputs from the least to the most recently taken ({@link InputMerge#recencyText}) */
    private transient ValueState<String> lastSide;
    /** the changelog key of a record waiting for the other side -> it (a stream record's {@code buffered}, a table
     * record's {@code buffered} key and time with its {@code version}) */
    private transient MapState<String, Row> waiting;

    Joiner(String store, StructType output, boolean versioned, long retentionMs, long graceMs, boolean leftJoin,
           int tables, String keyColumn) {
      if (output.size() != WIDTH) {
        throw new IllegalStateException("output DDL has " + output.size() + " columns, the processor writes " + WIDTH);
      }
      this.store = store;
      this.versioned = versioned;
      this.retentionMs = retentionMs;
      this.graceMs = graceMs;
      this.leftJoin = leftJoin;
      this.tables = tables;
      this.keyColumn = keyColumn;
      this.versionsSchema = new StructType().add("versions", output.apply("versions").dataType());
      this.heldSchema = (StructType) output.apply("buffered").dataType();
      ArrayType versionList = (ArrayType) output.apply("versions").dataType();
      this.waitingSchema = new StructType().add("buffered", heldSchema).add("version", versionList.elementType());
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      initStreamTime(store);
      table = getHandle().getMapState(store, Encoders.STRING(), Encoders.row(versionsSchema), TTLConfig.NONE());
      buffer = getHandle().getMapState(store + "-buffer", Encoders.LONG(), Encoders.row(heldSchema), TTLConfig.NONE());
      tableTime = getHandle().getValueState(store + "-table-time", Encoders.LONG(), TTLConfig.NONE());
      lastSide = getHandle().getValueState(store + "-last-side", Encoders.STRING(), TTLConfig.NONE());
      waiting = getHandle().getMapState(store + "-waiting", Encoders.STRING(), Encoders.row(waitingSchema),
          TTLConfig.NONE());
      if (tables > 1) {  // only then: a one-table job's state keeps the variables it always had
        furtherTableTimes = getHandle().getMapState(store + "-table-times", Encoders.INT(), Encoders.LONG(),
            TTLConfig.NONE());
      }
    }

    /** Table {@code table}'s entry for {@code key}: the key itself for the first table. */
    static String tableKey(int table, String key) {
      return table == 0 ? key : TABLE_PREFIX + table + "@" + key;
    }

    /** A waiting record's side in its entry's key: {@link #STREAM}, {@link #TABLE} for the first table, then
     * {@code table1} and so on. */
    static String sideOf(int input) {
      return input == 0 ? STREAM : input == 1 ? TABLE : TABLE + (input - 1);
    }

    static int inputOf(String side) {
      return side.equals(STREAM) ? 0 : side.equals(TABLE) ? 1 : Integer.parseInt(side.substring(TABLE.length())) + 1;
    }

    @Override
    protected void handlePartitionState(int partition, Row initial) {
      String key = initial.getAs("key");
      if (key.startsWith(TABLE_TIME_PREFIX)) {
        int table = Integer.parseInt(key.substring(key.lastIndexOf('@') + 1));
        if (table < tables) {  // a table this job joins (a migrated store may hold one it no longer does)
          furtherTableTimes.updateValue(table, initial.<Long>getAs("table_time_ms"));
        }
      } else if (key.startsWith(TIMES_PREFIX)) {
        Long stream = initial.getAs("stream_time_ms");
        Long tableAt = initial.getAs("table_time_ms");
        if (stream != null) {
          streamTime.update(stream);
        }
        if (tableAt != null) {
          tableTime.update(tableAt);
        }
        String side = initial.getAs("last_side");
        if (side != null) {
          lastSide.update(side);
        }
      } else if (key.startsWith(WAITING_PREFIX)) {
        List<Row> versionsList = initial.getList(initial.fieldIndex("versions"));
        Row version = versionsList == null || versionsList.isEmpty() ? null : versionsList.get(0);
        waiting.updateValue(key, RowFactory.create(initial.getAs("buffered"), version));
      } else if (key.startsWith(BUFFER_PREFIX)) {
        Row held = initial.getAs("buffered");
        buffer.updateValue(held.getLong(1), held);
      } else {
        table.updateValue(key, RowFactory.create((Object) initial.getAs("versions")));
      }
    }

    @Override
    protected Iterator<Row> handlePartitionRows(int partition, Iterator<Row> rows) {
      List<List<Row>> byInput = Rows.inputsInOffsetOrder(rows, "_input", tables + 1);
      Batch batch = new Batch(partition);
      List<List<InputMerge.Input>> waitingBefore = new ArrayList<>();
      for (int i = 0; i <= tables; i++) {
        waitingBefore.add(new ArrayList<>());
      }
      Set<String> waitedBefore = new HashSet<>();
      Iterator<Tuple2<String, Row>> stored = waiting.iterator();
      while (stored.hasNext()) {
        Tuple2<String, Row> entry = stored.next();
        String side = entry._1().substring(WAITING_PREFIX.length()).split("@", 3)[1];
        InputMerge.Input record = waitingInput(inputOf(side), entry._2());
        waitingBefore.get(record.input()).add(record);
        waitedBefore.add(entry._1());
      }
      List<List<InputMerge.Input>> inputs = new ArrayList<>();
      for (int i = 0; i <= tables; i++) {
        inputs.add(InputMerge.waitingFirst(waitingBefore.get(i), inputs(byInput.get(i), i)));
      }
      String before = lastSide.exists() ? lastSide.get() : null;
      int[] recency = tables == 1
          ? InputMerge.twoInputRecency(before == null ? null : before.equals(TABLE))
          : InputMerge.recencyOf(before, tables + 1);
      InputMerge.Outcome outcome = InputMerge.merge(inputs, InputMerge.laggingInputs(tables + 1, partition), recency,
          record -> {
            if (record.input() > 0) {
              batch.update(record);
            } else {
              batch.arrive(record);
            }
          });
      String after = outcome.takenLast() == null ? before
          : tables == 1 ? sideOf(outcome.takenLast()) : InputMerge.recencyText(outcome.recency());
      batch.lastSideChanged = after != null && !after.equals(before);
      if (batch.lastSideChanged) {
        lastSide.update(after);
      }
      batch.lastSide = after;
      InputMerge.keepWaiting(outcome, waitedBefore, record -> waitingKey(partition, record),
          (key, record) -> {
            Row value = waitingValue(record);
            waiting.updateValue(key, value);
            batch.out.add(batch.change(key, false, record.input() > 0 ? versionSeq(value.getStruct(1)) : null,
                value.getStruct(0)));
          },
          key -> {
            waiting.removeKey(key);
            batch.out.add(batch.change(key, true, null, null));
          });
      return CollectionConverters.asScala(batch.finish().iterator());
    }

    private static long time(Row row) {
      return row.<Long>getAs("_time_ms");
    }

    /** An input's rows as the merge takes them. */
    private List<InputMerge.Input> inputs(List<Row> rows, int input) {
      List<InputMerge.Input> records = new ArrayList<>(rows.size());
      for (Row row : rows) {
        records.add(new InputMerge.Input(input, time(row), row.<Long>getAs("offset"), row.getAs(keyColumn),
            Boolean.TRUE.equals(row.getAs(Rows.DELETE_COLUMN)), row.getAs(input > 0 ? "_table_row" : "_stream_row")));
      }
      return records;
    }

    private static String waitingKey(int partition, InputMerge.Input record) {
      return WAITING_PREFIX + partition + "@" + sideOf(record.input()) + "@" + record.offset();
    }

    /** A waiting record as stored: its key, time and offset in {@code buffered} (a stream record's row there
     * too), a table record's version (its row, or none for a tombstone) in {@code version}. */
    private static Row waitingValue(InputMerge.Input record) {
      boolean table = record.input() > 0;
      Row held = new Held(record.time(), record.offset(), record.key(), table ? null : record.row()).stored();
      Row version = table ? new Version(record.time(), record.delete() ? null : record.row()).stored() : null;
      return RowFactory.create(held, version);
    }

    private static InputMerge.Input waitingInput(int input, Row value) {
      Held held = Held.of(value.getStruct(0));
      if (input == 0) {
        return new InputMerge.Input(0, held.time(), held.offset(), held.key(), false, held.row());
      }
      Version version = Version.of(value.getStruct(1));
      return new InputMerge.Input(input, held.time(), held.offset(), held.key(), version.row() == null, version.row());
    }

    private static Object versionSeq(Row version) {
      return CollectionConverters.asScala(List.of(version)).toSeq();
    }

    /** One micro-batch of one partition: the table keys and the buffer it touched, written back at the end. */
    private final class Batch {
      final int partition;
      final long streamTimeBefore;
      long streamNow;
      /** each table's time as the batch began, and now */
      final long[] tableTimeBefore;
      final long[] tableNow;
      /** table key ({@link #tableKey}) -> its versions, oldest first (read once, written back at the end) */
      final Map<String, List<Version>> versions = new HashMap<>();
      /** the table keys changed -> their table */
      final LinkedHashMap<String, Integer> changedKeys = new LinkedHashMap<>();
      /** the held records in due order, read once when a record is first held or one may be due (a heap: a
       * partition holds a grace period's worth of records, and each arrival adds one and takes the due ones) */
      PriorityQueue<Held> held;
      final Map<Long, Held> heldAdded = new LinkedHashMap<>();
      final List<Long> heldRemoved = new ArrayList<>();
      final List<Row> out = new ArrayList<>();
      /** the side taken last after this batch, and whether the batch changed it */
      String lastSide;
      boolean lastSideChanged;

      Batch(int partition) {
        this.partition = partition;
        this.streamTimeBefore = streamTimeOrMin();
        this.streamNow = streamTimeBefore;
        this.tableTimeBefore = new long[tables];
        tableTimeBefore[0] = tableTime.exists() ? tableTime.get() : Long.MIN_VALUE;
        for (int table = 1; table < tables; table++) {
          Long stored = furtherTableTimes.getValue(table);
          tableTimeBefore[table] = stored == null ? Long.MIN_VALUE : stored;
        }
        this.tableNow = tableTimeBefore.clone();
      }

      List<Version> versionsOf(String key) {
        return versions.computeIfAbsent(key, k -> {
          List<Version> list = new ArrayList<>();
          Row stored = table.getValue(k);  // null: absent (one read: containsKey is a read too)
          if (stored != null) {
            for (Row version : stored.<Row>getList(0)) {
              list.add(Version.of(version));
            }
          }
          return list;
        });
      }

      /** A table record: a new version of its key (versioned), or its key's row replaced (latest). */
      void update(InputMerge.Input record) {
        int t = record.input() - 1;
        String key = tableKey(t, record.key());
        long at = record.time();
        Row row = record.delete() ? null : record.row();
        List<Version> list = versionsOf(key);
        if (!versioned) {
          list.clear();
          if (row != null) {
            list.add(new Version(at, row));
          }
          changedKeys.put(key, t);
          return;
        }
        if (tableNow[t] != Long.MIN_VALUE && at < tableNow[t] - retentionMs) {
          return;  // older than the history kept: a versioned store drops an expired put
        }
        tableNow[t] = Math.max(tableNow[t], at);
        int i = 0;
        while (i < list.size() && list.get(i).validFrom() < at) {
          i++;
        }
        if (i < list.size() && list.get(i).validFrom() == at) {
          list.set(i, new Version(at, row));  // the same time again: the later record replaces it
        } else {
          list.add(i, new Version(at, row));
        }
        changedKeys.put(key, t);
      }

      /** A stream record arrives: joined now, or held for its grace period (then the due ones are joined). */
      void arrive(InputMerge.Input record) {
        Held incoming = new Held(record.time(), record.offset(), record.key(), record.row());
        if (graceMs == 0 || (streamNow != Long.MIN_VALUE && incoming.time() < streamNow - graceMs)) {
          join(incoming);
          return;
        }
        heldRecords().add(incoming);
        heldAdded.put(incoming.offset(), incoming);
        streamNow = Math.max(streamNow, incoming.time());
        long deadline = streamNow - graceMs;
        while (!held.isEmpty() && held.peek().time() <= deadline) {
          Held due = held.poll();
          if (heldAdded.remove(due.offset()) == null) {
            heldRemoved.add(due.offset());
          }
          join(due);
        }
      }

      PriorityQueue<Held> heldRecords() {
        if (held == null) {
          held = new PriorityQueue<>(Held.DUE_ORDER);
          Iterator<Tuple2<Long, Row>> stored = buffer.iterator();
          while (stored.hasNext()) {
            held.add(Held.of(stored.next()._2()));
          }
        }
        return held;
      }

      void join(Held record) {
        Row[] found = new Row[tables];
        for (int t = 0; t < tables; t++) {
          found[t] = lookup(t, record.key(), record.time());
          if (found[t] == null && !leftJoin) {
            return;  // an inner join: every table must have a row
          }
        }
        Object[] row = new Object[WIDTH];
        row[KIND] = JOINED;
        row[KEY] = record.key();
        row[TOMBSTONE] = false;
        row[PARTITION] = partition;
        row[SOURCE_OFFSET] = record.offset();
        row[EVENT_TIME] = record.time();
        row[STREAM_ROW] = record.row();
        row[TABLE_ROWS] = CollectionConverters.asScala(java.util.Arrays.asList(found)).toSeq();
        out.add(RowFactory.create(row));
      }

      /** Table {@code t}'s row for {@code key} valid at {@code at} (versioned), or its current row; null: none. */
      Row lookup(int t, String key, long at) {
        List<Version> list = versionsOf(tableKey(t, key));
        if (!versioned) {
          return list.isEmpty() ? null : list.get(0).row();
        }
        if (tableNow[t] != Long.MIN_VALUE && at < tableNow[t] - retentionMs) {
          return null;  // older than the history kept
        }
        Row found = null;
        for (Version version : list) {
          if (version.validFrom() > at) {
            break;
          }
          found = version.row();
        }
        return found;
      }

      List<Row> finish() {
        for (Map.Entry<String, Integer> changed : changedKeys.entrySet()) {
          String key = changed.getKey();
          List<Version> list = retained(versions.get(key), changed.getValue());
          if (list.isEmpty()) {
            table.removeKey(key);
            out.add(change(key, true, null, null));
            continue;
          }
          List<Row> stored = new ArrayList<>();
          for (Version version : list) {
            stored.add(version.stored());
          }
          Object seq = CollectionConverters.asScala(stored).toSeq();
          table.updateValue(key, RowFactory.create(seq));
          out.add(change(key, false, seq, null));
        }
        for (Long offset : heldRemoved) {
          buffer.removeKey(offset);
          out.add(change(BUFFER_PREFIX + partition + "@" + offset, true, null, null));
        }
        for (Held held : heldAdded.values()) {
          buffer.updateValue(held.offset(), held.stored());
          out.add(change(BUFFER_PREFIX + partition + "@" + held.offset(), false, null, held.stored()));
        }
        for (int t = 1; t < tables; t++) {
          if (tableNow[t] != tableTimeBefore[t]) {
            furtherTableTimes.updateValue(t, tableNow[t]);
            Object[] row = new Object[WIDTH];
            row[KIND] = CHANGE;
            row[KEY] = TABLE_TIME_PREFIX + partition + "@" + t;
            row[TOMBSTONE] = false;
            row[PARTITION] = partition;
            row[TABLE_TIME] = tableNow[t];
            out.add(RowFactory.create(row));
          }
        }
        if (streamNow != streamTimeBefore || tableNow[0] != tableTimeBefore[0] || lastSideChanged) {
          Object[] row = new Object[WIDTH];
          row[KIND] = CHANGE;
          row[KEY] = TIMES_PREFIX + partition;
          row[TOMBSTONE] = false;
          row[PARTITION] = partition;
          if (streamNow != Long.MIN_VALUE) {
            streamTime.update(streamNow);
            row[STREAM_TIME] = streamNow;
          }
          if (tableNow[0] != Long.MIN_VALUE) {
            tableTime.update(tableNow[0]);
            row[TABLE_TIME] = tableNow[0];
          }
          row[LAST_SIDE] = lastSide;
          out.add(RowFactory.create(row));
        }
        return out;
      }

      /** The versions a lookup may still read: those valid at some time within the retention (all, for a
       * store of the latest row); none when the only one left is a tombstone. */
      List<Version> retained(List<Version> list, int t) {
        int first = 0;
        if (versioned && tableNow[t] != Long.MIN_VALUE) {
          long cutoff = tableNow[t] - retentionMs;
          while (first + 1 < list.size() && list.get(first + 1).validFrom() <= cutoff) {
            first++;
          }
        }
        List<Version> kept = new ArrayList<>(list.subList(first, list.size()));
        if (kept.size() == 1 && kept.get(0).row() == null) {
          kept.clear();
        }
        return kept;
      }

      Row change(String key, boolean tombstone, Object versionsSeq, Row held) {
        Object[] row = new Object[WIDTH];
        row[KIND] = CHANGE;
        row[KEY] = key;
        row[TOMBSTONE] = tombstone;
        row[PARTITION] = partition;
        row[VERSIONS] = versionsSeq;
        row[BUFFERED] = held;
        return RowFactory.create(row);
      }
    }
  }
}
