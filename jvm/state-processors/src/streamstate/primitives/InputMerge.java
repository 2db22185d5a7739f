package streamstate.primitives;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;
import java.util.Set;
import java.util.function.BiConsumer;
import java.util.function.Consumer;
import java.util.function.Function;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.internal.SQLConf;

/**
 * The two inputs of a join's task (a partition of both topics) taken in timestamp order <b>across
 * micro-batches</b>, as a Kafka Streams task takes its partitions' records (its {@code PartitionGroup}, with
 * {@code max.task.idle.ms = 0}, KIP-695). The rules, per task:
 * <ol>
 *   <li><b>Each input in offset order.</b> An input's records left waiting by earlier micro-batches come first,
 *       then the batch's, each in offset order.
 *   <li><b>The smaller time first.</b> The next record is the head of the input whose head has the smaller
 *       time; on a tie, the head of the input <i>not</i> taken last (the first input's when none was taken yet):
 *       Kafka Streams re-queues the partition it just took behind the other one of the same time.
 *   <li><b>An input that runs out.</b> When one input has no more records in the batch but records are written
 *       beyond the batch (it is <i>lagging</i>: the micro-batch was cut, by a rate limit, before its end), the
 *       other input's remaining records <b>wait</b>: they are kept in the task's store (changelogged, snapshotted
 *       and restored as any entry) and come first in the next micro-batch. When the input that ran out is caught
 *       up (nothing more written), the other's records go on: nothing waits for records not yet written.
 * </ol>
 * So a task takes its records in the same order however its input is cut into micro-batches, and that order is
 * a Kafka Streams task's. Which inputs are lagging is the driver's reading, made once per micro-batch before
 * it runs and kept with the checkpoint (a replayed batch reads the same: spark_jobs/state/input_lag.py), handed
 * to the tasks as the session setting {@link #LAGGING_CONF}.
 */
final class InputMerge {
  /** The session setting naming the lagging inputs of a micro-batch: {@code <input>:<partition>} pairs, comma
   * separated ({@code 0} the job's source, {@code 1} its join topic); empty or absent: none. */
  static final String LAGGING_CONF = "spark.streamstate.inputs.lagging";

  private InputMerge() {}

  /** One input record of a task: which input ({@code second}), its time, offset, key, whether it is a table's
   * tombstone ({@code delete}) and its fields ({@code row}). */
  record Input(boolean second, long time, long offset, String key, boolean delete, Row row) {
    static final Comparator<Input> OFFSET_ORDER = Comparator.comparingLong(Input::offset);
  }

  /** Where a merge ended: the input taken last (null: none yet), and each input's records that wait. */
  record Outcome(Boolean secondTakenLast, List<Input> firstWaiting, List<Input> secondWaiting) {}

  /**
   * Take {@code first} and {@code second} (each in offset order, its waiting records first) by the rules above,
   * passing each taken record to {@code take}; {@code secondTakenLast}: the input the task took last before this
   * batch (null: none). {@code firstLagging} / {@code secondLagging}: records of that input are written beyond
   * the batch.
   */
  static Outcome merge(List<Input> first, List<Input> second, boolean firstLagging, boolean secondLagging,
                       Boolean secondTakenLast, Consumer<Input> take) {
    int f = 0;
    int s = 0;
    Boolean last = secondTakenLast;
    while (f < first.size() || s < second.size()) {
      boolean takeSecond;
      if (f == first.size()) {
        if (firstLagging) {
          break;  // the first input has records still to read: the second's wait for them
        }
        takeSecond = true;
      } else if (s == second.size()) {
        if (secondLagging) {
          break;
        }
        takeSecond = false;
      } else {
        long ft = first.get(f).time();
        long st = second.get(s).time();
        takeSecond = st < ft || (st == ft && Boolean.FALSE.equals(last));
      }
      take.accept(takeSecond ? second.get(s++) : first.get(f++));
      last = takeSecond;
    }
    return new Outcome(last, rest(first, f), rest(second, s));
  }

  private static List<Input> rest(List<Input> records, int from) {
    return from == records.size() ? Collections.emptyList() : new ArrayList<>(records.subList(from, records.size()));
  }

  /** {@code waiting} (in any order) then {@code batch} (in offset order): one input's records in offset order. */
  static List<Input> waitingFirst(List<Input> waiting, List<Input> batch) {
    if (waiting.isEmpty()) {
      return batch;
    }
    List<Input> all = new ArrayList<>(waiting);
    all.sort(Input.OFFSET_ORDER);
    all.addAll(batch);
    return all;
  }

  /** Whether input {@code input} of source partition {@code partition} is lagging in the running micro-batch
   * ({@link #LAGGING_CONF}, read from the task's session settings). */
  static boolean lagging(int input, int partition) {
    String pairs = SQLConf.get().getConfString(LAGGING_CONF, "");
    if (pairs.isEmpty()) {
      return false;
    }
    String wanted = input + ":" + partition;
    for (String pair : pairs.split(",")) {
      if (pair.equals(wanted)) {
        return true;
      }
    }
    return false;
  }

  /**
   * Keep a merge's waiting records in the task's store: {@code stored} is every waiting entry's key as the
   * batch began ({@code keyOf} names a record's entry). A record still waiting that was not stored yet is
   * passed to {@code added} (to store and changelog it); an entry of {@code stored} no longer waiting was
   * taken by this batch and is passed to {@code taken} (to delete it and changelog its tombstone). A record
   * that waits on keeps its entry: nothing is written for it. {@code stored} is emptied.
   */
  static void keepWaiting(Outcome outcome, Set<String> stored, Function<Input, String> keyOf,
                          BiConsumer<String, Input> added, Consumer<String> taken) {
    for (List<Input> still : List.of(outcome.firstWaiting(), outcome.secondWaiting())) {
      for (Input record : still) {
        String key = keyOf.apply(record);
        if (!stored.remove(key)) {
          added.accept(key, record);
        }
      }
    }
    stored.forEach(taken);
    stored.clear();
  }
}
