package streamstate.state;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.sketch.BloomFilter;

/**
 * A store's changes laid over a base, both {@code (key STRING, value STRING)}, a change's null value deleting its
 * key, when the changes are few enough to hold in the driver ({@code spark_jobs/state/snapshots.py} {@code overlay}):
 * the base's rows whose key no change touches, then the changes' live values.
 *
 * <p>Why not a broadcast anti-join: it probes a hash table of the changed keys once per base row, and in a restore
 * (1e7 snapshot rows, 2e5 changed keys) ~98% of the probes are misses in a table of megabytes that is not in the
 * CPU's cache: ~45% of the restore's CPU (BENCHMARKS.md). Here a Bloom filter of the changed keys (~180 KB per 1e5
 * keys at {@link #FALSE_POSITIVE_RATE}) answers "certainly unchanged" for most rows from cache, and only the rest
 * are looked up in the exact key set. Both reach each executor once, as a broadcast variable.
 *
 * <p>The changes are read once, here (their source, a changelog tail in Kafka or a snapshot's layers, is
 * evaluated by this call); the result holds them in the driver, so its plan no longer reads that source.
 */
public final class Overlay {
  /** The Bloom filter's false positive rate: a row it cannot rule out costs an exact lookup. */
  static final double FALSE_POSITIVE_RATE = 0.03;
  /** The live changes' rows per task that carries them (Spark warns of a task over 1 MB). */
  static final int ROWS_PER_TASK = 10_000;

  private Overlay() {}

  /** {@code changes} applied to {@code base} (see the class comment); {@code changes} holds one row per key. */
  public static Dataset<Row> apply(Dataset<Row> base, Dataset<Row> changes) {
    StructType schema = changes.schema();
    int keyAt = schema.fieldIndex("key");
    int valueAt = schema.fieldIndex("value");
    List<Row> collected = changes.where(functions.col("key").isNotNull()).collectAsList();
    ChangedKeys changed = new ChangedKeys(collected.size());
    List<Row> live = new ArrayList<>(collected.size());
    for (Row row : collected) {
      changed.add(row.getString(keyAt));
      if (!row.isNullAt(valueAt)) {
        live.add(row);
      }
    }
    SparkSession spark = base.sparkSession();
    JavaSparkContext context = JavaSparkContext.fromSparkContext(spark.sparkContext());
    Broadcast<ChangedKeys> shared = context.broadcast(changed);
    // the key as bytes: the filter hashes UTF-8, and a binary column reaches the function without a String
    Column untouched = functions.udf(new Untouched(shared), DataTypes.BooleanType)
        .apply(base.col("key").cast(DataTypes.BinaryType));
    int tasks = Math.max(1, (live.size() + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
    return base.where(untouched).unionByName(spark.createDataFrame(context.parallelize(live, tasks), schema));
  }

  /** The keys a set of changes touched: a Bloom filter ahead of the exact set. */
  static final class ChangedKeys implements Serializable {
    private static final long serialVersionUID = 1L;
    private final BloomFilter filter;
    private final Set<String> keys;

    ChangedKeys(int expected) {
      filter = BloomFilter.create(Math.max(1, expected), FALSE_POSITIVE_RATE);
      keys = new HashSet<>(Math.max(16, (int) (expected / 0.75f) + 1));
    }

    void add(String key) {
      keys.add(key);
      filter.putBinary(key.getBytes(StandardCharsets.UTF_8));
    }

    boolean contains(byte[] utf8) {
      return filter.mightContainBinary(utf8) && keys.contains(new String(utf8, StandardCharsets.UTF_8));
    }
  }

  /** True for a key no change touched (a null key: no change has one). */
  static final class Untouched implements UDF1<byte[], Boolean> {
    private static final long serialVersionUID = 1L;
    private final Broadcast<ChangedKeys> changed;
    private transient ChangedKeys keys; // the broadcast's value, fetched once per task (value() synchronizes)

    Untouched(Broadcast<ChangedKeys> changed) {
      this.changed = changed;
    }

    @Override
    public Boolean call(byte[] key) {
      if (keys == null) {
        keys = changed.value();
      }
      return key == null || !keys.contains(key);
    }
  }
}
