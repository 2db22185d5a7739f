package streamstate.primitives;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.StructType;

import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/** What the primitives' processors do alike with rows: read a restored value, emit none, one or a change. */
final class Rows {
  /** Input column: true when the event deletes its key (a key's windows); spark_jobs/primitives/pipeline.py. */
  static final String DELETE_COLUMN = "_delete";

  private Rows() {}

  /** The fields of {@code schema}, read by name from {@code row} (a restored store row has more). */
  static Row select(Row row, StructType schema) {
    Object[] value = new Object[schema.size()];
    for (int i = 0; i < value.length; i++) {
      value[i] = row.getAs(schema.fields()[i].name());
    }
    return RowFactory.create(value);
  }

  /** A change row: the key, whether it is a tombstone, then the stored value (nulls for a tombstone). */
  static Row change(String key, boolean tombstone, Object[] value) {
    Object[] change = new Object[value.length + 2];
    change[0] = key;
    change[1] = tombstone;
    System.arraycopy(value, 0, change, 2, value.length);
    return RowFactory.create(change);
  }

  /** A group's input rows in offset order: the order they happened (one key's, or one partition's). */
  static List<Row> inOffsetOrder(Iterator<Row> rows) {
    List<Row> events = new ArrayList<>();
    while (rows.hasNext()) {
      events.add(rows.next());
    }
    if (!events.isEmpty()) {
      int offset = events.get(0).fieldIndex("offset");
      events.sort(Comparator.comparingLong(row -> row.getLong(offset)));
    }
    return events;
  }

  /** Where each of {@code count} aggregates' input column ({@link KeyedAggregate#INPUT_PREFIX}{@code i}) sits. */
  static int[] inputIndexes(List<Row> events, int count) {
    int[] inputs = new int[count];
    if (!events.isEmpty()) {
      for (int i = 0; i < count; i++) {
        inputs[i] = events.get(0).fieldIndex(KeyedAggregate.INPUT_PREFIX + i);
      }
    }
    return inputs;
  }

  static Iterator<Row> none() {
    return CollectionConverters.asScala(Collections.<Row>emptyIterator());
  }

  static Iterator<Row> one(Row row) {
    return CollectionConverters.asScala(Collections.singletonList(row).iterator());
  }
}
