package streamstate.primitives;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.PriorityQueue;
import java.util.TreeMap;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.collection.Iterator;

import streamstate.jobs.DeadLetters;

/**
 * The session windows primitive: per key, aggregates ({@link KeyedAggregate.Kind}: count, sum, min, max,
 * latest) of the events of each of its sessions, with Kafka Streams' {@code SessionWindows
 * .ofInactivityGapAndGrace(gap, grace)} semantics ({@code KStreamSessionWindowAggregate}) record by record,
 * and {@code suppress(untilWindowCloses)} or every update. A job declares it in Python
 * (spark_jobs/primitives/sessions.py; user_sessions is one).
 *
 * <p>Like {@link WindowedAggregate} the processor is keyed by source partition ({@link PartitionTask}) and
 * <b>stream time</b> is the partition's largest event time so far, advanced by each record before it is
 * applied. The rules, per record:
 *
 * <ul>
 *   <li>a session is [start, end], its first and last event times (both inclusive);
 *   <li>stream time moves to the record's time; every session of the partition whose end + gap + grace it
 *       reached <b>closes</b> (with {@code emit=close} it is emitted: Kafka Streams' suppress buffer
 *       emits a session once its end is at most stream time - (gap + grace)); a closed session whose end +
 *       retention it reached is <b>evicted</b> (a tombstone);
 *   <li>an event at t <b>merges</b> every session of its key still in the store whose [start - gap, end +
 *       gap] holds t, closed ones included (Kafka Streams' {@code findSessions(key, t - gap, t + gap)}):
 *       the merged session spans them all and t, its values are theirs merged (in start order, with
 *       {@link KeyedAggregate.Kind#apply}) then the event applied; the sessions it replaces leave the store
 *       (with {@code emit=update}, their rows leave the outputs: Kafka Streams forwards tombstones);
 *   <li>an event whose merged session's end + gap + grace is before stream time is <b>late</b>
 *       ({@code mergedEnd < streamTime - grace - gap}, Kafka Streams' expired-window rule): nothing changes
 *       and a late row says so (the job dead-letters it);
 *   <li>a merged session already due to close closes at once;
 *   <li>a deleting event ({@link Rows#DELETE_COLUMN}) removes every session of its key: with
 *       {@code emit=update} the open ones leave the outputs, closed ones stay (as windows do).
 * </ul>
 *
 * <p>Output rows: {@code change} rows are the store's changes (a session's latest state in the batch, or a
 * tombstone; one row per partition whose stream time moved, key null), for the changelog; {@code emit} rows
 * are the outputs' changes in the order they happened, the last per session in the batch ({@code tombstone}:
 * the session's row leaves the outputs); {@code late} rows are refused events.
 */
public final class SessionAggregate {
  private SessionAggregate() {}

  static final String CHANGE = "change";
  static final String EMIT = "emit";
  static final String LATE = "late";

  /** The restored-state row schema {@link #changes} expects: one row per key (its sessions) and one per
   * partition's stream time (key null), for the values {@code valuesDdl}. */
  public static String initialDdl(String valuesDdl) {
    return "source_partition INT, key STRING, sessions ARRAY<STRUCT<session_start_ms BIGINT, "
        + "session_end_ms BIGINT, closed BOOLEAN, reopened BOOLEAN, " + valuesDdl + ">>, stream_time_ms BIGINT";
  }

  /**
   * The processor's rows ({@code outputDdl}: store changes, output changes, stream times, late events) for
   * {@code events} grouped by {@code partitionColumn}; {@code initial} ({@link #initialDdl}, or null) seeds
   * the store. {@code emitOnUpdate}: outputs change on every update (else once per session, on close).
   * Rejected records among {@code events} pass through (see {@link DeadLetters}).
   */
  public static Dataset<Row> changes(Dataset<Row> events, String partitionColumn, Dataset<Row> initial,
                                     String store, String outputDdl, String valuesDdl, String kinds, long gapMs,
                                     long graceMs, long retentionMs, boolean emitOnUpdate, String keyColumn,
                                     String timeColumn) {
    StructType output = StructType.fromDDL(outputDdl);
    StructType values = StructType.fromDDL(valuesDdl);
    Sessions sessions = new Sessions(store, values, KeyedAggregate.Kind.parse(kinds, values.size()), gapMs, graceMs,
        retentionMs, emitOnUpdate, output.size(), keyColumn, timeColumn);
    return PartitionTask.changes(events, partitionColumn, initial, sessions, OutputMode.Append(), output);
  }

