package streamstate.primitives;

import java.sql.Timestamp;
import java.util.List;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.types.StructType;

import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A {@link PartitionTask} that aggregates its partition's events per key ({@link WindowedAggregate},
 * {@link SessionAggregate}, {@link ExpiringAggregate}): what those processors share of their declaration (the store's name, the
 * aggregates' names, types and {@link KeyedAggregate.Kind kinds}, the key and event-time columns, how wide
 * an output row is), of their set-up (the stream time's state, then their own) and of their loop over a
 * partition's events. Like a Kafka Streams processor's {@code init} and {@code process}, a subclass only names
 * the state it keeps ({@link #initStores}) and says what one event does to it ({@link EventBatch}).
 */
abstract class AggregateTask extends PartitionTask {
  protected final String store;
  /** the aggregates' names and types, in order */
  protected final StructType values;
  protected final KeyedAggregate.Kind[] kinds;
  protected final String keyColumn;
  protected final String timeColumn;
  /** the number of columns of the output DDL */
  private final int outputWidth;

  protected AggregateTask(String store, StructType values, KeyedAggregate.Kind[] kinds, int outputWidth,
                          String keyColumn, String timeColumn) {
    this.store = store;
    this.values = values;
    this.kinds = kinds;
    this.outputWidth = outputWidth;
    this.keyColumn = keyColumn;
    this.timeColumn = timeColumn;
  }

  @Override
  public final void init(OutputMode outputMode, TimeMode timeMode) {
    initStreamTime(store);
    initStores();
  }

  /** The processor's own state (besides the stream time), named after {@link #store}. */
  protected abstract void initStores();

  /** The fields of an output row of {@code width} columns; fails when the output DDL has another number. */
  protected Object[] outputFields(int width) {
    if (width != outputWidth) {
      throw new IllegalStateException("output DDL has " + outputWidth + " columns, the processor writes " + width);
    }
    return new Object[width];
  }

  /** A restored store row: the partition's stream time ({@link #restoredStreamTime}), or a key's entry. */
  @Override
  protected final void handlePartitionState(int partition, Row initial) {
    if (!restoredStreamTime(initial)) {
      restoreKey(initial.getAs("key"), initial);
    }
  }

  /** Put the restored entry of {@code key} (its store row {@code initial}) back in the processor's state. */
  protected abstract void restoreKey(String key, Row initial);

  /** A batch of the partition's events: see {@link EventBatch}. */
  protected abstract EventBatch newBatch(int partition);

  /** The partition's events of a micro-batch in offset order, each advancing stream time to its event time
   * first ({@link TaskBatch#advance}), then deleting its key's state ({@link Rows#DELETE_COLUMN}) or applied. */
  @Override
  protected final Iterator<Row> handlePartitionRows(int partition, Iterator<Row> rows) {
    List<Row> events = Rows.inOffsetOrder(rows);
    int[] inputs = Rows.inputIndexes(events, kinds.length);
    EventBatch batch = newBatch(partition);
    if (!events.isEmpty()) {
      StructType schema = events.get(0).schema();
      int timeIndex = schema.fieldIndex(timeColumn);
      int keyIndex = schema.fieldIndex(keyColumn);
      int deleteIndex = schema.fieldIndex(Rows.DELETE_COLUMN);
      for (Row event : events) {
        long t = ((Timestamp) event.get(timeIndex)).getTime();
        batch.advance(t);
        String key = event.getString(keyIndex);
        if (Boolean.TRUE.equals(event.get(deleteIndex))) {
          batch.delete(key);
        } else {
          batch.apply(key, t, event, inputs);
        }
      }
    }
    return CollectionConverters.asScala(batch.finish().iterator());
  }

  /** One micro-batch of one partition of an aggregation: what each event does to its key's state (Kafka
   * Streams' {@code process}), and the batch's rows once its state is written back. */
  protected abstract class EventBatch extends TaskBatch {
    protected EventBatch(int partition) {
      super(partition);
    }

    /** {@code event} of {@code key} at {@code t}, stream time already advanced to it; {@code inputs}: where
     * each aggregate's input column is ({@link Rows#inputIndexes}). */
    abstract void apply(String key, long t, Row event, int[] inputs);

    /** A deleting event: every value of {@code key} leaves the store. */
    abstract void delete(String key);

    /** The batch's state written back to the store, and its rows. */
    abstract List<Row> finish();
  }
}
