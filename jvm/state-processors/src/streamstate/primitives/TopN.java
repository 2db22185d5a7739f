package streamstate.primitives;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.PriorityQueue;

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

import streamstate.jobs.DeadLetters;

/**
 * The top-N primitive: a table (an upsert topic read as Kafka Streams' {@code builder.table}) grouped by a
 * field of its key, and per group the N members ranked highest, as Kafka Streams'
 * {@code table.groupBy(...).aggregate(adder, subtractor)} over a sorted set does. A job declares it in
 * Python (spark_jobs/primitives/top_n.py); Spark evaluates the declaration's expressions before it.
 *
 * <p>Rules, per group:
 * <ul>
 *   <li>the store holds every member of the group (its latest row: a member's records are applied in
 *       source (partition, offset) order, and one member's records all sit in one partition, its key's);
 *       a tombstone ({@link Rows#DELETE_COLUMN}) removes the member;
 *   <li>the ranking: {@code score} descending (ascending when declared); a tie to the member whose tie
 *       fields (declared, among the stored ones) are smaller in their order, as Spark orders them (text by its
 *       UTF-8 bytes), then to the smaller member key (the same way); a member without a score is kept but not
 *       ranked;
 *   <li>per micro-batch: one change row per member the batch touched (its final row or a tombstone), and
 *       one rank row per rank whose member or row differs between the ranking before the batch and after
 *       it (a tombstone for a rank no member holds any more). The ranking is a function of the members'
 *       latest rows only, so neither depends on how the input was cut into micro-batches.
 * </ul>
 *
 * <p>Input columns: the group ({@code groupColumn}), {@code member}, {@code partition}, {@code offset},
 * {@link Rows#DELETE_COLUMN} and the member's stored fields ({@code memberDdl}: {@code score DOUBLE}, then
 * the row's fields). Output rows ({@code outputDdl}): {@code kind} ({@code change} or {@code rank}),
 * {@code key} (the member), {@code tombstone}, the group, {@code rank}, then the member's fields.
 */
public final class TopN {
  static final String CHANGE = "change";
  static final String RANK = "rank";
  static final String MEMBER_COLUMN = "member";
  /** Initial-state column: the member a restored row seeds. */
  static final String INITIAL_MEMBER = "key";

  private TopN() {}

  /**
   * The rows (see the class comment) of the top {@code n} of each group of {@code events} ({@code groupColumn});
   * {@code initial} (the restored store: {@code key} = member, the group column and {@code memberDdl}'s
   * columns, or null) seeds it after a restore. Rejected records among {@code events} pass through.
   */
  public static Dataset<Row> changes(Dataset<Row> events, String groupColumn, Dataset<Row> initial, String store,
                                     String memberDdl, int n, boolean descending, String ties, String outputDdl) {
    KeyValueGroupedDataset<String, Row> grouped = Rows.byColumn(events, groupColumn);
    KeyValueGroupedDataset<String, Row> seeded = initial == null ? null : Rows.byColumn(initial, groupColumn);
    StructType memberSchema = StructType.fromDDL(memberDdl);
    int[] tieFields = ties.isEmpty() ? new int[0]
        : java.util.Arrays.stream(ties.split(",")).mapToInt(memberSchema::fieldIndex).toArray();
    Ranker ranker = new Ranker(store, memberSchema, n, descending, tieFields);
    return DeadLetters.transform(grouped, events.schema(), ranker, TimeMode.None(), OutputMode.Update(),
        StructType.fromDDL(outputDdl), seeded, initial == null ? null : initial.schema());
  }

  /** Two values as Spark's {@code ORDER BY} orders them ascending: nulls first, text by its UTF-8 bytes, numbers,
   * times and the rest by their natural order. */
  @SuppressWarnings({"unchecked", "rawtypes"})
  static int sparkOrder(Object a, Object b) {
    if (a == null || b == null) {
      return a == null ? (b == null ? 0 : -1) : 1;
    }
    if (a instanceof String x && b instanceof String y) {
      return java.util.Arrays.compareUnsigned(x.getBytes(java.nio.charset.StandardCharsets.UTF_8),
          y.getBytes(java.nio.charset.StandardCharsets.UTF_8));
    }
    return ((Comparable) a).compareTo(b);
  }

  /** A ranked member: its key and stored row (score first). */
  record Ranked(String member, Row row) {
    double score() {
      return row.getDouble(0);
    }
  }

