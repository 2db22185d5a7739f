package streamstate.primitives;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.StatefulProcessorWithInitialState;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;

import scala.collection.Iterator;

/**
 * A processor keyed by <b>source partition</b>, the unit a Kafka Streams task is: it sees the partition's
 * records of a micro-batch in offset order and keeps the partition's <b>stream time</b>, its largest event
 * time so far ({@link WindowedAggregate}, {@link ExpiringAggregate}). A restore hands the stream time back
 * on its own initial-state row (key null, {@code stream_time_ms} set). Decisions are made record by record
 * against stream time, never against timers, so they do not depend on where micro-batches end.
 */
abstract class PartitionTask extends StatefulProcessorWithInitialState<Integer, Row, Row, Row> {
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
  public final Iterator<Row> handleExpiredTimer(Integer partition, TimerValues timerValues, ExpiredTimerInfo info) {
    throw new IllegalStateException(getClass().getSimpleName() + " registers no timers");
  }
}