  /** A session of a key: [start, end] inclusive, its values (changed in place only while the session is
   * open and extended from its own start; a merge or the extension of a closed one makes a new session),
   * whether it closed, and whether it is <b>reopened</b>: it merged a session that had closed (and,
   * on close, was emitted), or a reopened one. Only a reopened session can be emitted at a start the outputs
   * already hold; the others are new rows there (the job appends them instead of merging). */
  private static final class Session {
    final long start;
    long end;
    final Object[] aggregates;
    boolean closed;
    final boolean reopened;
    /** the time of the batch queue's live entry for this session's key and start ({@link Long#MAX_VALUE}:
     * none): a session replacing one of the same start takes its entry over */
    long queuedAt = Long.MAX_VALUE;
    /** whether the batch's changes hold this session's key and start already */
    boolean recorded;

    Session(long start, long end, Object[] aggregates, boolean closed, boolean reopened) {
      this.start = start;
      this.end = end;
      this.aggregates = aggregates;
      this.closed = closed;
      this.reopened = reopened;
    }
  }

  /** A key's sessions in a batch's cache, by start; whether the store held the key when the batch read it,
   * and whether the batch changed them (only changed keys are written back). */
  private static final class KeySessions {
    final String key;
    final TreeMap<Long, Session> byStart;
    final boolean stored;
    boolean changed;

    KeySessions(String key, TreeMap<Long, Session> byStart, boolean stored) {
      this.key = key;
      this.byStart = byStart;
      this.stored = stored;
    }
  }

  /** A session of a key, by start: what a change row is about. */
  private record SessionKey(String key, long start) {}

  /** When the session of {@code keySessions} starting at {@code start} needs a look (its close or eviction):
   * an entry of a batch's queue, live while that session's {@link Session#queuedAt} is {@code at}. A
   * session extended in place (same start) keeps the entry: when it comes due before the session does, it
   * is put back at the session's due time (one entry per session and step, not one per event). */
  private record Due(long at, KeySessions keySessions, long start) implements Comparable<Due> {
    @Override
    public int compareTo(Due other) {
      return Long.compare(at, other.at);
    }
  }

  static final class Sessions extends AggregateTask {
    private final StructType storedSchema;
    /** a fresh session's values ({@link KeyedAggregate.Kind#fresh}: immutable, copied per session) */
    private final Object[] freshValues;
    private final long gapMs;
    private final long graceMs;
    private final long retentionMs;
    private final boolean emitOnUpdate;
    private transient ValueState<Long> nextDueAt;
    /** key -> its sessions (starts, ends, closed flags, then each value's array) */
    private transient MapState<String, Row> sessions;

    Sessions(String store, StructType values, KeyedAggregate.Kind[] kinds, long gapMs, long graceMs,
             long retentionMs, boolean emitOnUpdate, int outputWidth, String keyColumn, String timeColumn) {
      super(store, values, kinds, outputWidth, keyColumn, timeColumn);
      this.gapMs = gapMs;
      this.graceMs = graceMs;
      this.retentionMs = retentionMs;
      this.emitOnUpdate = emitOnUpdate;
      StructType stored = new StructType()
          .add("starts", DataTypes.createArrayType(DataTypes.LongType))
          .add("ends", DataTypes.createArrayType(DataTypes.LongType))
          .add("closed", DataTypes.createArrayType(DataTypes.BooleanType))
          .add("reopened", DataTypes.createArrayType(DataTypes.BooleanType));
      for (StructField field : values.fields()) {
        stored = stored.add(field.name(), DataTypes.createArrayType(field.dataType()));
      }
      this.storedSchema = stored;
      this.freshValues = KeyedAggregate.Kind.fresh(kinds, values);
    }

    @Override
    protected void initStores() {
      nextDueAt = getHandle().getValueState(store + "-next-due", Encoders.LONG(), TTLConfig.NONE());
      sessions = getHandle().getMapState(store + "-sessions", Encoders.STRING(), Encoders.row(storedSchema),
          TTLConfig.NONE());
    }

    // -- the session rules ---------------------------------------------------------------------
    long closesAt(Session session) {
      return session.end + gapMs + graceMs;
    }

