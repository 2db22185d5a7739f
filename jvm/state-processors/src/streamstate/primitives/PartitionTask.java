package streamstate.primitives;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessorWithInitialState;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.hash.Murmur3_x86_32;

import scala.collection.Iterator;

import streamstate.jobs.DeadLetters;

/**
 * A processor keyed by <b>source partition</b>, the unit a Kafka Streams task is: it sees the partition's
 * records of a micro-batch in offset order and keeps the partition's <b>stream time</b>, its largest event
 * time so far ({@link WindowedAggregate}, {@link ExpiringAggregate}). A restore hands the stream time back
 * on its own initial-state row (key null, {@code stream_time_ms} set). Decisions are made record by record
 * against stream time, never against timers, so they do not depend on where micro-batches end.
 *
 * <p>Spark places a group by the hash of its key, and the hashes of partitions 0 and 1 fall in the same
 * one of two shuffle partitions: one task ran both source partitions while the other core idled. So
 * the processor's grouping key is the partition's <b>task key</b> ({@link #taskKey}), a number whose
 * low 32 bits are the partition and whose hash spreads the source partitions over the shuffle
 * partitions round-robin, for any number of shuffle partitions dividing {@link #SPREAD}. It depends on
 * nothing else, so a checkpoint finds its state whatever the session's shuffle partitions say.
 */
public abstract class PartitionTask extends StatefulProcessorWithInitialState<Long, Row, Row, Row> {
  /** The seed of Spark's hash partitioning (Murmur3Hash's default). */
  private static final int SPARK_HASH_SEED = 42;
  /** Task keys spread evenly over any number of shuffle partitions dividing this: 1-10, 12, 16, 20, 24,
   * 32, 40, 48, 50, 64, 100, 200 among others. */
  public static final int SPREAD = 100_800;
  private static final Map<Integer, Long> TASK_KEYS = new ConcurrentHashMap<>();

  /** The grouping key of source partition {@code partition}: the smallest {@code partition + j * 2^32}
   * whose Spark hash is congruent to the partition modulo {@link #SPREAD} (about {@code SPREAD} hashes
   * to find, once per partition and JVM). */
  public static long taskKey(int partition) {
    return TASK_KEYS.computeIfAbsent(partition, p -> {
      for (long key = Integer.toUnsignedLong(p); ; key += 1L << 32) {
        if (Math.floorMod(Murmur3_x86_32.hashLong(key, SPARK_HASH_SEED), SPREAD) == Math.floorMod(p, SPREAD)) {
          return key;
        }
      }
    });
  }

  /** Initial-state column: the source partition a restored row belongs to. */
  static final String INITIAL_PARTITION = "source_partition";

  /**
   * The output rows ({@code output}) of {@code processor} over {@code events} grouped by the task key of
   * their source partition (column {@code partitionColumn}); {@code initial} (rows with
   * {@link #INITIAL_PARTITION}, or null) seeds the store after a restore. No time mode: decisions follow
   * stream time, never timers. Rejected records among {@code events} pass through (see {@link DeadLetters}).
   */
  static Dataset<Row> changes(Dataset<Row> events, String partitionColumn, Dataset<Row> initial,
                              PartitionTask processor, OutputMode outputMode, StructType output) {
    KeyValueGroupedDataset<Long, Row> seeded = initial == null ? null : byTask(initial, INITIAL_PARTITION);
    return DeadLetters.transform(byTask(events, partitionColumn), events.schema(), processor, TimeMode.None(),
        outputMode, output, seeded, initial == null ? null : initial.schema());
  }

  /** The task key of a source partition, as a column function. */
  private static final UserDefinedFunction TASK_KEY =
      functions.udf((UDF1<Integer, Long>) PartitionTask::taskKey, DataTypes.LongType);

  /** {@code rows} grouped by the task key of their source partition (column {@code partitionColumn}), computed
   * from the column alone (as {@link Rows#byColumn}: no row turned into an object to find its key). */
  static KeyValueGroupedDataset<Long, Row> byTask(Dataset<Row> rows, String partitionColumn) {
    return Rows.grouped(rows, TASK_KEY.apply(rows.col(partitionColumn)), Encoders.LONG());
  }

  /** The processor's input rows of one micro-batch of source partition {@code partition}. */
  protected abstract Iterator<Row> handlePartitionRows(int partition, Iterator<Row> rows);

  /** One restored row of source partition {@code partition}. */
  protected abstract void handlePartitionState(int partition, Row initial);

  @Override
  public final Iterator<Row> handleInputRows(Long task, Iterator<Row> rows, TimerValues timerValues) {
    return handlePartitionRows((int) task.longValue(), rows);
  }

  @Override
  public final void handleInitialState(Long task, Row initial, TimerValues timerValues) {
    handlePartitionState((int) task.longValue(), initial);
  }

  /** the partition's stream time (absent before its first event) */
  protected transient ValueState<Long> streamTime;

  /** Call from {@code init}: the stream time's state, named after {@code store}. */
  protected void initStreamTime(String store) {
    streamTime = getHandle().getValueState(store + "-stream-time", Encoders.LONG(), TTLConfig.NONE());
  }

  /** The stream time before this batch: {@link Long#MIN_VALUE} before the partition's first event. */
  protected long streamTimeOrMin() {
    return streamTime.exists() ? streamTime.get() : Long.MIN_VALUE;
  }

  /** True (and the stream time restored) when {@code initial} is the row of a partition's stream time. */
  protected boolean restoredStreamTime(Row initial) {
    if (!initial.isNullAt(initial.fieldIndex("key"))) {
      return false;
    }
    long restored = initial.<Long>getAs("stream_time_ms");
    streamTime.update(streamTime.exists() ? Math.max(streamTime.get(), restored) : restored);
    return true;
  }

  /** One micro-batch of one partition: the partition's stream time as the batch's records advance it,
   * and the rows the batch emits. */
  protected abstract class TaskBatch {
    protected final int partition;
    private final long streamTimeBefore;
    /** the partition's stream time as this batch advances it */
    protected long now;
    protected final List<Row> out = new ArrayList<>();

    protected TaskBatch(int partition) {
      this.partition = partition;
      this.streamTimeBefore = streamTimeOrMin();
      this.now = streamTimeBefore;
    }

    /** A record at {@code eventTime} arrives: stream time moves to it if it is later, then
     * {@link #onAdvance} does what became due. */
    final void advance(long eventTime) {
      if (eventTime > now) {
        now = eventTime;
        onAdvance();
      }
    }

    /** What is due once stream time moved to {@link #now}. */
    protected abstract void onAdvance();

    /** Store the stream time if this batch moved it; true when it did (the processor then emits the
     * partition's stream-time row, for restores). */
    protected boolean saveStreamTime() {
      if (now == streamTimeBefore) {
        return false;
      }
      streamTime.update(now);
      return true;
    }
  }

  @Override
  public final Iterator<Row> handleExpiredTimer(Long task, TimerValues timerValues, ExpiredTimerInfo info) {
    throw new IllegalStateException(getClass().getSimpleName() + " registers no timers");
  }
}
