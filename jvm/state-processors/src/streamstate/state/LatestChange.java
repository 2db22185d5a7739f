package streamstate.state;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;

import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * The last change per key of a changelog range that Spark's Kafka batch source read
 * ({@code spark_jobs/state/changelog_spark.py}), as {@code (key STRING, value STRING)}, a null value a delete.
 *
 * <p>Rules:
 *
 * <ul>
 *   <li>A changelog is keyed: every change of a key is in the key's partition (Kafka's partitioner; a changelog
 *       topic whose partition count is not the store's is refused, {@code spark_jobs/kafka_topics.py}
 *       {@code ensure_topic}).
 *   <li>Spark's Kafka batch source reads each Kafka partition's range as one Spark partition (its documented
 *       default, without {@code minPartitions}), and the filters and the broadcast join before this keep rows
 *       where they are.
 *   <li>So a task holds all of its keys' changes, and the last one per key is found in a hash map of that task's
 *       keys: in apply order, the absorbing marker ({@code absorbed_at}) first, then the offset.
 * </ul>
 *
 * <p>Why not a grouped {@code max(struct(...))}: its value is not of a fixed width, so Spark sorts every record by
 * key after shuffling it, the costliest part of a snapshot's layer and of a restore's tail (BENCHMARKS.md). The
 * map holds a task's keys, so the caller keeps to ranges of a bounded length per partition.
 */
public final class LatestChange {
  private LatestChange() {}

  /** The schema of what {@link #of} returns. */
  static final StructType SCHEMA = new StructType()
      .add("key", DataTypes.StringType)
      .add("value", DataTypes.StringType);

  /**
   * {@code records} ({@code key} and {@code value} binary, {@code absorbed_at} and {@code offset} long, one Spark
   * partition per Kafka partition, see the class comment) reduced to the last change per key.
   */
  public static Dataset<Row> of(Dataset<Row> records) {
    Dataset<Row> columns = records.selectExpr("CAST(key AS STRING) AS key", "value", "absorbed_at", "offset");
    return columns.mapPartitions(new Reduce(), Encoders.row(SCHEMA));
  }

  /** A key's newest change so far. */
  private static final class Change {
    long absorbedAt;
    long offset;
    byte[] value;

    Change(long absorbedAt, long offset, byte[] value) {
      this.absorbedAt = absorbedAt;
      this.offset = offset;
      this.value = value;
    }

    boolean isBefore(long otherAbsorbedAt, long otherOffset) {
      return absorbedAt < otherAbsorbedAt || (absorbedAt == otherAbsorbedAt && offset < otherOffset);
    }
  }

  private static final class Reduce implements MapPartitionsFunction<Row, Row> {
    private static final long serialVersionUID = 1L;

    @Override
    public Iterator<Row> call(Iterator<Row> rows) {
      Map<String, Change> latest = new HashMap<>();
      while (rows.hasNext()) {
        Row row = rows.next();
        if (row.isNullAt(0)) {
          continue; // a record without a key changes no key (the grouped reduction's null group, dropped after)
        }
        String key = row.getString(0);
        byte[] value = row.isNullAt(1) ? null : (byte[]) row.get(1);
        long absorbedAt = row.getLong(2);
        long offset = row.getLong(3);
        Change known = latest.get(key);
        if (known == null) {
          latest.put(key, new Change(absorbedAt, offset, value));
        } else if (known.isBefore(absorbedAt, offset)) {
          known.absorbedAt = absorbedAt;
          known.offset = offset;
          known.value = value;
        }
      }
      Iterator<Map.Entry<String, Change>> entries = latest.entrySet().iterator();
      return new Iterator<Row>() {
        @Override
        public boolean hasNext() {
          return entries.hasNext();
        }

        @Override
        public Row next() {
          Map.Entry<String, Change> entry = entries.next();
          byte[] value = entry.getValue().value;
          String text = value == null ? null : new String(value, StandardCharsets.UTF_8);
          return RowFactory.create(entry.getKey(), text);
        }
      };
    }
  }
}