    long evictedAt(Session session) {
      return session.end + retentionMs;
    }

    /** When {@code session} next needs a look: its close, or once closed its eviction. */
    long dueAt(Session session) {
      return session.closed ? evictedAt(session) : closesAt(session);
    }

    // -- Spark's callbacks ---------------------------------------------------------------------
    @Override
    protected Batch newBatch(int partition) {
      return new Batch(partition);
    }

    @Override
    protected void restoreKey(String key, Row initial) {
      TreeMap<Long, Session> restored = new TreeMap<>();
      long due = nextDueAt.exists() ? nextDueAt.get() : Long.MAX_VALUE;
      for (Row row : initial.<Row>getList(initial.fieldIndex("sessions"))) {
        Object[] aggregates = new Object[kinds.length];
        for (int i = 0; i < kinds.length; i++) {
          aggregates[i] = row.get(i + 4);
        }
        Session session = new Session(row.getLong(0), row.getLong(1), aggregates, row.getBoolean(2),
            Boolean.TRUE.equals(row.get(3)));
        restored.put(session.start, session);
        due = Math.min(due, dueAt(session));
      }
      if (!restored.isEmpty()) {
        sessions.updateValue(key, storedRow(restored));
        nextDueAt.update(due);
      }
    }

    /** One micro-batch of one partition: the keys it touched cached, the changed ones written back once at
     * its end. */
    private final class Batch extends EventBatch {
      final Map<String, KeySessions> cache = new HashMap<>();
      /** each changed session, in the order first changed (its latest state in the store is the cache's at
       * the batch's end: every change of a key's sessions is recorded here) */
      final LinkedHashSet<SessionKey> changes = new LinkedHashSet<>();
      /** each session's latest change of the outputs (null: its row leaves them), in the order first changed */
      final Map<SessionKey, Session> emits = new LinkedHashMap<>();
      /** the earliest close or eviction of the partition's sessions ({@link Long#MAX_VALUE}: none); at most
       * that (a queue entry put back later may be earlier than any session's due time) */
      private long dueAt;
      /** once every key is in the cache ({@link #closeAndEvictDue}): the sessions' due times, so a close
       * looks at the sessions due, not at every key (sessions close at any time, not on window bounds) */
      private PriorityQueue<Due> queue;

      Batch(int partition) {
        super(partition);
        dueAt = nextDueAt.exists() ? nextDueAt.get() : Long.MAX_VALUE;
      }

      @Override
      protected void onAdvance() {
        if (dueAt <= now) {
          closeAndEvictDue();
        }
      }

      /** The event at {@code t} merged with its key's sessions within the gap, or refused as late. */
      @Override
      void apply(String key, long t, Row event, int[] inputs) {
        KeySessions keySessions = sessionsOf(key);
        Session first = null;
        List<Session> merged = null;
        long start = t;
        long end = t;
        boolean reopened = false;
        for (Session session : keySessions.byStart.values()) {  // in start order
          if (session.start > t + gapMs) {
            break;
          }
          if (session.end >= t - gapMs) {
            if (first == null) {
              first = session;
            } else {
              if (merged == null) {
                merged = new ArrayList<>(4);
                merged.add(first);
              }
              merged.add(session);
            }
            start = Math.min(start, session.start);
            end = Math.max(end, session.end);
            reopened |= session.closed || session.reopened;
          }
        }
        if (end + gapMs + graceMs < now) {
          out.add(output(LATE, false, key, start, end, null, null, null, partition, now, event.getAs("offset"),
              event.getAs("timestamp"), event.getAs("value")));
          return;
        }
        keySessions.changed = true;
        if (first != null && merged == null && first.start == start && !first.closed) {
          // an open session extended from its own start: changed in place (no output holds it as it was)
          Object[] aggregates = first.aggregates;
          for (int i = 0; i < kinds.length; i++) {
            if (aggregates[i] == null) {
              aggregates[i] = freshValues[i];  // as merging it into fresh values would
            }
          }
          KeyedAggregate.Kind.applyAll(kinds, aggregates, event, inputs);
          first.end = end;
          changed(key, first);
          if (emitOnUpdate) {
            emits.put(new SessionKey(key, start), first);
          }
          due(keySessions, first);
        } else {
          Object[] aggregates = freshValues.clone();
          long queuedAt = Long.MAX_VALUE;
          for (Session session : merged != null ? merged : first != null ? List.of(first) : List.<Session>of()) {
            for (int i = 0; i < kinds.length; i++) {
              aggregates[i] = kinds[i].apply(aggregates[i], session.aggregates[i]);
            }
            keySessions.byStart.remove(session.start);
            if (session.start == start) {
              queuedAt = session.queuedAt;  // the merged session starts there: it takes the queue entry over
            }
            changed(key, session);
            if (emitOnUpdate) {
              emits.put(new SessionKey(key, session.start), null);
            }
          }
          KeyedAggregate.Kind.applyAll(kinds, aggregates, event, inputs);
          Session session = new Session(start, end, aggregates, false, reopened);
          session.queuedAt = queuedAt;
          keySessions.byStart.put(start, session);
          changed(key, session);
          if (emitOnUpdate) {
            emits.put(new SessionKey(key, start), session);
          }
          due(keySessions, session);
        }
        if (dueAt <= now) {  // merged into a session already due (grace 0, or an extension at the boundary)
          closeAndEvictDue();
        }
      }

