package streamstate.primitives;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessorWithInitialState;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.StructType;

import streamstate.jobs.DeadLetters;

/**
 * A processor grouped by the event's <b>key</b> whose store holds one value per key ({@link KeyedAggregate},
 * {@link VersionedLatest}), the way a Kafka Streams processor over a key-value store is: what such processors
 * do alike with their declaration (the store's name and value schema), their state and a restore. The
 * partition-grouped processors share {@link PartitionTask} instead.
 *
 * <p>The store is one value state named after the store, of the value schema; a restored row (key and
 * value columns, and maybe more) seeds it with its value columns, read by name.
 */
abstract class KeyedValueProcessor extends StatefulProcessorWithInitialState<String, Row, Row, Row> {
  /** Initial-state column: the key a restored row seeds. */
  static final String INITIAL_KEY = "key";

  protected final String store;
  protected final StructType stateSchema;
  /** the key's stored value (absent: the store does not hold the key) */
  protected transient ValueState<Row> stored;

  protected KeyedValueProcessor(String store, StructType stateSchema) {
    this.store = store;
    this.stateSchema = stateSchema;
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    stored = getHandle().getValueState(store, Encoders.row(stateSchema), TTLConfig.NONE());
  }

  @Override
  public void handleInitialState(String key, Row initial, TimerValues timerValues) {
    stored.update(Rows.select(initial, stateSchema));
  }

  /**
   * The change rows ({@code change}) of {@code processor} over {@code input} grouped by {@code keyColumn},
   * in update mode; {@code initial} (key + value columns, or null) seeds the store after a restore.
   * {@code events} is the schema of the job's events: rejected records among them pass through (see
   * {@link DeadLetters}), also when {@code input} is those events already combined.
   */
  static Dataset<Row> changes(Dataset<Row> input, StructType events, String keyColumn, Dataset<Row> initial,
                              KeyedValueProcessor processor, TimeMode timeMode, StructType change) {
    KeyValueGroupedDataset<String, Row> grouped = Rows.byColumn(input, keyColumn);
    KeyValueGroupedDataset<String, Row> seeded = initial == null ? null : Rows.byColumn(initial, INITIAL_KEY);
    return DeadLetters.transform(grouped, events, processor, timeMode, OutputMode.Update(), change, seeded,
        initial == null ? null : initial.schema());
  }
}
