package streamstate.primitives;

import java.util.List;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.types.StructType;

import scala.collection.Iterator;

/**
 * The table-table join primitive: two upsert topics read as tables and joined on their key, as Kafka
 * Streams' {@code KTable#join / leftJoin / outerJoin} does. A job declares it in Python
 * (spark_jobs/primitives/table_join.py), which decodes both topics and says which side a record is.
 *
 * <p>Rules, per key:
 * <ul>
 *   <li>the store holds both sides' latest rows: a side's records are applied in offset order (a key's
 *       records of one side all sit in one partition, its key's); a tombstone ({@link Rows#DELETE_COLUMN})
 *       removes that side's row;
 *   <li>per micro-batch: one change row per key the batch touched, with both sides as they now are (the
 *       {@code has_left} and {@code has_right} flags say which are present), or a tombstone once neither is.
 *       Which rows are the join's result (both sides, the left one, either) is the declaration's to say;
 *       the store is the same for every kind of join. Each change row also says which sides held the key
 *       before the batch, so that a key that had no result and still has none is not published. The stored value depends only on each side's latest
 *       row, so it does not depend on how the input was cut into micro-batches, nor on how the two topics'
 *       records interleave.
 * </ul>
 *
 * <p>Input columns: the key ({@code keyColumn}), {@code _right} (the record is the right table's),
 * {@code offset}, {@link Rows#DELETE_COLUMN}, {@code _left_row} and {@code _right_row} (the record's row, a
 * struct of its side's stored fields; null on the other side and on a tombstone). The store's value
 * ({@code stateDdl}): {@code has_left}, {@code has_right}, the left side's fields ({@code leftWidth} of
 * them), then the right side's. Output rows ({@code changeDdl}): key, tombstone, the value, {@code had_left},
 * {@code had_right}.
 */
public final class TableJoin {
  static final String RIGHT_COLUMN = "_right";
  static final String LEFT_ROW = "_left_row";
  static final String RIGHT_ROW = "_right_row";

  private TableJoin() {}

  /**
   * The store's change rows ({@code changeDdl}: key, tombstone, {@code stateDdl}) for {@code events} grouped by
   * {@code keyColumn}; {@code initial} (the restored store: key + value columns, or null) seeds it after a
   * restore. Rejected records among {@code events} pass through.
   */
  public static Dataset<Row> changes(Dataset<Row> events, String keyColumn, Dataset<Row> initial, String store,
                                     String stateDdl, int leftWidth, String changeDdl) {
    Joiner joiner = new Joiner(store, StructType.fromDDL(stateDdl), leftWidth);
    return KeyedValueProcessor.changes(events, events.schema(), keyColumn, initial, joiner, TimeMode.None(),
        StructType.fromDDL(changeDdl));
  }

  static final class Joiner extends KeyedValueProcessor {
    private final int leftWidth;

    Joiner(String store, StructType stateSchema, int leftWidth) {
      super(store, stateSchema);
      this.leftWidth = leftWidth;
    }

    @Override
    public Iterator<Row> handleInputRows(String key, Iterator<Row> rows, TimerValues timerValues) {
      List<Row> records = Rows.inOffsetOrder(rows);
      Object[] value = new Object[stateSchema.size()];
      value[0] = false;
      value[1] = false;
      Row before = stored.get();  // null: absent (one read: exists() is a read too)
      if (before != null) {
        for (int i = 0; i < value.length; i++) {
          value[i] = before.get(i);
        }
      }
      boolean existed = before != null;
      boolean hadLeft = (Boolean) value[0];
      boolean hadRight = (Boolean) value[1];
      for (Row record : records) {
        boolean right = record.<Boolean>getAs(RIGHT_COLUMN);
        boolean delete = Boolean.TRUE.equals(record.getAs(Rows.DELETE_COLUMN));
        Row row = delete ? null : record.getAs(right ? RIGHT_ROW : LEFT_ROW);
        int from = right ? 2 + leftWidth : 2;
        int width = right ? value.length - from : leftWidth;
        value[right ? 1 : 0] = row != null;
        for (int i = 0; i < width; i++) {
          value[from + i] = row == null ? null : row.get(i);
        }
      }
      if (!(Boolean) value[0] && !(Boolean) value[1]) {
        if (!existed) {
          return Rows.none();  // a delete of a key neither table holds: nothing changed
        }
        stored.clear();
        return Rows.one(withSidesBefore(Rows.change(key, true, new Object[value.length]), hadLeft, hadRight));
      }
      stored.update(RowFactory.create(value));
      return Rows.one(withSidesBefore(Rows.change(key, false, value), hadLeft, hadRight));
    }

    /** The change row, then which sides held the key before the batch ({@code had_left}, {@code had_right}). */
    private static Row withSidesBefore(Row change, boolean hadLeft, boolean hadRight) {
      Object[] row = new Object[change.size() + 2];
      for (int i = 0; i < change.size(); i++) {
        row[i] = change.get(i);
      }
      row[change.size()] = hadLeft;
      row[change.size() + 1] = hadRight;
      return RowFactory.create(row);
    }
  }
}
