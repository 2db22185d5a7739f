"""Poison records land in the dead-letter topic with reason, source coordinates and raw bytes; the
job keeps running and its outputs equal the computation over the valid events only."""

from __future__ import annotations

import dataclasses
import json

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from spark_jobs.driver.run import run
from spark_jobs.io.dead_letter import HEADER_PREFIX, dead_letter_topic
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from tests.helpers import delta_purchase_counts, expected_purchase_counts

pytestmark = pytest.mark.integration

GOOD = {
    "event_id": "x",
    "type": "purchase",
    "user_id": "u1",
    "item": "sku-1",
    "amount": 10.0,
    "event_time": "2026-11-01T09:00:00Z",
}
POISON = [
    ("undecodable", b"not json at all"),
    ("undecodable", b"\xff\xfe\x00garbage"),
    ("undecodable", b"[1, 2, 3]"),
    ("undecodable", None),
    ("missing_key", json.dumps({**GOOD, "user_id": None}).encode()),
    ("missing_key", json.dumps({**GOOD, "user_id": ""}).encode()),
    ("unknown_event_type", json.dumps({**GOOD, "type": "refund"}).encode()),
    ("failed_validation", json.dumps({**GOOD, "amount": -5}).encode()),
    ("failed_validation", json.dumps({**GOOD, "amount": "ten"}).encode()),
    ("failed_validation", json.dumps({k: v for k, v in GOOD.items() if k != "event_time"}).encode()),
    ("wrong_key", json.dumps({**GOOD, "event_id": "wrong-key"}).encode()),
]


def poison_key(i: int) -> bytes:
    """A poison record's Kafka key: its user's (u1) where it decodes to one, so that it meets the rule it is
    meant to break; another key for the wrong_key record; "poison-<i>" where there is no key to follow."""
    reason = POISON[i][0]
    if reason in ("unknown_event_type", "failed_validation"):
        return b"u1"
    return b"u2" if reason == "wrong_key" else f"poison-{i}".encode()


def test_poison_records_go_to_the_dead_letter_topic(spark, kafka_broker, settings, unique):
    job = dataclasses.replace(
        get_job("purchase_counts"), name=f"dlq_{unique}", source_topic=f"dlq-src-{unique}", output_table=f"dlq_{unique}"
    )
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, job.source_topic, job.source_partitions)
    good = list(purchases.generate(1000, users=80, seed=41))
    purchases.produce(bootstrap, job.source_topic, good[:500])
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, (_, raw) in enumerate(POISON):
        producer.produce(job.source_topic, key=poison_key(i), value=raw, partition=i % 2)
    assert producer.flush(30) == 0
    purchases.produce(bootstrap, job.source_topic, good[500:])

    report = run(job, settings, available_now=True, spark=spark)
    assert report.error is None
    assert delta_purchase_counts(spark, report.output) == expected_purchase_counts(good)

    dead = read_with_headers(bootstrap, dead_letter_topic(job.application_id))
    assert sorted((d["value"] or b"", d["key"], d["headers"]["reason"]) for d in dead) == sorted(
        (raw or b"", poison_key(i), reason) for i, (reason, raw) in enumerate(POISON)
    )
    for d in dead:
        i = next(i for i, (_, raw) in enumerate(POISON) if raw == d["value"])  # raw bytes untouched
        assert d["headers"]["source.topic"] == job.source_topic
        assert int(d["headers"]["source.partition"]) == i % 2
        assert int(d["headers"]["source.offset"]) >= 0


def read_with_headers(bootstrap: str, topic: str) -> list[dict]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{topic}",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out, eof = [], set()
    try:
        while len(eof) < len(parts):
            msg = consumer.poll(10)
            assert msg is not None, f"stalled reading {topic}"
            if msg.error():
                eof.add(msg.partition())
                continue
            headers = {k.removeprefix(HEADER_PREFIX): v.decode() for k, v in msg.headers() or []}
            out.append({"key": msg.key(), "value": msg.value(), "headers": headers})
    finally:
        consumer.close()
    return out


