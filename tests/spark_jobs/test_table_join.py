"""The table-table join (:class:`spark_jobs.primitives.TableJoin`, ``customer_accounts``): two CDC topics read
as tables and joined on their key, held to the plain-Python reference
(:func:`spark_jobs.reference.generators.customer_accounts.expected_join`) for inner, left and outer joins: updates,
deletes on both sides, keys on one side only, refused records on both, any cut of the input, a lost
checkpoint; co-partitioning checked at start."""

from __future__ import annotations

import dataclasses
import json
import shutil
from decimal import Decimal

import pytest

from bench.answers import latest_per_key
from spark_jobs.driver.run import run
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import customer_accounts
from spark_jobs.registry import JobSpecError, get_job
from spark_jobs.testing import JobHarness
from tests.helpers import every_record

pytestmark = pytest.mark.integration


def _spec(unique: str, join: str = "left", partitions: int = 2, **changes):
    entrypoint = {
        "left": "spark_jobs.reference.jobs.customer_accounts:CUSTOMER_ACCOUNTS",
        "inner": "tests.fixtures.join_jobs:INNER",
        "outer": "tests.fixtures.join_jobs:OUTER",
    }[join]
    return dataclasses.replace(
        get_job("customer_accounts"),
        name=f"joined_{join}_{unique}",
        source_topic=f"customers-{join}-{unique}",
        join_topics=(f"accounts-{join}-{unique}",),
        output_table=f"joined_{join}_{unique}",
        source_partitions=partitions,
        entrypoint=entrypoint,
        **changes,
    )


def _joined(rows) -> dict[str, tuple]:
    return {r["customer_id"]: tuple(r[f] for f in customer_accounts.FIELDS) for r in rows}


def _published(value: bytes) -> tuple:
    """An output topic's row (Spark's JSON leaves a null field out; Kafka Streams' twin writes it as null)."""
    row = json.loads(value, parse_float=Decimal)
    return tuple(row.get(f) for f in customer_accounts.FIELDS)


def _refused(customers, accounts) -> dict[str, int]:
    reasons = customer_accounts.refused(customers)
    for reason, n in customer_accounts.refused(accounts).items():
        reasons[reason] = reasons.get(reason, 0) + n
    return reasons


def test_the_left_join_follows_both_tables_whatever_the_cut_and_after_a_lost_checkpoint(
    settings, kafka_broker, spark, unique
):
    """Both tables over 3 partitions, cut into micro-batches of 25 records: the outputs are the reference's
    left join; the checkpoint lost half way (the store restored from its changelog), the run goes on as if
    nothing had happened. The results also go to the job's upsert topic, whose compacted view is the same
    join, and every refused record of either table is a dead letter."""
    spec = _spec(unique, partitions=3, output_topic=f"joined-{unique}")
    customers, accounts = customer_accounts.adversarial(count=300, seed=5)
    harness = JobHarness(settings=settings.replace(max_offsets_per_trigger=25), spark=spark)
    for topic in spec.input_topics:
        ensure_topic(settings.kafka, topic, 3)

    customer_accounts.produce(settings.kafka, spec.source_topic, customers[:150])
    customer_accounts.produce(settings.kafka, spec.join_topics[0], accounts[:100])
    first = harness.run(spec, [])
    assert _joined(first.outputs) == customer_accounts.expected_join(customers[:150], accounts[:100])
    # the run released its state stores: no late maintenance of its RocksDB stores writes into the checkpoint
    # deleted next (a CI run's second run was refused: STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY)
    assert not spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.isMaintenanceRunning()
    shutil.rmtree(first.report.checkpoint)
    customer_accounts.produce(settings.kafka, spec.source_topic, customers[150:])
    customer_accounts.produce(settings.kafka, spec.join_topics[0], accounts[100:])
    second = harness.run(spec, [])

    want = customer_accounts.expected_join(customers, accounts)
    assert second.report.restores["customer-accounts"].keys > 0
    assert _joined(second.outputs) == want
    # the situations this test is for: customers without accounts and with, deleted rows
    assert any(row[3] is None for row in want.values()) and any(row[3] is not None for row in want.values())
    topic = JobLayout.of(spec, settings).output_topic
    published = latest_per_key(settings.kafka, topic)  # keyed by the key's text
    assert {key: _published(value) for key, value in published.items()} == want
    # a key that never had a result (accounts of unknown customers) is never published, not even a tombstone
    assert {key for _partition, key, _value in every_record(settings.kafka, topic)}.isdisjoint({"c02", "c03"})
    reasons = {}
    for letter in first.dead_letters + second.dead_letters:
        reasons[letter.reason] = reasons.get(letter.reason, 0) + 1
    assert reasons == _refused(customers, accounts) == {"wrong_key": 2, "missing_key": 4, "undecodable": 2}


