package streamstate.bench;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.cfg.JsonNodeFeature;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.math.BigDecimal;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.FailOnInvalidTimestamp;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.TimestampExtractor;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueBytesStoreSupplier;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The Kafka Streams peer of the benchmarks: the reference jobs' aggregations with RocksDB stores and
 * changelogs, as the seeds build them.
 *
 * <ul>
 *   <li>{@code purchase_counts}: purchases and amount spent per user; {@code account_closed} deletes the
 *       user (the aggregator returns null, which deletes the key and logs a tombstone); {@code
 *       purchase_counts_in_memory} the same in {@code Stores.inMemoryKeyValueStore("counts")};
 *   <li>{@code pulse_counts}: heart beats per patient per 60 s event-time window, 5 s grace, 6 h
 *       retention, emitted once when the window closes;
 *   <li>{@code temperature_averages}: readings, average, minimum and maximum temperature per sensor in
 *       5-minute windows starting every minute (hopping), 30 s grace, 2 h retention, emitted once when
 *       a window closes; every update of every window also goes to {@code <output topic>-updates}
 *       (the same table without suppress);
 *   <li>{@code activity_ttl}: clicks and quantity per user, each user expiring 60 s of event time after
 *       its latest click (the platform's keyed aggregate with an event-time TTL);
 *   <li>{@code vote_counts}: votes per candidate over each voter's latest vote by event time (a
 *       versioned table with 24 h of history, whose aggregation ignores out-of-order votes); the output
 *       topic gets {@code candidate -> {"votes": n}};
 *   <li>{@code user_sessions}: events, page views and the last page per user per session (30 min
 *       inactivity gap, 5 min grace, 2 h retention), emitted when a session closes; every update (merged
 *       sessions as tombstones) also goes to {@code <output topic>-updates};
 *   <li>{@code recent_buyers}: purchase_counts' aggregate in {@code Stores.lruMap("recent-buyers", 10)}
 *       (caching disabled: the record cache would delay the puts, hence the evictions, to its flushes);
 *       on exit the app prints the store's content, one {@code {"event": "store_entry", ...}} line per key
 *       (an eviction reaches neither the output topic nor, behind an aggregate's timestamped store, the
 *       changelog: the store itself is the answer);
 *   <li>{@code top_movers}: the seeds' two-stage daily top movers over stock ticks keyed by symbol. Stage 1:
 *       change (sum) and ticks (count) per symbol per UTC day (1-day event-time windows, 10 min grace, 3 days
 *       retention), emitted once when the day closes to {@code <output topic>-daily} (one partition, created
 *       by the caller) as {@code {"symbol", "window_start"} -> {"symbol", "window_start", "window_end",
 *       "change", "ticks"}} (ISO-8601 UTC instants, {@code Instant.toString()}). Stage 2: that topic as a
 *       table, regrouped by day, its members aggregated (adder and subtractor), the day's 10 largest changes
 *       (a tie to the smaller symbol) to {@code <output topic>} as {@code window_start -> {"window_start",
 *       "top": [{"rank", "symbol", "change", "ticks"}, ...]}}.
 *   <li>{@code customer_accounts_inner}, {@code customer_accounts_left}, {@code customer_accounts_outer}: the
 *       table-table join ({@code KTable#join}, {@code leftJoin}, {@code outerJoin}) of customers and accounts;
 *       {@code <input topic>} is the two upsert topics, {@code <customers topic>,<accounts topic>}, co-partitioned
 *       and keyed by the same canonical JSON key string (e.g. {@code {"customer_id":"c01"}}), a null value
 *       deleting the row. Each is a table in a RocksDB store ({@code customers}, {@code accounts}) stamped with
 *       the record's own timestamp; the output topic gets {@code key -> {"customer_id", "name", "tier",
 *       "account_id", "status", "balance"}} (an absent side's fields null, the balance's decimal as written), or
 *       a tombstone when the key's joined row is deleted.
 *   <li>{@code order_enrichment}: the stream-table join of orders with the customer as it was at the order's
 *       time; {@code <input topic>} is {@code <orders topic>,<customers topic>}, co-partitioned and keyed by the
 *       customer id's text (e.g. {@code c03}). Orders are stamped with their {@code event_time}; customers
 *       (a JSON row or a tombstone) with the record's own timestamp, in a versioned RocksDB store ({@code
 *       customer-profiles}, 24 h history retention). Each order gets its source partition and offset, then
 *       {@code leftJoin} with a 1 min grace period (KIP-923: held until stream time passes its time + grace,
 *       then joined with the row valid at its time). The output topic (not compacted: one record per order)
 *       gets {@code customer_id -> {"customer_id", "order_id", "amount", "event_time", "name", "tier",
   *       "source_partition", "source_offset"}} (the amount's decimal as written, name and tier null without a
 *       valid customer row).
 *   <li>{@code order_enrichment_rekeyed}: the same join of orders that are not keyed by their customer (no key, or
 *       another field): each order gets its source partition and offset, then {@code selectKey} by its {@code
 *       customer_id} (an order without one dropped) before the join, so Kafka Streams writes the orders to its
 *       repartition topic, sized as the customers topic, and joins what it reads back (the platform's {@code
 *       repartition=True}).
 *   <li>{@code order_credit_enrichment}: orders joined with two tables keyed as they are, the customer and the
 *       customer's credit line, each as it was at the order's time; {@code <input topic>} is {@code <orders
 *       topic>,<customers topic>,<credit lines topic>}, co-partitioned and keyed by the customer id's text. Each
 *       table (a JSON row or a tombstone, stamped with the record's own timestamp) in a versioned RocksDB store
 *       ({@code customer-profiles}, {@code credit-lines}, 24 h history retention); each order gets its source
 *       partition and offset, then {@code leftJoin(customers).leftJoin(creditLines)} without a grace period (one
 *       task: both joins look up the row valid at the order's time as it is taken). The output topic gets {@code
 *       customer_id -> {"customer_id", "order_id", "amount", "event_time", "name", "tier", "credit_limit",
 *       "standing", "source_partition", "source_offset"}} (a table's fields null without a valid row).
 *   <li>{@code order_payments_inner}, {@code order_payments_left}, {@code order_payments_outer}: the windowed
 *       stream-stream join ({@code KStream#join}, {@code leftJoin}, {@code outerJoin}) of orders with their
 *       payments; {@code <input topic>} is {@code <orders topic>,<payments topic>}, co-partitioned and keyed by
 *       the order id's text (e.g. {@code o0007}), each record stamped with its {@code event_time}. Each record
 *       gets its source partition and offset ({@code order_partition}/{@code order_offset}, {@code
 *       payment_partition}/{@code payment_offset}), then the join: a payment within 10 minutes before or after
 *       its order ({@code JoinWindows.ofTimeDifferenceAndGrace(10 min, 1 min)}, KS 3.1+ semantics: an unmatched
 *       order or payment is held and emitted only after its window has closed, unless it is already more than
 *       10 min behind stream time), window stores {@code order-payments-*}. The output topic (not compacted: one record per result) gets {@code order_id ->
 *       {"order_id", "customer_id", "amount", "order_time", "payment_id", "paid", "payment_time",
 *       "order_partition", "order_offset", "payment_partition", "payment_offset"}} (an absent side's fields null,
 *       decimals as written). Kafka Streams throttles the emission of unmatched records by wall-clock time
 *       (internal config {@code __emit.interval.ms.kstreams.outer.join.spurious.results.fix__}, 1000 ms): with
 *       {@code -Dstreams.__emit.interval.ms.kstreams.outer.join.spurious.results.fix__=0} the output depends on
 *       the input alone (spark_jobs/reference/generators/payments.py states the rules).
 *   <li>{@code order_payments_inner_rekeyed}, {@code ..._left_rekeyed}, {@code ..._outer_rekeyed}: the same joins
 *       of orders that are not keyed by their order id: each order gets its source partition and offset, then
 *       {@code selectKey} by its {@code order_id} (an order without one dropped), so Kafka Streams writes the
 *       orders to its repartition topic, sized as the payments topic, and joins what it reads back (the
 *       platform's {@code repartition=True}).
 * </ul>
 *
 * <p>Prints one JSON line per lifecycle change, per restore event and per failed stream thread on stdout
 * (the Python harness in bench/ reads them): {@code {"event": "state", "from": ..., "to": ..., "at_ms":
 * ...}}, {@code {"event": "restore_end", "store": ..., "partition": ..., "records": ..., "at_ms": ...}},
 * {@code {"event": "error", "error": ..., "cause": ..., "at_ms": ...}}. A failed stream thread shuts the
 * client down and the process exits with 1.
 *
 * <p>Any JVM system property {@code streams.<config>} overrides that Kafka Streams config (e.g. {@code
 * -Dstreams.processing.guarantee=exactly_once_v2 -Dstreams.commit.interval.ms=100}); without one the app runs
 * at-least-once with a 1 s commit interval.
 *
 * <p>Usage: {@code BenchApp <purchase_counts[_rekeyed|_in_memory]|pulse_counts|temperature_averages|activity_ttl|vote_counts|user_sessions|recent_buyers|top_movers|customer_accounts_<inner|left|outer>|order_enrichment[_rekeyed]|order_credit_enrichment|order_payments_<inner|left|outer>[_rekeyed]> <bootstrap> <application.id> <state.dir>
 * <input topic[,second input topic]> <output topic> [stream threads]}
 */
public final class BenchApp {
  private static final ObjectMapper JSON = new ObjectMapper();
  /** the store whose content the app prints on exit (recent_buyers), or null */
  private static String printedOnExit;

  private BenchApp() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 6) {
      System.err.println(
          "usage: BenchApp <purchase_counts[_rekeyed|_in_memory]|pulse_counts|temperature_averages|activity_ttl|vote_counts|user_sessions|recent_buyers|top_movers|customer_accounts_<inner|left|outer>|order_enrichment[_rekeyed]|order_credit_enrichment|order_payments_<inner|left|outer>[_rekeyed]> <bootstrap> <application.id> <state.dir> <input[,input]> <output> [threads]");
      System.exit(2);
    }
    String job = args[0];
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[2]);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
    props.put(StreamsConfig.STATE_DIR_CONFIG, args[3]);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, args.length > 6 ? args[6] : "2");
    // Commit (and flush the record cache) every second: the harness measures progress by committed offsets.
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "1000");
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // Kafka Streams does not leave the group on close: a restart with the same application.id waits
    // for the old member's session to expire before its restore can start. 10 s instead of 45 s keeps
    // the benchmark's wall time down; the restore itself is timed by the restore listener either way.
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), "10000");
    props.put(StreamsConfig.DEFAULT_TIMESTAMP_EXTRACTOR_CLASS_CONFIG, EventTime.class);
    // Overrides from the command line: every JVM system property "streams.<config>" sets <config>, e.g.
    // -Dstreams.processing.guarantee=exactly_once_v2 -Dstreams.commit.interval.ms=100 (bench/latency.py).
    // None given: the settings above, which the other benchmarks measure with.
    for (String name : System.getProperties().stringPropertyNames()) {
      if (name.startsWith("streams.")) {
        props.put(name.substring("streams.".length()), System.getProperty(name));
      }
    }

    StreamsBuilder builder = new StreamsBuilder();
    switch (job) {
      case "purchase_counts" -> purchaseCounts(builder, args[4], args[5], false, Stores.persistentKeyValueStore("counts"));
      case "purchase_counts_rekeyed" -> purchaseCounts(builder, args[4], args[5], true, Stores.persistentKeyValueStore("counts"));
      case "purchase_counts_in_memory" -> purchaseCounts(builder, args[4], args[5], false, Stores.inMemoryKeyValueStore("counts"));
      case "pulse_counts" -> pulseCounts(builder, args[4], args[5]);
      case "temperature_averages" -> temperatureAverages(builder, args[4], args[5]);
      case "activity_ttl" -> activityTtl(builder, args[4], args[5]);
      case "vote_counts" -> voteCounts(builder, args[4], args[5]);
      case "user_sessions" -> userSessions(builder, args[4], args[5]);
      case "recent_buyers" -> recentBuyers(builder, args[4], args[5]);
      case "top_movers" -> topMovers(builder, args[4], args[5]);
      case "customer_accounts_inner", "customer_accounts_left", "customer_accounts_outer" ->
          customerAccounts(builder, job.substring("customer_accounts_".length()), args[4], args[5]);
      case "order_enrichment" -> orderEnrichment(builder, args[4], args[5], false);
      case "order_enrichment_rekeyed" -> orderEnrichment(builder, args[4], args[5], true);
      case "order_credit_enrichment" -> orderCreditEnrichment(builder, args[4], args[5]);
      case "order_payments_inner", "order_payments_left", "order_payments_outer" ->
          orderPayments(builder, job.substring("order_payments_".length()), args[4], args[5], false);
      case "order_payments_inner_rekeyed", "order_payments_left_rekeyed", "order_payments_outer_rekeyed" -> {
        String kind = job.substring("order_payments_".length(), job.length() - "_rekeyed".length());
        orderPayments(builder, kind, args[4], args[5], true);
      }
      default -> {
        System.err.println("unknown job " + job);
        System.exit(2);
      }
    }
    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    CountDownLatch stopped = new CountDownLatch(1);
    streams.setStateListener(
        (to, from) -> {
          emit(Map.of("event", "state", "from", from.name(), "to", to.name()));
          if (to == KafkaStreams.State.ERROR) {
            stopped.countDown(); // a failed client must end the process, not idle until the harness times out
          }
        });
    // The harness reads the failure from stdout (stderr is the library's log): then the client shuts down.
    streams.setUncaughtExceptionHandler(
        error -> {
          Throwable cause = error;
          while (cause.getCause() != null) {
            cause = cause.getCause();
          }
          emit(Map.of("event", "error", "error", error.toString(), "cause", cause.toString()));
          return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    streams.setGlobalStateRestoreListener(new Restores());
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  if (printedOnExit != null) {
                    printStore(streams, printedOnExit);
                  }
                  streams.close(Duration.ofSeconds(30));
                  stopped.countDown();
                }));
    streams.start();
    stopped.await();
    if (streams.state() == KafkaStreams.State.ERROR) {
      streams.close(Duration.ofSeconds(30));
      System.exit(1);
    }
  }

  /**
   * Purchases and amount per user; account_closed deletes the user. {@code rekeyed}: the input is not keyed
   * by user_id (producers without a key), so the records are grouped by the field: Kafka Streams writes them
   * to its repartition topic keyed by it and aggregates what it reads back (the platform's {@code
   * repartition=True}); otherwise the input is keyed by user_id (as the platform's generators write it).
   * {@code store}: RocksDB ({@code persistentKeyValueStore}), or {@code inMemoryKeyValueStore} for the
   * platform's {@code purchase_counts_in_memory}.
   */
  static void purchaseCounts(StreamsBuilder builder, String input, String output, boolean rekeyed,
                             KeyValueBytesStoreSupplier store) {
    KStream<String, String> events = builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()));
    KGroupedStream<String, String> grouped = rekeyed
        ? events
            .filter((key, value) -> field(value, "user_id") != null)
            .groupBy((key, value) -> field(value, "user_id"), Grouped.with(Serdes.String(), Serdes.String()))
        : events
            .filter((user, value) -> user != null)
            .groupByKey(Grouped.with(Serdes.String(), Serdes.String()));
    grouped
        .aggregate(
            () -> null,
            BenchApp::countPurchase,
            Materialized.<String, String>as(store)
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.String()))
        .toStream()
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
  }

  /** purchase_counts' aggregator: a purchase counts and adds its amount; account_closed deletes the user. */
  static String countPurchase(String user, String value, String current) {
    JsonNode event = parse(value);
    if (event == null) {
      return current;
    }
    if ("account_closed".equals(event.path("type").asText())) {
      return null; // deletes the key: the store and its changelog get a tombstone
    }
    long purchases = 0;
    BigDecimal spent = BigDecimal.ZERO;
    if (current != null) {
      JsonNode state = parse(current);
      purchases = state.path("purchases").asLong();
      spent = new BigDecimal(state.path("amount_spent").asText("0"));
    }
    ObjectNode next = JSON.createObjectNode();
    next.put("purchases", purchases + 1);
    next.put("amount_spent", spent.add(new BigDecimal(event.path("amount").asText("0"))).toPlainString());
    next.put("last_purchase_at", event.path("event_time").asText());
    return next.toString();
  }

  /**
   * purchase_counts' aggregate kept for the 10 most recently used users per task: {@code Stores.lruMap}
   * behind {@code groupByKey().aggregate()} (the platform's {@code StoreSpec(kind="lru", max_entries=10)}).
   * The record cache is disabled: with it, puts (and so evictions) would reach the LRU only when the cache
   * flushes, and a key evicted from the LRU but still cached would go on counting.
   */
  static void recentBuyers(StreamsBuilder builder, String input, String output) {
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
        .filter((user, value) -> user != null)
        .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
        .aggregate(
            () -> null,
            BenchApp::countPurchase,
            Materialized.<String, String>as(Stores.lruMap("recent-buyers", 10))
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.String())
                .withCachingDisabled())
        .toStream()
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
    printedOnExit = "recent-buyers";
  }

  /** Print every entry of key-value store {@code store} (interactive query), one line each. */
  static void printStore(KafkaStreams streams, String store) {
    try {
      ReadOnlyKeyValueStore<String, String> entries =
          streams.store(StoreQueryParameters.fromNameAndType(store, QueryableStoreTypes.<String, String>keyValueStore()));
      try (KeyValueIterator<String, String> all = entries.all()) {
        while (all.hasNext()) {
          KeyValue<String, String> entry = all.next();
          emit(Map.of("event", "store_entry", "store", store, "key", entry.key, "value", entry.value));
        }
      }
      emit(Map.of("event", "store_printed", "store", store));
    } catch (RuntimeException e) {
      emit(Map.of("event", "error", "error", "printing store " + store + ": " + e, "cause", e.toString()));
    }
  }

  /** Beats per patient per 60 s event-time window (5 s grace, 6 h retention), emitted when it closes. */
  static void pulseCounts(StreamsBuilder builder, String input, String output) {
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
        .filter((patient, value) -> patient != null && "pulse".equals(field(value, "type")))
        .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
        .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(60), Duration.ofSeconds(5)))
        .count(
            Materialized.<String, Long>as(
                    Stores.persistentWindowStore(
                        "pulse-counts", Duration.ofHours(6), Duration.ofSeconds(60), false))
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long()))
        .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
        .toStream()
        .map(
            (window, beats) ->
                KeyValue.pair(
                    window.key() + "@" + window.window().start(),
                    "{\"beats\":" + beats + ",\"window_start_ms\":" + window.window().start() + "}"))
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
  }

  /**
   * Readings, average, minimum and maximum temperature per sensor over the last 5 minutes, every minute
   * (30 s grace, 2 h retention): emitted once when a window closes to {@code output}, and every update of
   * every window to {@code output-updates}. The window's value is JSON: readings, temperature_sum,
   * min_temperature, max_temperature.
   */
  static void temperatureAverages(StreamsBuilder builder, String input, String output) {
    KTable<Windowed<String>, String> windows = builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
        .filter((sensor, value) -> sensor != null && "reading".equals(field(value, "type"))
            && field(value, "temperature") != null)
        .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
        .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(5), Duration.ofSeconds(30))
            .advanceBy(Duration.ofMinutes(1)))
        .aggregate(
            () -> null,
            (sensor, value, current) -> {
              double temperature = parse(value).path("temperature").asDouble();
              ObjectNode next = JSON.createObjectNode();
              if (current == null) {
                next.put("readings", 1L);
                next.put("temperature_sum", 0.0 + temperature);
                next.put("min_temperature", temperature);
                next.put("max_temperature", temperature);
              } else {
                JsonNode window = parse(current);
                next.put("readings", window.path("readings").asLong() + 1);
                next.put("temperature_sum", window.path("temperature_sum").asDouble() + temperature);
                next.put("min_temperature", Math.min(window.path("min_temperature").asDouble(), temperature));
                next.put("max_temperature", Math.max(window.path("max_temperature").asDouble(), temperature));
              }
              return next.toString();
            },
            Materialized.<String, String>as(
                    Stores.persistentWindowStore(
                        "temperature-windows", Duration.ofHours(2), Duration.ofMinutes(5), false))
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.String()));
    windows.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
        .toStream()
        .map(BenchApp::windowRecord)
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
    windows.toStream()
        .map(BenchApp::windowRecord)
        .to(output + "-updates", Produced.with(Serdes.String(), Serdes.String()));
  }

  /** {@code <key>@<window start>} -> the window's value with its start, as the tests read them. */
  static KeyValue<String, String> windowRecord(Windowed<String> window, String value) {
    ObjectNode record = (ObjectNode) parse(value);
    record.put("window_start_ms", window.window().start());
    return KeyValue.pair(window.key() + "@" + window.window().start(), record.toString());
  }

  /**
   * Clicks and quantity per user with a TTL in event time, written with the Processor API (Kafka Streams
   * has no TTL of its own): {@code logout} deletes the user, {@code view}s are filtered out before the
   * processor. Output: user -> {"clicks", "qty", "event_time_ms"}, or a tombstone.
   */
  static void activityTtl(StreamsBuilder builder, String input, String output) {
    builder.addStateStore(Stores.keyValueStoreBuilder(
        Stores.persistentKeyValueStore("activity"), Serdes.String(), Serdes.String()));
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
        .filter((user, value) -> user != null && List.of("click", "logout").contains(field(value, "type")))
        .process(() -> new ExpiringActivity(60_000), "activity")
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
  }

  /**
   * A task's users, expiring by event time: stream time is the largest event time of the records this
   * processor read, advanced before a record is applied; a user expires when it reaches the user's latest
   * event time + the TTL (checked before each record, where a stream-time punctuator would only run after
   * it); a click for a user the store does not hold that is already that old is dropped (the platform
   * dead-letters it). Stream time lives in the instance: the conformance test runs the app once.
   */
  static final class ExpiringActivity implements Processor<String, String, String, String> {
    private final long ttlMs;
    private ProcessorContext<String, String> context;
    private KeyValueStore<String, String> users;
    private long streamTime = Long.MIN_VALUE;

    ExpiringActivity(long ttlMs) {
      this.ttlMs = ttlMs;
    }

    @Override
    public void init(ProcessorContext<String, String> context) {
      this.context = context;
      this.users = context.getStateStore("activity");
    }

    @Override
    public void process(Record<String, String> record) {
      long t = record.timestamp();
      if (t > streamTime) {
        streamTime = t;
        List<String> due = new ArrayList<>();
        try (KeyValueIterator<String, String> all = users.all()) {
          while (all.hasNext()) {
            KeyValue<String, String> user = all.next();
            if (parse(user.value).path("event_time_ms").asLong() + ttlMs <= t) {
              due.add(user.key);
            }
          }
        }
        for (String user : due) {
          users.delete(user);
          context.forward(new Record<>(user, null, t));
        }
      }
      String user = record.key();
      JsonNode event = parse(record.value());
      if ("logout".equals(event.path("type").asText())) {
        users.delete(user);
        context.forward(new Record<>(user, null, t));
        return;
      }
      JsonNode current = parse(users.get(user));
      if (current == null && t + ttlMs <= streamTime) {
        return;
      }
      ObjectNode next = JSON.createObjectNode();
      next.put("clicks", (current == null ? 0 : current.path("clicks").asLong()) + 1);
      next.put("qty", (current == null ? 0 : current.path("qty").asLong()) + event.path("qty").asLong(0));
      next.put("event_time_ms", current == null ? t : Math.max(current.path("event_time_ms").asLong(), t));
      users.put(user, next.toString());
      context.forward(new Record<>(user, next.toString(), t));
    }
  }

  /**
   * Votes per candidate, counting each voter's latest vote by event time: a versioned table (KIP-914),
   * whose aggregations ignore a vote older than the voter's latest.
   */
  static void voteCounts(StreamsBuilder builder, String input, String output) {
    builder
        .table(
            input,
            Consumed.with(Serdes.String(), Serdes.String()),
            Materialized.<String, String>as(
                    Stores.persistentVersionedKeyValueStore("latest-votes", Duration.ofHours(24)))
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.String()))
        .groupBy(
            (voter, vote) -> KeyValue.pair(field(vote, "candidate"), vote),
            Grouped.with(Serdes.String(), Serdes.String()))
        .count()
        .toStream()
        .mapValues(votes -> JSON.createObjectNode().put("votes", votes).toString())
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
  }

  /**
   * Visits per user: clicks and page views in session windows (30 min inactivity gap, 5 min grace, 2 h
   * retention), emitted when a session closes to {@code output} and every update to {@code output-updates}
   * (the sessions a merge replaced as tombstones). A session's value is JSON: events, page_views, last_page;
   * two sessions merge by adding their counts, the later one's page kept unless it had none.
   */
  static void userSessions(StreamsBuilder builder, String input, String output) {
    KTable<Windowed<String>, String> sessions = builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
        .filter((user, value) -> user != null && List.of("click", "page_view").contains(field(value, "type")))
        .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
        .windowedBy(SessionWindows.ofInactivityGapAndGrace(Duration.ofMinutes(30), Duration.ofMinutes(5)))
        .aggregate(
            () -> null,
            (user, value, current) -> {
              JsonNode event = parse(value);
              JsonNode session = parse(current);
              ObjectNode next = JSON.createObjectNode();
              next.put("events", (session == null ? 0 : session.path("events").asLong()) + 1);
              next.put("page_views", (session == null ? 0 : session.path("page_views").asLong())
                  + ("page_view".equals(event.path("type").asText()) ? 1 : 0));
              String page = event.hasNonNull("page") ? event.get("page").asText()
                  : session == null || !session.hasNonNull("last_page") ? null : session.get("last_page").asText();
              next.put("last_page", page);
              return next.toString();
            },
            (user, earlier, later) -> {
              JsonNode one = parse(earlier);
              JsonNode two = parse(later);
              if (one == null || two == null) {
                return one == null ? later : earlier;
              }
              ObjectNode merged = JSON.createObjectNode();
              merged.put("events", one.path("events").asLong() + two.path("events").asLong());
              merged.put("page_views", one.path("page_views").asLong() + two.path("page_views").asLong());
              merged.put("last_page", two.hasNonNull("last_page") ? two.get("last_page").asText()
                  : one.hasNonNull("last_page") ? one.get("last_page").asText() : null);
              return merged.toString();
            },
            Materialized.<String, String>as(Stores.persistentSessionStore("user-sessions", Duration.ofHours(2)))
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.String()));
    sessions.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
        .toStream()
        .map(BenchApp::sessionRecord)
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
    sessions.toStream()
        .map(BenchApp::sessionRecord)
        .to(output + "-updates", Produced.with(Serdes.String(), Serdes.String()));
  }

  /** {@code <key>@<session start>} -> the session's value with its start and end, or a tombstone. */
  static KeyValue<String, String> sessionRecord(Windowed<String> session, String value) {
    String key = session.key() + "@" + session.window().start();
    if (value == null) {
      return KeyValue.pair(key, null);
    }
    ObjectNode record = (ObjectNode) parse(value);
    record.put("session_start_ms", session.window().start());
    record.put("session_end_ms", session.window().end());
    return KeyValue.pair(key, record.toString());
  }

  /** How many movers a day's answer lists. */
  static final int TOP_N = 10;

  /**
   * The daily top movers in two stages (see the class comment for the topics and their records).
   *
   * <p>The intermediate topic {@code <output>-daily} is a plain sink and source with one partition, not a
   * {@code repartition()}: it is the seeds' two-stage pattern's visible hand-over (another app may read the
   * daily changes), and its partitioning does not matter to stage 2, whose {@code groupBy} re-keys by day
   * through its own repartition topic anyway. One partition keeps that topic (and so the repartition topic,
   * which takes its source's partition count) to a single task: the few records a day has need no more.
   */
  static void topMovers(StreamsBuilder builder, String input, String output) {
    String daily = output + "-daily";
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
        .filter((symbol, value) -> symbol != null && parse(value) != null && parse(value).path("change").isNumber())
        .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
        .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofDays(1), Duration.ofMinutes(10)))
        .aggregate(
            () -> null,
            (symbol, value, current) -> {
              double change = parse(value).path("change").asDouble();
              JsonNode day = parse(current);
              ObjectNode next = JSON.createObjectNode();
              next.put("change", (day == null ? 0.0 : day.path("change").asDouble()) + change);
              next.put("ticks", (day == null ? 0L : day.path("ticks").asLong()) + 1);
              return next.toString();
            },
            Materialized.<String, String>as(
                    Stores.persistentWindowStore("daily-changes", Duration.ofDays(3), Duration.ofDays(1), false))
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.String()))
        .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
        .toStream()
        .map(
            (window, value) -> {
              String start = Instant.ofEpochMilli(window.window().start()).toString();
              ObjectNode key = JSON.createObjectNode();
              key.put("symbol", window.key());
              key.put("window_start", start);
              JsonNode day = parse(value);
              ObjectNode record = JSON.createObjectNode();
              record.put("symbol", window.key());
              record.put("window_start", start);
              record.put("window_end", Instant.ofEpochMilli(window.window().end()).toString());
              record.put("change", day.path("change").asDouble());
              record.put("ticks", day.path("ticks").asLong());
              return KeyValue.pair(key.toString(), record.toString());
            })
        .to(daily, Produced.with(Serdes.String(), Serdes.String()));

    builder.table(
            daily,
            Consumed.with(Serdes.String(), Serdes.String()),
            Materialized.<String, String>as(Stores.persistentKeyValueStore("daily-changes-table"))
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.String()))
        .groupBy(
            (key, value) -> KeyValue.pair(field(value, "window_start"), value),
            Grouped.with("movers-by-day", Serdes.String(), Serdes.String()))
        .aggregate(
            () -> "{}",
            (day, value, members) -> {
              JsonNode row = parse(value);
              ObjectNode next = (ObjectNode) parse(members);
              next.set(row.path("symbol").asText(), JSON.createObjectNode()
                  .put("change", row.path("change").asDouble())
                  .put("ticks", row.path("ticks").asLong()));
              return next.toString();
            },
            (day, value, members) -> {
              ObjectNode next = (ObjectNode) parse(members);
              next.remove(parse(value).path("symbol").asText());
              return next.toString();
            },
            Materialized.<String, String>as(Stores.persistentKeyValueStore("day-members"))
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.String()))
        .toStream()
        .mapValues(BenchApp::topOfDay)
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
  }

  /**
   * Balances as written: floats parse to BigDecimal, never through a double, their trailing zeros kept
   * ({@code 12.50} stays {@code 12.50}; Jackson strips them from a tree's decimals by default).
   */
  static final ObjectMapper EXACT_JSON = new ObjectMapper()
      .enable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS)
      .configure(JsonNodeFeature.STRIP_TRAILING_BIGDECIMAL_ZEROES, false);

  /**
   * The table-table join of customers and accounts ({@code kind}: inner, left or outer), see the class
   * comment. {@code inputs} is {@code <customers topic>,<accounts topic>}. The tables are stamped with the
   * records' own timestamps (the records have no event time field), and Kafka Streams joins them as they
   * are: same key string, same partition of both topics.
   */
  static void customerAccounts(StreamsBuilder builder, String kind, String inputs, String output) {
    String[] topics = inputs.split(",");
    if (topics.length != 2) {
      System.err.println("customer_accounts_" + kind + ": the input must be <customers topic>,<accounts topic>");
      System.exit(2);
    }
    KTable<String, String> customers = upsertTable(builder, topics[0], "customers");
    KTable<String, String> accounts = upsertTable(builder, topics[1], "accounts");
    ValueJoiner<String, String, String> joiner = BenchApp::customerAccount;
    KTable<String, String> joined = switch (kind) {
      case "inner" -> customers.join(accounts, joiner);
      case "left" -> customers.leftJoin(accounts, joiner);
      case "outer" -> customers.outerJoin(accounts, joiner);
      default -> throw new IllegalArgumentException("unknown join " + kind);
    };
    joined.toStream().to(output, Produced.with(Serdes.String(), Serdes.String()));
  }

  /** An upsert topic as a table in RocksDB store {@code store}, stamped with each record's own timestamp. */
  static KTable<String, String> upsertTable(StreamsBuilder builder, String topic, String store) {
    return builder.table(
        topic,
        Consumed.with(Serdes.String(), Serdes.String()).withTimestampExtractor(new FailOnInvalidTimestamp()),
        Materialized.<String, String>as(Stores.persistentKeyValueStore(store))
            .withKeySerde(Serdes.String())
            .withValueSerde(Serdes.String()));
  }

  /**
   * A customer and its account (either may be null: left and outer joins) -> the joined row: customer_id,
   * name, tier from the customer, account_id, status, balance from the account, an absent side's fields null
   * (customer_id from whichever side is present). Null (a deleted row) when neither side parses.
   */
  static String customerAccount(String customer, String account) {
    JsonNode c = parseExact(customer);
    JsonNode a = parseExact(account);
    if (c == null && a == null) {
      return null;
    }
    ObjectNode row = JSON.createObjectNode();
    row.set("customer_id", (c != null ? c : a).get("customer_id")); // a missing field (null) is set as JSON null
    row.set("name", c == null ? null : c.get("name"));
    row.set("tier", c == null ? null : c.get("tier"));
    row.set("account_id", a == null ? null : a.get("account_id"));
    row.set("status", a == null ? null : a.get("status"));
    row.set("balance", a == null ? null : a.get("balance"));
    return row.toString();
  }

  /**
   * Orders joined with the customer valid at each order's time (see the class comment). {@code inputs} is
   * {@code <orders topic>,<customers topic>}; {@code rekeyed}: the orders are keyed by their customer first.
   */
  static void orderEnrichment(StreamsBuilder builder, String inputs, String output, boolean rekeyed) {
    String[] topics = inputs.split(",");
    if (topics.length != 2) {
      System.err.println("order_enrichment: the input must be <orders topic>,<customers topic>");
      System.exit(2);
    }
    KStream<String, String> orders = builder
        .stream(topics[0], Consumed.with(Serdes.String(), Serdes.String()).withTimestampExtractor(new EventTime()))
        .processValues(WithSource::new);
    if (rekeyed) {
      orders = orders
          .filter((key, order) -> field(order, "customer_id") != null)
          .selectKey((key, order) -> field(order, "customer_id"));
    }
    KTable<String, String> customers = versionedTable(builder, topics[1], "customer-profiles");
    orders
        .leftJoin(
            customers,
            BenchApp::enrichedOrder,
            Joined.with(Serdes.String(), Serdes.String(), Serdes.String())
                .withName("order-enrichment")
                .withGracePeriod(Duration.ofMinutes(1)))
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
  }

  /**
   * Orders joined with the customer and the credit line valid at each order's time (see the class comment).
   * {@code inputs} is {@code <orders topic>,<customers topic>,<credit lines topic>}.
   */
  static void orderCreditEnrichment(StreamsBuilder builder, String inputs, String output) {
    String[] topics = inputs.split(",");
    if (topics.length != 3) {
      System.err.println("order_credit_enrichment: the input must be <orders topic>,<customers topic>,<credit lines topic>");
      System.exit(2);
    }
    KStream<String, String> orders = builder
        .stream(topics[0], Consumed.with(Serdes.String(), Serdes.String()).withTimestampExtractor(new EventTime()))
        .processValues(WithSource::new);
    Joined<String, String, String> joined = Joined.with(Serdes.String(), Serdes.String(), Serdes.String());
    orders
        .leftJoin(versionedTable(builder, topics[1], "customer-profiles"), BenchApp::enrichedOrder, joined)
        .leftJoin(versionedTable(builder, topics[2], "credit-lines"), BenchApp::withCreditLine, joined)
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
  }

  /** {@code topic} read as a table in a versioned RocksDB store {@code store} of 24 h history, each record stamped
   * with its own timestamp. */
  private static KTable<String, String> versionedTable(StreamsBuilder builder, String topic, String store) {
    return builder.table(
        topic,
        Consumed.with(Serdes.String(), Serdes.String()).withTimestampExtractor(new FailOnInvalidTimestamp()),
        Materialized.<String, String>as(Stores.persistentVersionedKeyValueStore(store, Duration.ofHours(24)))
            .withKeySerde(Serdes.String())
            .withValueSerde(Serdes.String()));
  }

  /**
   * An enriched order ({@link #enrichedOrder}) and its customer's credit line valid at the order's time (null:
   * none) -> the order's and customer's fields, credit_limit and standing from the line, source_partition,
   * source_offset.
   */
  static String withCreditLine(String enriched, String line) {
    JsonNode o = parseExact(enriched);
    JsonNode l = parseExact(line);
    ObjectNode row = JSON.createObjectNode();
    for (String field : List.of("customer_id", "order_id", "amount", "event_time", "name", "tier")) {
      row.set(field, o.get(field));
    }
    row.set("credit_limit", l == null ? null : l.get("credit_limit"));
    row.set("standing", l == null ? null : l.get("standing"));
    row.set("source_partition", o.get("source_partition"));
    row.set("source_offset", o.get("source_offset"));
    return row.toString();
  }

  /**
   * A record's value with its source partition and offset added as fields {@code partitionField} and {@code
   * offsetField} ({@code partition} and {@code offset} by default; the join may emit it from its buffer later,
   * while another record is processed): what the output is matched with the platform's rows by. A value that
   * is not a JSON object is dropped.
   */
  static final class WithSource implements FixedKeyProcessor<String, String, String> {
    private final String partitionField;
    private final String offsetField;
    private FixedKeyProcessorContext<String, String> context;

    WithSource() {
      this("partition", "offset");
    }

    WithSource(String partitionField, String offsetField) {
      this.partitionField = partitionField;
      this.offsetField = offsetField;
    }

    @Override
    public void init(FixedKeyProcessorContext<String, String> context) {
      this.context = context;
    }

    @Override
    public void process(FixedKeyRecord<String, String> record) {
      if (!(parseExact(record.value()) instanceof ObjectNode order)) {
        return;
      }
      RecordMetadata source = context.recordMetadata().orElseThrow();
      order.put(partitionField, source.partition());
      order.put(offsetField, source.offset());
      context.forward(record.withValue(order.toString()));
    }
  }

  /**
   * An order (with its source partition and offset) and its customer's row valid at the order's time (null:
   * none) -> customer_id, order_id, amount (as written), event_time from the order, name, tier from the
   * customer, source_partition, source_offset.
   */
  static String enrichedOrder(String order, String customer) {
    JsonNode o = parseExact(order);
    JsonNode c = parseExact(customer);
    ObjectNode row = JSON.createObjectNode();
    row.set("customer_id", o.get("customer_id"));
    row.set("order_id", o.get("order_id"));
    row.set("amount", o.get("amount"));
    row.set("event_time", o.get("event_time"));
    row.set("name", c == null ? null : c.get("name"));
    row.set("tier", c == null ? null : c.get("tier"));
    row.set("source_partition", o.get("partition"));
    row.set("source_offset", o.get("offset"));
    return row.toString();
  }

  /**
   * Orders joined with their payments within 10 minutes before or after the order, 1 min grace ({@code kind}:
   * inner, left or outer; see the class comment). {@code inputs} is {@code <orders topic>,<payments topic>}.
   */
  static void orderPayments(StreamsBuilder builder, String kind, String inputs, String output, boolean rekeyed) {
    String[] topics = inputs.split(",");
    if (topics.length != 2) {
      System.err.println("order_payments_" + kind + ": the input must be <orders topic>,<payments topic>");
      System.exit(2);
    }
    KStream<String, String> orders = builder
        .stream(topics[0], Consumed.with(Serdes.String(), Serdes.String()).withTimestampExtractor(new EventTime()))
        .processValues(() -> new WithSource("order_partition", "order_offset"));
    if (rekeyed) {
      orders = orders
          .filter((key, order) -> field(order, "order_id") != null)
          .selectKey((key, order) -> field(order, "order_id"));
    }
    KStream<String, String> payments = builder
        .stream(topics[1], Consumed.with(Serdes.String(), Serdes.String()).withTimestampExtractor(new EventTime()))
        .processValues(() -> new WithSource("payment_partition", "payment_offset"));
    JoinWindows window = JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMinutes(10), Duration.ofMinutes(1));
    StreamJoined<String, String, String> stores =
        StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String()).withStoreName("order-payments");
    ValueJoiner<String, String, String> joiner = BenchApp::orderPayment;
    KStream<String, String> joined = switch (kind) {
      case "inner" -> orders.join(payments, joiner, window, stores);
      case "left" -> orders.leftJoin(payments, joiner, window, stores);
      case "outer" -> orders.outerJoin(payments, joiner, window, stores);
      default -> throw new IllegalArgumentException("unknown join " + kind);
    };
    joined.to(output, Produced.with(Serdes.String(), Serdes.String()));
  }

  /**
   * An order and a payment (with their source partitions and offsets; either null for an unmatched one in
   * left and outer joins) -> order_id (from whichever side is present), customer_id, amount, order_time
   * (its {@code event_time}) from the order, payment_id, paid, payment_time from the payment, then both sides'
   * source partition and offset; an absent side's fields null, decimals as written.
   */
  static String orderPayment(String order, String payment) {
    JsonNode o = parseExact(order);
    JsonNode p = parseExact(payment);
    ObjectNode row = JSON.createObjectNode();
    row.set("order_id", (o != null ? o : p).get("order_id")); // a missing field (null) is set as JSON null
    row.set("customer_id", o == null ? null : o.get("customer_id"));
    row.set("amount", o == null ? null : o.get("amount"));
    row.set("order_time", o == null ? null : o.get("event_time"));
    row.set("payment_id", p == null ? null : p.get("payment_id"));
    row.set("paid", p == null ? null : p.get("paid"));
    row.set("payment_time", p == null ? null : p.get("event_time"));
    row.set("order_partition", o == null ? null : o.get("order_partition"));
    row.set("order_offset", o == null ? null : o.get("order_offset"));
    row.set("payment_partition", p == null ? null : p.get("payment_partition"));
    row.set("payment_offset", p == null ? null : p.get("payment_offset"));
    return row.toString();
  }

  static JsonNode parseExact(String json) {
    try {
      return json == null ? null : EXACT_JSON.readTree(json);
    } catch (Exception e) {
      return null;
    }
  }

  /** A day's members ({@code symbol -> {"change", "ticks"}}) -> its top {@link #TOP_N} by change. */
  static String topOfDay(String day, String members) {
    if (members == null) {
      return null;
    }
    List<Map.Entry<String, JsonNode>> rows = new ArrayList<>();
    parse(members).fields().forEachRemaining(rows::add);
    rows.sort(
        Comparator.<Map.Entry<String, JsonNode>>comparingDouble(row -> -row.getValue().path("change").asDouble())
            .thenComparing(Map.Entry::getKey));
    ObjectNode answer = JSON.createObjectNode();
    answer.put("window_start", day);
    ArrayNode top = answer.putArray("top");
    for (int i = 0; i < Math.min(TOP_N, rows.size()); i++) {
      Map.Entry<String, JsonNode> row = rows.get(i);
      top.addObject()
          .put("rank", i + 1)
          .put("symbol", row.getKey())
          .put("change", row.getValue().path("change").asDouble())
          .put("ticks", row.getValue().path("ticks").asLong());
    }
    return answer.toString();
  }

  static String field(String json, String name) {
    JsonNode node = parse(json);
    return node == null || !node.hasNonNull(name) ? null : node.get(name).asText();
  }

  static JsonNode parse(String json) {
    try {
      return json == null ? null : JSON.readTree(json);
    } catch (Exception e) {
      return null; // a bad record is skipped (the platform dead-letters it; the peer only counts)
    }
  }

  static synchronized void emit(Map<String, Object> fields) {
    Map<String, Object> line = new HashMap<>(fields);
    line.put("at_ms", System.currentTimeMillis());
    try {
      System.out.println(JSON.writeValueAsString(line));
      System.out.flush();
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }

  /** Event time from the JSON {@code event_time} field (ISO-8601), else the record's timestamp. */
  public static final class EventTime implements TimestampExtractor {
    @Override
    public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
      String time = record.value() instanceof String s ? field(s, "event_time") : null;
      try {
        return time == null ? record.timestamp() : Instant.parse(time).toEpochMilli();
      } catch (Exception e) {
        return record.timestamp();
      }
    }
  }

  /** Restore events per store partition: what the harness times a full changelog replay with. */
  static final class Restores implements StateRestoreListener {
    @Override
    public void onRestoreStart(TopicPartition partition, String store, long start, long end) {
      emit(Map.of("event", "restore_start", "store", store, "partition", partition.partition(),
          "start_offset", start, "end_offset", end));
    }

    @Override
    public void onBatchRestored(TopicPartition partition, String store, long batchEnd, long restored) {}

    @Override
    public void onRestoreEnd(TopicPartition partition, String store, long restored) {
      emit(Map.of("event", "restore_end", "store", store, "partition", partition.partition(), "records", restored));
    }
  }
}