@pytest.mark.parametrize("job", ["purchase_counts", "patient_heart_rate", "vote_counts"])
def test_the_classification_decodes_each_record_once_whatever_its_rules_read(spark, job):
    """The executed plan of a job's records decodes each record once, with the JVM decoder (twice with
    Spark's functions: once to the job's schema and once to a variant), whatever its rules read
    (BENCHMARKS.md "Input cost": one extra parse per rule reference made the classification several times a
    plain from_json)."""
    import importlib
    import types

    from spark_jobs.io import dead_letter
    from spark_jobs.testing import decoding_with

    raw = spark.createDataFrame(
        [(b"u1", b'{"type": "purchase"}', "t", 0, 0, None)],
        "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP",
    )
    classify = importlib.import_module(f"spark_jobs.reference.jobs.{job}").classify
    expected = {
        "jvm": {"UDF(value": 1, "from_json(": 0, "parseJson(": 0, "get_json_object(": 0},
        "spark": {"UDF(value": 0, "from_json(": 1, "parseJson(": 1, "get_json_object(": 0},
    }
    for decoder, parses in expected.items():
        with decoding_with(decoder):
            classified = classify(types.SimpleNamespace(sources=types.SimpleNamespace(stream=lambda: raw)))
        for rows in (
            dead_letter.valid(classified, "offset"),
            dead_letter.with_dead_letters(classified, "t", None, "offset"),
        ):
            plan = rows._jdf.queryExecution().executedPlan().toString()
            assert {name: plan.count(name) for name in parses} == parses, plan
    # the default, for every reference job's schema
    plan = (
        classify(types.SimpleNamespace(sources=types.SimpleNamespace(stream=lambda: raw)))
        ._jdf.queryExecution()
        .executedPlan()
        .toString()
    )
    assert plan.count("UDF(value") == 1 and "from_json(" not in plan, plan


#: HotSpot's HugeMethodLimit: a method of more bytecode is never JIT-compiled and runs interpreted.
JIT_METHOD_LIMIT = 8000


@pytest.mark.parametrize(
    "job, declaration",
    [
        ("purchase_counts", "COUNTS"),
        ("patient_heart_rate", "HEART_RATE"),
        ("temperature_averages", "AVERAGES"),
        ("vote_counts", "VOTES"),
    ],
)
def test_the_processor_input_compiles_to_methods_the_jit_takes(spark, job, declaration):
    """Each job's classified records, filtered to what its processor reads, compile to generated methods
    the JIT compiles. Spark pushes the processor's filter under the classification and inlines the rules
    into it: when the dead-letter reason was read by comparing the first broken rule's number with each
    rule's, every comparison became a copy of the rule chain and the method grew to 15,821 bytes for
    temperature_averages, run interpreted (the map side of its shuffle ten times slower)."""
    import importlib
    import types

    from spark_jobs.io import dead_letter
    from spark_jobs.registry import get_job
    from spark_jobs.registry import store as store_spec

    spec, module = get_job(job), importlib.import_module(f"spark_jobs.reference.jobs.{job}")
    raw = spark.createDataFrame(
        [(b"u1", b'{"type": "x"}', "t", 0, 0, None)],
        "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP",
    )
    classified = module.classify(types.SimpleNamespace(sources=types.SimpleNamespace(stream=lambda: raw)))
    events = dead_letter.with_dead_letters(
        classified, "app", spec.key_field, "partition", "offset", "timestamp", "value"
    )
    changes = getattr(module, declaration).changes(
        events, spec.key_field, None, store_spec(spec, spec.stores[0].name), job=job, offset_ordered=True
    )
    stages = spark._jvm.org.apache.spark.sql.execution.debug.package.codegenStringSeq(
        changes._jdf.queryExecution().executedPlan()
    )
    sizes = [stages.apply(i)._3().maxMethodCodeSize() for i in range(stages.size())]
    assert sizes and max(sizes) <= JIT_METHOD_LIMIT, sizes