  static final class Ranker extends StatefulProcessorWithInitialState<String, Row, Row, Row> {
    private final String store;
    private final StructType memberSchema;
    private final int n;
    private final boolean descending;
    /** the stored row's fields that break a tie, in order */
    private final int[] tieFields;
    /** the group's members: member key -> stored row */
    private transient MapState<String, Row> members;

    Ranker(String store, StructType memberSchema, int n, boolean descending, int[] tieFields) {
      this.store = store;
      this.memberSchema = memberSchema;
      this.n = n;
      this.descending = descending;
      this.tieFields = tieFields;
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      members = getHandle().getMapState(store, Encoders.STRING(), Encoders.row(memberSchema), TTLConfig.NONE());
    }

    @Override
    public void handleInitialState(String group, Row initial, TimerValues timerValues) {
      members.updateValue(initial.getAs(INITIAL_MEMBER), Rows.select(initial, memberSchema));
    }

    @Override
    public Iterator<Row> handleInputRows(String group, Iterator<Row> rows, TimerValues timerValues) {
      List<Row> records = new ArrayList<>();
      while (rows.hasNext()) {
        records.add(rows.next());
      }
      int partition = records.get(0).fieldIndex("partition");
      int offset = records.get(0).fieldIndex("offset");
      records.sort(Comparator.<Row>comparingInt(r -> r.getInt(partition)).thenComparingLong(r -> r.getLong(offset)));

      List<Ranked> before = ranking();
      Map<String, Row> touched = new LinkedHashMap<>();  // member -> its final row, null when deleted
      for (Row record : records) {
        String member = record.getAs(MEMBER_COLUMN);
        if (Boolean.TRUE.equals(record.getAs(Rows.DELETE_COLUMN))) {
          members.removeKey(member);
          touched.put(member, null);
        } else {
          Row value = Rows.select(record, memberSchema);
          members.updateValue(member, value);
          touched.put(member, value);
        }
      }
      List<Ranked> after = ranking();

      List<Row> out = new ArrayList<>();
      for (Map.Entry<String, Row> change : touched.entrySet()) {
        out.add(row(CHANGE, change.getKey(), change.getValue(), group, null));
      }
      for (int i = 0; i < Math.max(before.size(), after.size()); i++) {
        Ranked was = i < before.size() ? before.get(i) : null;
        Ranked now = i < after.size() ? after.get(i) : null;
        if (!Objects.equals(was, now)) {
          out.add(row(RANK, now == null ? null : now.member(), now == null ? null : now.row(), group, i + 1));
        }
      }
      return CollectionConverters.asScala(out.iterator());
    }

    @Override
    public Iterator<Row> handleExpiredTimer(String group, TimerValues timerValues, ExpiredTimerInfo info) {
      return Rows.none();
    }

    /** The group's top n, best first (see the class comment): one pass over its members, a bounded heap. */
    private List<Ranked> ranking() {
      Comparator<Ranked> best = Comparator.comparingDouble(Ranked::score);
      if (descending) {
        best = best.reversed();
      }
      for (int field : tieFields) {
        best = best.thenComparing((a, b) -> sparkOrder(a.row().get(field), b.row().get(field)));
      }
      best = best.thenComparing((a, b) -> sparkOrder(a.member(), b.member()));
      PriorityQueue<Ranked> kept = new PriorityQueue<>(best.reversed());  // the worst kept on top
      Iterator<Tuple2<String, Row>> stored = members.iterator();
      while (stored.hasNext()) {
        Tuple2<String, Row> entry = stored.next();
        if (entry._2().isNullAt(0)) {
          continue;
        }
        kept.add(new Ranked(entry._1(), entry._2()));
        if (kept.size() > n) {
          kept.poll();
        }
      }
      List<Ranked> ranked = new ArrayList<>(kept);
      ranked.sort(best);
      return ranked;
    }

    /** An output row: kind, member, tombstone, group, rank, then the member's fields (nulls for a tombstone). */
    private Row row(String kind, String member, Row value, String group, Integer rank) {
      Object[] fields = new Object[5 + memberSchema.size()];
      fields[0] = kind;
      fields[1] = member;
      fields[2] = value == null;
      fields[3] = group;
      fields[4] = rank;
      for (int i = 0; value != null && i < memberSchema.size(); i++) {
        fields[5 + i] = value.get(i);
      }
      return RowFactory.create(fields);
    }
  }
}
