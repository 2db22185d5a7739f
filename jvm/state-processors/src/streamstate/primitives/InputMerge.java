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
 * The inputs of a join's task (a partition of each of its topics) taken in timestamp order <b>across
 * micro-batches</b>, as a Kafka Streams task takes its partitions' records (its {@code PartitionGroup}, with
 * {@code max.task.idle.ms = 0}, KIP-695). The rules, per task:
 * <ol>
 *   <li><b>Each input in offset order.</b> An input's records left waiting by earlier micro-batches come first,
 *       then the batch's, each in offset order.
 *   <li><b>The smallest time first.</b> The next record is the head of the input whose head has the smallest
 *       time; on a tie, the head of the tied input <i>taken least recently</i> (an input never taken counts as
 *       taken before any other, the first of them first). With two inputs that is the input not taken last (the
 *       first input's when none was taken yet): Kafka Streams re-queues the partition it just took behind the
 *       other one of the same time. With more, Kafka Streams' order of equal heads is its priority queue's
 *       (a binary heap's, which does not go round; and it depends on when its buffers ran empty): this rule is
 *       the deterministic one closest to it, and a known difference only between records of equal times.
 *   <li><b>An input that runs out.</b> When one input has no more records in the batch but records are written
 *       beyond the batch (it is <i>lagging</i>: the micro-batch was cut, by a rate limit, before its end), the
 *       other inputs' remaining records <b>wait</b>: they are kept in the task's store (changelogged,
 *       snapshotted and restored as any entry) and come first in the next micro-batch. When the input that ran
 *       out is caught up (nothing more written), the others go on: nothing waits for records not yet written.
 * </ol>
 * So a task takes its records in the same order however its input is cut into micro-batches, and that order is
 * a Kafka Streams task's. Which inputs are lagging is the driver's reading, made once per micro-batch before
 * it runs and kept with the checkpoint (a replayed batch reads the same: spark_jobs/state/input_lag.py), handed
 * to the tasks as the session setting {@link #LAGGING_CONF}.
 */
final class InputMerge {
  /** The session setting naming the lagging inputs of a micro-batch: {@code <input>:<partition>} pairs, comma
   * separated ({@code 0} the job's source, {@code 1} its first join topic, and so on); empty or absent: none. */
  static final String LAGGING_CONF = "spark.streamstate.inputs.lagging";

  private InputMerge() {}

  /** One input record of a task: which input ({@code input}: 0 the source, then the join topics in order), its
   * time, offset, key, whether it is a table's tombstone ({@code delete}) and its fields ({@code row}). */
  record Input(int input, long time, long offset, String key, boolean delete, Row row) {
    static final Comparator<Input> OFFSET_ORDER = Comparator.comparingLong(Input::offset);
  }

  /** Where a merge ended: the inputs from the least to the most recently taken ({@link #merge}'s
   * {@code recency} after it), the input this merge took last (null: it took none) and each input's records
   * that wait. */
  record Outcome(int[] recency, Integer takenLast, List<List<Input>> waiting) {}

  /** The inputs' recency before any was taken: the first input first. */
  static int[] initialRecency(int inputs) {
    int[] recency = new int[inputs];
    for (int i = 0; i < inputs; i++) {
      recency[i] = i;
    }
    return recency;
  }

  /** The recency of two inputs of which {@code secondTakenLast} was taken last (null: none yet). */
  static int[] twoInputRecency(Boolean secondTakenLast) {
    return Boolean.FALSE.equals(secondTakenLast) ? new int[] {1, 0} : new int[] {0, 1};
  }

  /** A recency as stored: the input indexes, least recently taken first, comma separated. */
  static String recencyText(int[] recency) {
    StringBuilder text = new StringBuilder();
    for (int input : recency) {
      text.append(text.length() == 0 ? "" : ",").append(input);
    }
    return text.toString();
  }

  /** A stored recency of {@code inputs} inputs (null: the initial one). */
  static int[] recencyOf(String text, int inputs) {
    if (text == null) {
      return initialRecency(inputs);
    }
    String[] parts = text.split(",");
    if (parts.length != inputs) {
      throw new IllegalStateException("a stored input order of " + parts.length + " inputs, the job has " + inputs);
    }
    int[] recency = new int[inputs];
    for (int i = 0; i < inputs; i++) {
      recency[i] = Integer.parseInt(parts[i]);
    }
    return recency;
  }

  /**
   * Take {@code inputs} (each in offset order, its waiting records first) by the rules above, passing each taken
   * record to {@code take}; {@code recency}: the inputs from the least to the most recently taken before this
   * batch (not changed). {@code lagging[i]}: records of input {@code i} are written beyond the batch.
   */
  static Outcome merge(List<List<Input>> inputs, boolean[] lagging, int[] recency, Consumer<Input> take) {
    int n = inputs.size();
    int[] next = new int[n];
    int[] order = recency.clone();
    Integer last = null;
    while (true) {
      int chosen = -1;
      boolean stop = false;
      for (int input : order) {  // least recently taken first: a tie goes to the earliest
        if (next[input] == inputs.get(input).size()) {
          if (lagging[input]) {
            stop = true;  // this input has records still to read: the others' (if any are left) wait for them
            break;
          }
          continue;
        }
        if (chosen < 0 || inputs.get(input).get(next[input]).time() < inputs.get(chosen).get(next[chosen]).time()) {
          chosen = input;
        }
      }
      if (stop || chosen < 0) {
        break;
      }
      take.accept(inputs.get(chosen).get(next[chosen]++));
      taken(order, chosen);
      last = chosen;
    }
    List<List<Input>> waiting = new ArrayList<>(n);
    for (int i = 0; i < n; i++) {
      waiting.add(rest(inputs.get(i), next[i]));
    }
    return new Outcome(order, last, waiting);
  }

  /** {@code order} with {@code input} moved to its end (the most recently taken). */
  private static void taken(int[] order, int input) {
    int at = 0;
    while (order[at] != input) {
      at++;
    }
    System.arraycopy(order, at + 1, order, at, order.length - at - 1);
    order[order.length - 1] = input;
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

  /** For each of {@code inputs} inputs of source partition {@code partition}, whether it is lagging in the
   * running micro-batch ({@link #lagging(int, int)}). */
  static boolean[] laggingInputs(int inputs, int partition) {
    boolean[] lagging = new boolean[inputs];
    for (int i = 0; i < inputs; i++) {
      lagging[i] = lagging(i, partition);
    }
    return lagging;
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
    for (List<Input> still : outcome.waiting()) {
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
