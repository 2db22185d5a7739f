package streamstate.primitives;

import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.StructType;

import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

import streamstate.jobs.DeadLetters;

/**
 * The versioned primitive: per key, the latest version by event time, plus the versions within the
 * store's retention of it, so "what was the value at time t" has an answer (Kafka Streams'
 * {@code VersionedKeyValueStore}). A job declares it in Python (spark_jobs/primitives/versioned.py).
 *
 * <p>Input columns: the key and the stored value's fields but the last (by their stored names; one is the
 * version's time, one its id). The stored value: those fields of the latest version, then
 * {@code history}, the retained versions oldest first (the latest last), each a struct of the time field
 * followed by the other fields. A version is identified by its id: the same id again replaces it (a
 * replayed record changes nothing). Versions order by time, ties by id, so the answer never depends on
 * arrival order. An older version only enters the history; one older than what the retention keeps changes
 * nothing and emits nothing. The history keeps every version valid at some time within the retention
 * before the latest one.
 */
public final class VersionedLatest {
  private VersionedLatest() {}

  /**
   * The change stream of {@code events} grouped by {@code keyColumn}; {@code initial} (key + value
   * columns, or null) seeds the store after a restore. Rejected records among {@code events} pass through
   * (see {@link DeadLetters}).
   */
  public static Dataset<Row> changes(Dataset<Row> events, String keyColumn, Dataset<Row> initial, String store,
                                     String stateDdl, String changeDdl, long retentionMs, String timeField,
                                     String idField) {
    Latest latest = new Latest(store, StructType.fromDDL(stateDdl), retentionMs, timeField, idField);
    return KeyedValueProcessor.changes(events, events.schema(), keyColumn, initial, latest, TimeMode.None(),
        StructType.fromDDL(changeDdl));
  }

  static final class Latest extends KeyedValueProcessor {
    private final long retentionMs;
    /** The value's fields (all but history), by stored name; the version struct's field order. */
    private final String[] valueFields;
    private final String[] versionFields;
    private final int versionTime;
    private final int versionId;
    /** Where each value field sits in a version struct. */
    private final int[] valueInVersion;

    Latest(String store, StructType stateSchema, long retentionMs, String timeField, String idField) {
      super(store, stateSchema);
      this.retentionMs = retentionMs;
      String[] names = stateSchema.fieldNames();
      this.valueFields = java.util.Arrays.copyOf(names, names.length - 1);
      StructType version = (StructType) ((ArrayType) stateSchema.fields()[names.length - 1].dataType()).elementType();
      this.versionFields = version.fieldNames();
      this.versionTime = version.fieldIndex(timeField);
      this.versionId = version.fieldIndex(idField);
      this.valueInVersion = new int[valueFields.length];
      for (int i = 0; i < valueFields.length; i++) {
        valueInVersion[i] = version.fieldIndex(valueFields[i]);
      }
    }

    @Override
    public Iterator<Row> handleInputRows(String key, Iterator<Row> rows, TimerValues timerValues) {
      Row current = stored.get();  // null: absent (one read: exists() is a read too)
      Map<String, Row> versions = new LinkedHashMap<>();
      List<String> before = new ArrayList<>();
      if (current != null) {
        for (Row version : current.<Row>getList(valueFields.length)) {
          versions.put(version.getString(versionId), version);
          before.add(version.getString(versionId));
        }
      }
      while (rows.hasNext()) {
        Row event = rows.next();
        Object[] version = new Object[versionFields.length];
        for (int i = 0; i < versionFields.length; i++) {
          version[i] = event.getAs(versionFields[i]);
        }
        versions.put((String) version[versionId], RowFactory.create(version));
      }
      List<Row> history = new ArrayList<>(versions.values());
      history.sort(Comparator.<Row>comparingLong(v -> ((Timestamp) v.get(versionTime)).getTime())
          .thenComparing(v -> v.getString(versionId)));
      history = retained(history);
      List<String> after = new ArrayList<>();
      for (Row version : history) {
        after.add(version.getString(versionId));
      }
      if (after.equals(before)) {
        return Rows.none();  // only versions too old to keep
      }
      Row newest = history.get(history.size() - 1);
      Object[] value = new Object[valueFields.length + 1];
      for (int i = 0; i < valueFields.length; i++) {
        value[i] = newest.get(valueInVersion[i]);
      }
      value[valueFields.length] = CollectionConverters.asScala(history).toSeq();
      stored.update(RowFactory.create(value));
      return Rows.one(Rows.change(key, false, value));
    }

    /** The versions valid at some time within the retention before the latest: from the last one at or
     * before the cutoff (it answers for the cutoff itself) to the latest. */
    private List<Row> retained(List<Row> history) {
      long cutoff = ((Timestamp) history.get(history.size() - 1).get(versionTime)).getTime() - retentionMs;
      int first = 0;
      for (int i = 0; i < history.size(); i++) {
        if (((Timestamp) history.get(i).get(versionTime)).getTime() <= cutoff) {
          first = i;
        }
      }
      return new ArrayList<>(history.subList(first, history.size()));
    }

    @Override
    public Iterator<Row> handleExpiredTimer(String key, TimerValues timerValues, ExpiredTimerInfo info) {
      return Rows.none();
    }
  }
}