@pytest.mark.parametrize(("join", "cut"), [("inner", None), ("outer", 9)])
def test_inner_and_outer_joins_equal_the_reference(settings, kafka_broker, spark, unique, join, cut):
    """An inner join shows the customers with an account, an outer one every key either table holds (the
    missing side's fields null); a side's delete takes the inner join's row and the outer join's fields."""
    spec = _spec(unique, join)
    customers, accounts = customer_accounts.adversarial(count=200, seed=8)
    harness = JobHarness(settings=settings.replace(max_offsets_per_trigger=cut), spark=spark)
    for topic in spec.input_topics:
        ensure_topic(settings.kafka, topic, spec.source_partitions)
    customer_accounts.produce(settings.kafka, spec.source_topic, customers)
    customer_accounts.produce(settings.kafka, spec.join_topics[0], accounts)
    result = harness.run(spec, [])
    want = customer_accounts.expected_join(customers, accounts, join)
    assert _joined(result.outputs) == want
    left_only = customer_accounts.expected_join(customers, accounts, "left").keys() - want.keys()
    assert (join == "inner") == bool(left_only), left_only


def test_inputs_that_are_not_co_partitioned_are_refused_naming_both(settings, kafka_broker, spark, unique):
    spec = _spec(unique)
    ensure_topic(settings.kafka, spec.source_topic, 2)
    ensure_topic(settings.kafka, spec.join_topics[0], 3)
    with pytest.raises(JobSpecError, match="co-partitioned") as refused:
        run(spec, settings, available_now=True, spark=spark)
    for words in (f"{spec.source_topic} has 2 partitions", f"{spec.join_topics[0]} has 3 partitions"):
        assert words in str(refused.value)


def test_a_table_join_is_declared_and_checked():
    from pyspark.sql import types as T

    from spark_jobs.primitives import UpsertTable
    from spark_jobs.reference.jobs.customer_accounts import ACCOUNT_SCHEMA, CUSTOMER_ACCOUNTS

    spec = get_job("customer_accounts")
    CUSTOMER_ACCOUNTS.check(spec)
    assert CUSTOMER_ACCOUNTS.output_values == ("name", "tier", "account_id", "status", "balance")
    with pytest.raises(JobSpecError, match="job customer_accounts: join_topics: a TableJoin reads its right table"):
        CUSTOMER_ACCOUNTS.check(dataclasses.replace(spec, join_topics=()))
    with pytest.raises(JobSpecError, match="join: 'cross' is not one of"):
        dataclasses.replace(CUSTOMER_ACCOUNTS, join="cross").check(spec)
    named_twice = T.StructType([*ACCOUNT_SCHEMA.fields, T.StructField("name", T.StringType())])
    twice = dataclasses.replace(CUSTOMER_ACCOUNTS, right=UpsertTable(named_twice, key=("customer_id",)))
    with pytest.raises(JobSpecError, match="'name' is the key, a reserved name or a field of both tables"):
        twice.check(spec)
    dataclasses.replace(twice, right_prefix="account_").check(spec)
    keyed_otherwise = UpsertTable(ACCOUNT_SCHEMA, key=("customer_id", "account_id"))
    with pytest.raises(JobSpecError, match=r"right.key: a table join joins on the tables' key"):
        dataclasses.replace(CUSTOMER_ACCOUNTS, right=keyed_otherwise).check(spec)
    with pytest.raises(JobSpecError, match="must differ from each other and from source_topic"):
        dataclasses.replace(spec, join_topics=(spec.source_topic,))
    with pytest.raises(JobSpecError, match="repartition: a table join's sides are tables keyed by their key"):
        CUSTOMER_ACCOUNTS.check(dataclasses.replace(spec, repartition=True))


def test_the_readme_shows_the_whole_declaration_of_the_job():
    from pathlib import Path

    import spark_jobs.reference.jobs.customer_accounts as job
    from tests.helpers import docs_page, readme_declaration

    source = Path(job.__file__).read_text()
    for start in (
        "CUSTOMER_SCHEMA = T.StructType(",
        "ACCOUNT_SCHEMA = T.StructType(",
        "CUSTOMER_ACCOUNTS = TableJoin(",
    ):
        assert readme_declaration(start) in source, start
    page, spec = docs_page("writing-jobs/table-join.md"), get_job("customer_accounts")
    assert f'source_topic="{spec.source_topic}", join_topics=("{spec.join_topics[0]}",)' in page


def test_kafka_streams_joins_the_same_tables_to_the_same_rows(kafka_broker, settings, tmp_path, unique):
    """The bench's Kafka Streams twin (``customers.leftJoin(accounts)``, bench/kafka_streams) over the same
    tables' valid records: its output topic's compacted view is the reference's left join, which the platform's
    outputs are held to above. (Records the platform refuses are not given to it: Kafka Streams would read a
    key that is not a JSON object as another key.)"""
    from bench.kafka_streams_peer import OUTPUT_TOPIC_CONFIG, KafkaStreamsPeer, build

    customers, accounts = customer_accounts.adversarial(count=300, seed=5)
    customers, accounts = customer_accounts.valid(customers), customer_accounts.valid(accounts)
    topics = (f"ks-customers-{unique}", f"ks-accounts-{unique}")
    for topic, records in zip(topics, (customers, accounts), strict=True):
        ensure_topic(settings.kafka, topic, 2)
        customer_accounts.produce(settings.kafka, topic, records)
    application, output = f"ks-join-{unique}", f"ks-join-{unique}-out"
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)
    peer = KafkaStreamsPeer(
        build(), settings, "customer_accounts_left", application, tmp_path / application, ",".join(topics), output
    )
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0
    finally:
        peer.stop()
    published = latest_per_key(settings.kafka, output)
    assert {json.loads(key)["customer_id"]: _published(value) for key, value in published.items()} == (
        customer_accounts.expected_join(customers, accounts)
    )