      /** The session of {@code key} at {@code session}'s start changed (or left the store). */
      private void changed(String key, Session session) {
        if (!session.recorded) {
          changes.add(new SessionKey(key, session.start));
          session.recorded = true;
        }
      }

      /** Remove every session of {@code key}; with emit=update the open ones' rows leave the outputs. */
      @Override
      void delete(String key) {
        KeySessions keySessions = sessionsOf(key);
        for (Session session : keySessions.byStart.values()) {
          changed(key, session);
          if (emitOnUpdate && !session.closed) {
            emits.put(new SessionKey(key, session.start), null);
          }
        }
        if (!keySessions.byStart.isEmpty()) {
          keySessions.byStart.clear();
          keySessions.changed = true;
        }
      }

      /** {@code session} of {@code keySessions} is new or closed: when it is next due (queued unless an
       * entry for its start comes no later). */
      private void due(KeySessions keySessions, Session session) {
        long at = dueAt(session);
        dueAt = Math.min(dueAt, at);
        if (queue != null && session.queuedAt > at) {
          queue.add(new Due(at, keySessions, session.start));
          session.queuedAt = at;
        }
      }

      /** Close every session of the partition due at the current stream time and evict every closed one
       * whose retention passed. The first such step of a batch reads every key's sessions into the cache
       * and queues them by due time; later steps take the due ones off the queue. */
      private void closeAndEvictDue() {
        if (queue == null) {
          Iterator<Tuple2<String, Row>> entries = sessions.iterator();
          while (entries.hasNext()) {
            Tuple2<String, Row> entry = entries.next();
            cache.computeIfAbsent(entry._1(), k -> new KeySessions(k, storedSessions(entry._2()), true));
          }
          List<Due> all = new ArrayList<>();
          for (KeySessions keySessions : cache.values()) {
            for (Session session : keySessions.byStart.values()) {
              session.queuedAt = dueAt(session);
              all.add(new Due(session.queuedAt, keySessions, session.start));
            }
          }
          queue = new PriorityQueue<>(all);  // heapified at once
        }
        while (!queue.isEmpty() && queue.peek().at() <= now) {
          Due due = queue.poll();
          KeySessions keySessions = due.keySessions();
          Session session = keySessions.byStart.get(due.start());
          if (session == null || session.queuedAt != due.at()) {
            continue;  // stale: merged away or deleted, or queued again
          }
          session.queuedAt = Long.MAX_VALUE;
          if (dueAt(session) > now) {
            due(keySessions, session);  // extended since it was queued: put back at its due time
            continue;
          }
          keySessions.changed = true;
          changed(keySessions.key, session);
          if (!session.closed) {
            session.closed = true;
            if (!emitOnUpdate) {
              emits.put(new SessionKey(keySessions.key, session.start), session);
            }
            due(keySessions, session);
          } else {
            keySessions.byStart.remove(session.start);
          }
        }
        dueAt = queue.isEmpty() ? Long.MAX_VALUE : queue.peek().at();
      }

      private KeySessions sessionsOf(String key) {
        KeySessions keySessions = cache.get(key);
        if (keySessions == null) {
          Row stored = sessions.getValue(key);  // null: no sessions
          keySessions = new KeySessions(key, storedSessions(stored), stored != null);
          cache.put(key, keySessions);
        }
        return keySessions;
      }

