package streamstate.primitives;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
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
    return sortedByOffset(events);
  }

  /** A two-topic group's input rows (one partition's of both topics) as two lists, each in offset order: the
   * rows whose boolean column {@code sideColumn} is false, then those where it is true. */
  static Sides sidesInOffsetOrder(Iterator<Row> rows, String sideColumn) {
    List<Row> first = new ArrayList<>();
    List<Row> second = new ArrayList<>();
    int side = -1;
    while (rows.hasNext()) {
      Row row = rows.next();
      if (side < 0) {
        side = row.fieldIndex(sideColumn);
      }
      (row.getBoolean(side) ? second : first).add(row);
    }
    return new Sides(sortedByOffset(first), sortedByOffset(second));
  }

  /** A group's input rows (one partition's of each of {@code inputs} topics) by input, each in offset order:
   * the rows whose int column {@code inputColumn} is 0, then 1, and so on. */
  static List<List<Row>> inputsInOffsetOrder(Iterator<Row> rows, String inputColumn, int inputs) {
    List<List<Row>> byInput = new ArrayList<>(inputs);
    for (int i = 0; i < inputs; i++) {
      byInput.add(new ArrayList<>());
    }
    int column = -1;
    while (rows.hasNext()) {
      Row row = rows.next();
      if (column < 0) {
        column = row.fieldIndex(inputColumn);
      }
      byInput.get(row.getInt(column)).add(row);
    }
    byInput.replaceAll(Rows::sortedByOffset);
    return byInput;
  }

  /** A two-topic group's rows by side, each in offset order: {@code sideColumn} false, then true. */
  record Sides(List<Row> unflagged, List<Row> flagged) {}

  /** {@code rows} sorted by offset, in place. Spark hands a group its rows in the order each topic partition
   * was read, so they usually are already: checked first, sorted only when they are not. */
  private static List<Row> sortedByOffset(List<Row> rows) {
    if (rows.isEmpty()) {
      return rows;
    }
    int offset = rows.get(0).fieldIndex("offset");
    for (int i = 1; i < rows.size(); i++) {
      if (rows.get(i - 1).getLong(offset) > rows.get(i).getLong(offset)) {
        rows.sort(Comparator.comparingLong(row -> row.getLong(offset)));
        break;
      }
    }
    return rows;
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

  /** {@code rows} grouped by their STRING column {@code column}. A {@code groupByKey} function would turn every
   * row into an object on its way to the shuffle only to read its key; grouping by the column reads it in
   * place. */
  static KeyValueGroupedDataset<String, Row> byColumn(Dataset<Row> rows, String column) {
    return grouped(rows, rows.col(column), Encoders.STRING());
  }

  /** {@code rows} grouped by {@code key}, named as {@code groupByKey} names its key: the key's value, encoder,
   * name and hash are those of a {@code groupByKey} by the same value. Checkpoints written when the processors
   * grouped with {@code groupByKey} were continued by this grouping with answers equal to the reference (checked
   * by hand for purchase_counts and recent_buyers, BENCHMARKS "Stream-table join: a profile, the JIT and the
   * processors' reads"). */
  static <K> KeyValueGroupedDataset<K, Row> grouped(Dataset<Row> rows, Column key, Encoder<K> keyEncoder) {
    return rows.groupBy(key.as(GROUPING_KEY)).as(keyEncoder, Encoders.row(rows.schema()));
  }

  /** The name {@code groupByKey} gives its key column (a flat encoder's). The name reaches the operator's Avro
   * schemas: a {@code UDF(partition)} name is refused as an illegal Avro name. */
  private static final String GROUPING_KEY = "value";

  static Iterator<Row> none() {
    return CollectionConverters.asScala(Collections.<Row>emptyIterator());
  }

  static Iterator<Row> one(Row row) {
    return CollectionConverters.asScala(Collections.singletonList(row).iterator());
  }

  /** A Scala sequence of {@code values}: an ARRAY column's value in a row Spark encodes. */
  static scala.collection.immutable.Seq<Object> seq(List<Object> values) {
    return CollectionConverters.asScala(values).toList();
  }

  /** Aggregates of {@code width} values each, stored as one ARRAY column per value (the state's columnar
   * layout): {@code rows}' i-th values, in order, for each i. */
  static List<List<Object>> columns(Iterable<Object[]> rows, int width) {
    List<List<Object>> columns = new ArrayList<>(width);
    for (int i = 0; i < width; i++) {
      columns.add(new ArrayList<>());
    }
    for (Object[] row : rows) {
      for (int i = 0; i < width; i++) {
        columns.get(i).add(row[i]);
      }
    }
    return columns;
  }

  /** The ARRAY columns {@code first}, {@code first + 1}, ... of {@code row}, {@code width} of them. */
  static List<List<Object>> columnsOf(Row row, int first, int width) {
    List<List<Object>> columns = new ArrayList<>(width);
    for (int i = 0; i < width; i++) {
      columns.add(row.getList(first + i));
    }
    return columns;
  }

  /** The {@code index}-th values of {@code columns} ({@link #columns}' inverse). */
  static Object[] valuesAt(List<List<Object>> columns, int index) {
    Object[] values = new Object[columns.size()];
    for (int i = 0; i < values.length; i++) {
      values[i] = columns.get(i).get(index);
    }
    return values;
  }
}
