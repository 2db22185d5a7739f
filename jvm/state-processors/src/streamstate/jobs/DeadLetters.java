package streamstate.jobs;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessorWithInitialState;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.types.StructType;

import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Rejected input records ride through a job's processor to its sink, so that one streaming query reads
 * and classifies the input once and writes both the outputs and the dead letters of each micro-batch
 * (spark_jobs/io/dead_letter.py builds the column; JobContext.state_change_sink writes it).
 *
 * <p>An input row whose {@link #COLUMN} is not null is a rejected record: the processor never sees it,
 * and it leaves as one output row with the processor's columns null and {@link #COLUMN} set. The
 * processor's own rows leave with {@link #COLUMN} null. Input without the column runs the processor as is.
 */
public final class DeadLetters {
  /** The dead-letter record (key, value, headers) of a rejected input row; null on a valid one. */
  public static final String COLUMN = "_dead_letter";

  private DeadLetters() {}

  /**
   * {@code processor} over {@code grouped} (seeded with {@code seeded}, or null), its rows in
   * {@code output}; with {@link #COLUMN} passed through when {@code events} have it.
   */
  public static <K> Dataset<Row> transform(KeyValueGroupedDataset<K, Row> grouped, StructType events,
                                    StatefulProcessorWithInitialState<K, Row, Row, Row> processor,
                                    TimeMode timeMode, OutputMode outputMode, StructType output,
                                    KeyValueGroupedDataset<K, Row> seeded, StructType seededSchema) {
    StatefulProcessorWithInitialState<K, Row, Row, Row> run = processor;
    StructType rows = output;
    if (java.util.Arrays.asList(events.fieldNames()).contains(COLUMN)) {
      run = new PassThrough<>(processor, output.size());
      rows = output.add(events.apply(COLUMN));
    }
    if (seeded == null) {
      return grouped.transformWithState(run, timeMode, outputMode, Encoders.row(rows));
    }
    return grouped.transformWithState(run, timeMode, outputMode, seeded, Encoders.row(rows),
        Encoders.row(seededSchema));
  }

  /** The processor, with rejected rows set aside and passed on (see the class comment). */
  static final class PassThrough<K> extends StatefulProcessorWithInitialState<K, Row, Row, Row> {
    private final StatefulProcessorWithInitialState<K, Row, Row, Row> inner;
    private final int width;

    PassThrough(StatefulProcessorWithInitialState<K, Row, Row, Row> inner, int width) {
      this.inner = inner;
      this.width = width;
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      inner.setHandle(getHandle());
      inner.init(outputMode, timeMode);
    }

    @Override
    public Iterator<Row> handleInputRows(K key, Iterator<Row> rows, TimerValues timerValues) {
      List<Row> valid = new ArrayList<>();
      List<Row> out = new ArrayList<>();
      while (rows.hasNext()) {
        Row row = rows.next();
        Object letter = row.getAs(COLUMN);
        if (letter == null) {
          valid.add(row);
        } else {
          out.add(widen(null, letter));
        }
      }
      if (!valid.isEmpty()) {  // a processor is only ever called with input (its rules may rely on it)
        Iterator<Row> changes = inner.handleInputRows(key, CollectionConverters.asScala(valid.iterator()), timerValues);
        while (changes.hasNext()) {
          out.add(widen(changes.next(), null));
        }
      }
      return CollectionConverters.asScala(out.iterator());
    }

    @Override
    public Iterator<Row> handleExpiredTimer(K key, TimerValues timerValues, ExpiredTimerInfo info) {
      Iterator<Row> changes = inner.handleExpiredTimer(key, timerValues, info);
      List<Row> out = new ArrayList<>();
      while (changes.hasNext()) {
        out.add(widen(changes.next(), null));
      }
      return CollectionConverters.asScala(out.iterator());
    }

    @Override
    public void handleInitialState(K key, Row initialState, TimerValues timerValues) {
      inner.handleInitialState(key, initialState, timerValues);
    }

    @Override
    public void close() {
      inner.close();
    }

    private Row widen(Row change, Object letter) {
      return DeadLetters.widen(change, letter, width);
    }
  }

  /** A processor's row of {@code width} columns (or all nulls) followed by the dead letter (or null). */
  public static Row widen(Row change, Object letter, int width) {
    Object[] values = new Object[width + 1];
    for (int i = 0; change != null && i < width; i++) {
      values[i] = change.get(i);
    }
    values[width] = letter;
    return RowFactory.create(values);
  }
}
