package streamstate.primitives;

import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.types.StructType;

/**
 * A {@link PartitionTask} that aggregates its partition's events per key ({@link WindowedAggregate},
 * {@link SessionAggregate}, {@link ExpiringAggregate}): what those processors share of their declaration (the store's name, the
 * aggregates' names, types and {@link KeyedAggregate.Kind kinds}, the key and event-time columns, how wide
 * an output row is) and of their set-up (the stream time's state, then their own). Like a Kafka Streams
 * processor's {@code init}, a subclass only names the state it keeps ({@link #initStores}).
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
}