      @Override
      List<Row> finish() {
        for (SessionKey id : changes) {
          out.add(changeRow(CHANGE, id, cache.get(id.key()).byStart.get(id.start())));
        }
        for (KeySessions keySessions : cache.values()) {
          if (!keySessions.changed) {
            continue;  // read (every key is, once a close is due) but unchanged: the store has it
          }
          if (!keySessions.byStart.isEmpty()) {
            sessions.updateValue(keySessions.key, storedRow(keySessions.byStart));
          } else if (keySessions.stored) {
            sessions.removeKey(keySessions.key);
          }
        }
        cache.clear();
        if (dueAt == Long.MAX_VALUE) {
          nextDueAt.clear();
        } else {
          nextDueAt.update(dueAt);
        }
        for (Map.Entry<SessionKey, Session> entry : emits.entrySet()) {
          out.add(changeRow(EMIT, entry.getKey(), entry.getValue()));
        }
        if (saveStreamTime()) {
          out.add(output(CHANGE, false, null, null, null, null, null, null, partition, now, null, null, null));
        }
        return out;
      }

      private Row changeRow(String kind, SessionKey id, Session session) {
        return session == null
            ? output(kind, true, id.key(), id.start(), null, null, null, null, partition, null, null, null, null)
            : output(kind, false, id.key(), id.start(), session.end, session.aggregates, session.closed,
                session.reopened, partition, null, null, null, null);
      }
    }

    /** A key's sessions as its stored row ({@link #storedSchema}, or null: none) holds them. */
    private TreeMap<Long, Session> storedSessions(Row row) {
      TreeMap<Long, Session> restored = new TreeMap<>();
      if (row != null) {
        List<Long> starts = row.getList(0);
        List<Long> ends = row.getList(1);
        List<Boolean> closed = row.getList(2);
        List<Boolean> reopened = row.getList(3);
        List<List<Object>> values = Rows.columnsOf(row, 4, kinds.length);
        for (int s = 0; s < starts.size(); s++) {
          restored.put(starts.get(s), new Session(starts.get(s), ends.get(s), Rows.valuesAt(values, s),
              closed.get(s), reopened.get(s)));
        }
      }
      return restored;
    }

    private Row storedRow(TreeMap<Long, Session> keySessions) {
      List<Object> starts = new ArrayList<>();
      List<Object> ends = new ArrayList<>();
      List<Object> closed = new ArrayList<>();
      List<Object> reopened = new ArrayList<>();
      List<Object[]> aggregates = new ArrayList<>(keySessions.size());
      for (Session session : keySessions.values()) {
        starts.add(session.start);
        ends.add(session.end);
        closed.add(session.closed);
        reopened.add(session.reopened);
        aggregates.add(session.aggregates);
      }
      Object[] columns = new Object[kinds.length + 4];
      columns[0] = Rows.seq(starts);
      columns[1] = Rows.seq(ends);
      columns[2] = Rows.seq(closed);
      columns[3] = Rows.seq(reopened);
      List<List<Object>> values = Rows.columns(aggregates, kinds.length);
      for (int i = 0; i < kinds.length; i++) {
        columns[i + 4] = Rows.seq(values.get(i));
      }
      return RowFactory.create(columns);
    }

    /** An output row: kind, tombstone, key, session_start_ms, session_end_ms, the values, closed, reopened,
     * source_partition, stream_time_ms, source_offset, source_timestamp, raw. */
    private Row output(String kind, boolean tombstone, String key, Long start, Long end, Object[] aggregates,
                       Boolean isClosed, Boolean reopened, Integer partition, Long streamTimeMs, Object offset,
                       Object timestamp, Object raw) {
      Object[] row = outputFields(5 + kinds.length + 7);
      row[0] = kind;
      row[1] = tombstone;
      row[2] = key;
      row[3] = start;
      row[4] = end;
      if (aggregates != null) {
        System.arraycopy(aggregates, 0, row, 5, kinds.length);
      }
      Object[] rest = {isClosed, reopened, partition, streamTimeMs, offset, timestamp, raw};
      System.arraycopy(rest, 0, row, 5 + kinds.length, rest.length);
      return RowFactory.create(row);
    }
  }
}