@pytest.mark.parametrize("processor", ["java", "python"])
def test_rejected_records_ride_through_the_processor_that_never_sees_them(spark, tmp_path, processor):
    """The job's one query: each record read and decoded once, valid ones processed, rejected ones passed
    through the processor (Java or Python) as dead-letter records, the processor never called with them."""
    import datetime as dt
    import types

    from spark_jobs.io import dead_letter
    from spark_jobs.reference.jobs import purchase_counts

    good = [{**GOOD, "event_id": f"e{i}", "user_id": user} for i, user in enumerate(["u1", "u2", "u1"])]
    values = [json.dumps(e).encode() for e in good] + [raw for _, raw in POISON]
    at = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    schema = "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
    keys = [e["user_id"].encode() for e in good] + [poison_key(i) for i in range(len(POISON))]
    rows = [(k, v, "src", 0, i, at) for i, (k, v) in enumerate(zip(keys, values, strict=True))]
    spark.createDataFrame(rows, schema).write.parquet(str(tmp_path / "input"))
    raw = spark.readStream.schema(schema).parquet(str(tmp_path / "input"))  # a stream, as the job's source is

    classified = purchase_counts.classify(types.SimpleNamespace(sources=types.SimpleNamespace(stream=lambda: raw)))
    events = dead_letter.with_dead_letters(classified, "app-v1", "user_id", "offset")
    logic = None if processor == "java" else purchase_counts.PurchaseCounter
    changes = purchase_counts.state_changes(events, None, None, logic)
    out = []
    query = (
        changes.writeStream.outputMode("update")
        .foreachBatch(lambda batch, _: out.extend(batch.collect()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
    # one read, one decode (the JVM decoder's UDF; neither from_json nor a variant parse)
    assert plan.count("UDF(value") == 1 and "from_json(" not in plan and "parseJson(" not in plan, plan

    letters = [r[dead_letter.LETTER_COLUMN] for r in out if r[dead_letter.LETTER_COLUMN] is not None]
    counted = {r["key"]: r["purchases"] for r in out if r[dead_letter.LETTER_COLUMN] is None}
    assert counted == {"u1": 2, "u2": 1}  # u1's rejected events (in its group) never reached the processor
    assert sorted((letter["key"], letter["value"] or b"") for letter in letters) == sorted(
        (poison_key(i), v or b"") for i, (_, v) in enumerate(POISON)
    )
    headers = [
        {h["key"].removeprefix(HEADER_PREFIX): h["value"].decode() for h in letter["headers"]} for letter in letters
    ]
    assert sorted(h["reason"] for h in headers) == sorted(reason for reason, _ in POISON)
    assert all(h["source.topic"] == "src" and h["message"].startswith("record rejected by app-v1: ") for h in headers)


def test_a_batch_is_counted_by_letter_reason_in_one_job_when_it_holds_no_letter(spark):
    """The count that materialises a micro-batch: its rows by dead-letter reason (None: the processor's) in one
    Spark job of one stage (no shuffle of its own) when no row carries a letter; the reasons are grouped (a
    second job, of two stages) only when some do."""
    from spark_jobs.io.dead_letter import LETTER_COLUMN, count_batch, counted_reasons, letter_reasons

    reason = f"array(named_struct('key', '{HEADER_PREFIX}reason', 'value', CAST(r AS BINARY)))"
    letters = f"CASE WHEN r IS NOT NULL THEN named_struct('headers', {reason}) END AS {LETTER_COLUMN}"
    tracker = spark.sparkContext.statusTracker()

    def counted(frame):
        group = f"count-{id(frame)}"
        spark.sparkContext.setJobGroup(group, "count_batch")
        try:
            counts = count_batch(frame.persist()).by_reason
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
            frame.unpersist()
        jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
        return counts, sorted(len(job.stageIds) for job in jobs)

    rows = "CASE id % 10 WHEN 1 THEN 'late' WHEN 2 THEN 'invalid_json' WHEN 3 THEN 'late' END AS r"
    mixed = spark.range(100).selectExpr("id", rows).selectExpr("id", letters)
    assert counted(mixed) == ({None: 70, "late": 20, "invalid_json": 10}, [1, 2])
    clean = spark.range(100).selectExpr("id", "CAST(NULL AS STRING) AS r").selectExpr("id", letters)
    assert counted(clean) == ({None: 100}, [1])
    assert counted(spark.range(0).selectExpr("id", "CAST(NULL AS STRING) AS r").selectExpr("id", letters)) == ({}, [1])
    assert counted(spark.range(7)) == ({None: 7}, [1])  # no letter column at all
    # the same counts from the rows' reasons read into the driver with a small batch's other rows
    for frame in (mixed, clean, spark.range(7)):
        assert counted_reasons(letter_reasons(frame).toArrow()) == counted(frame)[0]
    # conditions counted among the processor's own rows (those without a letter), in the same job
    assert count_batch(mixed, {"even": "id % 2 = 0", "all": "true"}).matching == {"even": 40, "all": 70}
    assert count_batch(spark.range(7), {"small": "id < 3"}).matching == {"small": 3}
