package streamstate.jobs;

import java.math.BigDecimal;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;

import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessorWithInitialState;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.StructType;

import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * purchase_counts' state logic in the JVM: the same store, the same change rows and the same rules as
 * the Python {@code PurchaseCounter} in spark_jobs/jobs/purchase_counts.py (a parity test runs both on
 * one input), without a Python-to-JVM round trip for every state read and write.
 *
 * <p>Per user: purchases, amount spent, last purchase time and the processing time of the last change
 * ({@code touched_at_ms}). {@code account_closed} deletes the user; a store with a TTL also deletes
 * users idle that long. Each micro-batch emits one change row per user it saw: the new value, or a
 * tombstone when the user's last event of the batch closed the account. The schemas come from the Python job (its DDL strings), so they are defined once.
 */
public final class PurchaseCounts {
  private PurchaseCounts() {}

  /**
   * The job's change stream: {@code events} (valid purchase events with {@code type}, {@code amount},
   * {@code event_time} and the Kafka {@code offset}) grouped by {@code keyColumn}, through the
   * processor; {@code initial} (key + value columns, or null) seeds the store after a restore. Rejected
   * records among {@code events} pass through (see {@link DeadLetters}).
   */
  public static Dataset<Row> changes(Dataset<Row> events, String keyColumn, Dataset<Row> initial,
                                     String store, String stateDdl, String changeDdl, long ttlMs) {
    StructType state = StructType.fromDDL(stateDdl);
    StructType change = StructType.fromDDL(changeDdl);
    KeyValueGroupedDataset<String, Row> grouped =
        events.groupByKey((MapFunction<Row, String>) row -> row.getAs(keyColumn), Encoders.STRING());
    Counter counter = new Counter(store, state, ttlMs);
    TimeMode timeMode = ttlMs > 0 ? TimeMode.ProcessingTime() : TimeMode.None();
    KeyValueGroupedDataset<String, Row> seeded = initial == null ? null
        : initial.groupByKey((MapFunction<Row, String>) row -> row.getAs("key"), Encoders.STRING());
    return DeadLetters.transform(grouped, events.schema(), counter, timeMode, OutputMode.Update(), change, seeded,
        initial == null ? null : initial.schema());
  }

  static final class Counter extends StatefulProcessorWithInitialState<String, Row, Row, Row> {
    private static final String ACCOUNT_CLOSED = "account_closed";

    private final String store;
    private final StructType stateSchema;
    private final long ttlMs;
    private transient ValueState<Row> counts;

    Counter(String store, StructType stateSchema, long ttlMs) {
      this.store = store;
      this.stateSchema = stateSchema;
      this.ttlMs = ttlMs;
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      counts = getHandle().getValueState(store, Encoders.row(stateSchema), TTLConfig.NONE());
    }

    @Override
    public Iterator<Row> handleInputRows(String user, Iterator<Row> rows, TimerValues timerValues) {
      List<Row> events = new ArrayList<>();
      while (rows.hasNext()) {
        events.add(rows.next());
      }
      // One user's events all sit in one source partition: offset order is the order they happened.
      events.sort(Comparator.comparingLong(row -> row.<Long>getAs("offset")));

      Row current = counts.exists() ? counts.get() : null;
      boolean existed = current != null;
      boolean alive = existed;  // handleInputRows has at least one row: it decides
      long purchases = existed ? current.getLong(0) : 0L;
      BigDecimal spent = existed ? current.getDecimal(1) : BigDecimal.ZERO;
      Timestamp last = existed ? current.getTimestamp(2) : null;
      for (Row event : events) {
        if (ACCOUNT_CLOSED.equals(event.getAs("type"))) {
          alive = false;
          purchases = 0L;
          spent = BigDecimal.ZERO;
          last = null;
        } else {
          alive = true;
          purchases += 1;
          spent = spent.add(event.<BigDecimal>getAs("amount"));
          Timestamp at = event.getAs("event_time");
          last = (last == null || (at != null && at.after(last))) ? at : last;
        }
      }
      if (alive) {
        long now = nowMs(timerValues);
        Row value = RowFactory.create(purchases, spent.setScale(2), last, now);
        counts.update(value);
        restartTtl(now);
        return one(RowFactory.create(user, false, purchases, spent.setScale(2), last, now));
      }
      // The batch ends with the user closed: a tombstone even when the store did not hold the user at
      // the start of the batch (created and closed inside it). The outputs may hold a row the store
      // never recorded (a batch whose outputs were written but not its changelog), and a delete the
      // input asked for must reach them, as a Kafka Streams aggregate forwards its tombstone.
      return one(delete(user));
    }

    @Override
    public Iterator<Row> handleExpiredTimer(String user, TimerValues timerValues, ExpiredTimerInfo info) {
      if (counts.exists()) {
        return one(delete(user));
      }
      return CollectionConverters.asScala(Collections.<Row>emptyIterator());
    }

    @Override
    public void handleInitialState(String user, Row initial, TimerValues timerValues) {
      Object[] value = new Object[stateSchema.size()];
      for (int i = 0; i < value.length; i++) {
        value[i] = initial.getAs(stateSchema.fields()[i].name());
      }
      counts.update(RowFactory.create(value));
      if (ttlMs > 0) {
        getHandle().registerTimer(initial.<Long>getAs("touched_at_ms") + ttlMs);
      }
    }

    private void restartTtl(long now) {
      if (ttlMs <= 0) {
        return;
      }
      deleteTimers();
      getHandle().registerTimer(now + ttlMs);
    }

    private Row delete(String user) {
      counts.clear();
      if (ttlMs > 0) {
        deleteTimers();
      }
      return RowFactory.create(user, true, null, null, null, null);
    }

    private void deleteTimers() {
      List<Long> deadlines = new ArrayList<>();
      Iterator<Object> timers = getHandle().listTimers();
      while (timers.hasNext()) {
        deadlines.add((Long) timers.next());
      }
      for (long deadline : deadlines) {
        getHandle().deleteTimer(deadline);
      }
    }

    private static long nowMs(TimerValues timerValues) {
      long now = timerValues.getCurrentProcessingTimeInMs();
      return now > 0 ? now : System.currentTimeMillis();
    }

    private static Iterator<Row> one(Row row) {
      return CollectionConverters.asScala(Collections.singletonList(row).iterator());
    }
  }
}
