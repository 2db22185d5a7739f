"""Independent reference computations and Kafka read-back used by the tests (plain Python)."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path

from runtime.alert_inbox import AlertInbox
from runtime.kafka_connection import client_config
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import read_status
from spark_jobs.io.kafka_topics import partition_offsets
from spark_jobs.io.kafka_topics import read_json_records as read_topic  # noqa: F401
from spark_jobs.layout import job_of
from spark_jobs.reference.generators.purchases import expected_counts as expected_purchase_counts  # noqa: F401

#: jobs the suite's Airflow standalone registers beside the built-in ones (the ``airflow`` fixture): a job
#: with two versions for the browser test of the reprocessing form's migrate mode (tests/fixtures/ui_jobs.py)
STACK_JOB_MODULES = "tests.fixtures.ui_jobs"


def delta_purchase_counts(spark, path: str) -> dict[str, tuple[int, Decimal]]:
    return {r.user_id: (r.purchases, r.amount_spent) for r in spark.read.format("delta").load(path).collect()}


def purchase_counts_copy(prefix: str, unique: str, bootstrap_servers: str, **changes):
    """purchase_counts' current spec under a name, topic and table of the test's own (its source topic
    created), with ``changes`` (e.g. another ``entrypoint`` or ``stores``)."""
    import dataclasses

    from spark_jobs.io.kafka_topics import ensure_topic
    from spark_jobs.registry import get_job

    spec = dataclasses.replace(
        get_job("purchase_counts"),
        name=f"{prefix}_{unique}",
        source_topic=f"{prefix}-{unique}",
        output_table=f"{prefix}_{unique}",
        **changes,
    )
    ensure_topic(bootstrap_servers, spec.source_topic, spec.source_partitions)
    return spec


def purchase_batches(*shapes: tuple[int, int, int]) -> list[list[dict]]:
    """One list of purchase events per (count, users, seed)."""
    from spark_jobs.reference.generators import purchases

    return [list(purchases.generate(n, users=users, seed=seed)) for n, users, seed in shapes]


def end_offsets(bootstrap_servers: str, topic: str) -> dict[int, int]:
    """partition -> high watermark (the next offset to be written) of ``topic``."""
    return {p: high for p, (_, high) in partition_offsets(bootstrap_servers, topic, 10).items()}


def write_changelog_batch(writer, batch_id: int, changes: dict[bytes, bytes | None]) -> None:
    """One complete changelog batch as a driver writes it (``writer``: a ChangelogWriter): the changes
    (None: a tombstone), then a marker per partition. No Spark needed."""
    from confluent_kafka import Producer

    from spark_jobs.state.batch_records import BATCH_HEADER, BatchMarker

    producer = Producer(client_config(writer.kafka, {"enable.idempotence": True, "acks": "all"}))
    for key, value in changes.items():
        producer.produce(
            writer.topic.name,
            key=key,
            value=value,
            partition=key[0] % writer.topic.partitions,
            headers=[(BATCH_HEADER, str(batch_id).encode())],
        )
    assert producer.flush(60) == 0
    writer._write_markers(BatchMarker(batch_id, {"in": {0: batch_id + 1}}, len(changes)))


def wait_for(predicate, timeout_s: float, what: str, diagnose=None):
    """Poll ``predicate`` every 0.5 s until it returns something truthy (returned), or fail naming ``what``
    (and what ``diagnose()`` says about the state of things, when given)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    details = f"\n{diagnose()}" if diagnose else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{details}")


#: a local alert webhook (the tests' name for it)
WebhookReceiver = AlertInbox


def collect_available_now(stream, output_mode: str, checkpoint, row_of) -> set[tuple]:
    """Run ``stream`` (a streaming DataFrame) over everything available, one micro-batch per source
    file, and return ``row_of(row, batch_id)`` of every output row; a row seen twice fails."""
    seen: list[tuple] = []

    def collect(batch, batch_id: int) -> None:
        seen.extend(row_of(row, batch_id) for row in batch.collect())

    query = (
        stream.writeStream.outputMode(output_mode)
        .foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    assert len(seen) == len(set(seen)), f"a row was written twice: {sorted(seen)}"
    return set(seen)


def state_key_schema(spark, checkpoint, state_name: str) -> str:
    """The key schema a checkpoint's ``transformWithState`` holds for its state ``state_name`` (Spark's
    ``statestore`` reader), e.g. ``struct<value:string>``: what a later build must group by for the checkpoint to
    find its state."""
    state = spark.read.format("statestore").option("stateVarName", state_name).load(str(checkpoint))
    return state.schema["key"].dataType.simpleString()


def source_rows(events: list[dict], schema, key_field: str, partitions: int, timestamp) -> list:
    """``events`` as a Kafka source's decoded rows: ``schema``'s fields (ISO times parsed) plus the
    ``partition`` (Kafka's murmur2 of the key), ``offset``, ``timestamp`` and ``value`` (the event id's bytes)
    a job's processor reads after classification. Add :func:`with_source_columns` of ``schema`` to read them."""
    import datetime as dt

    from pyspark.sql import Row

    from spark_jobs.reference.generators.producer import kafka_partition

    times = {f.name for f in schema.fields if f.dataType.simpleString() == "timestamp"}
    offsets = dict.fromkeys(range(partitions), 0)
    rows = []
    for event in events:
        fields = {f.name: event.get(f.name) for f in schema.fields}
        for name in times & fields.keys():
            fields[name] = dt.datetime.fromisoformat(fields[name].replace("Z", "+00:00")) if fields[name] else None
        p = kafka_partition(event[key_field], partitions)
        rows.append(
            Row(**fields, partition=p, offset=offsets[p], timestamp=timestamp, value=event["event_id"].encode())
        )
        offsets[p] += 1
    return rows


def with_source_columns(schema):
    """``schema`` plus the source columns :func:`source_rows` adds."""
    from pyspark.sql import types as T

    return T.StructType(
        [
            *schema.fields,
            T.StructField("partition", T.IntegerType()),
            T.StructField("offset", T.LongType()),
            T.StructField("timestamp", T.TimestampType()),
            T.StructField("value", T.BinaryType()),
        ]
    )


def file_stream(spark, batches: list[list], schema, directory):
    """A streaming DataFrame that reads ``batches`` (lists of rows) back as one micro-batch each."""
    for number, rows in enumerate(batches):
        spark.createDataFrame(rows, schema).coalesce(1).write.parquet(str(directory / f"batch={number}"))
    return (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .option("recursiveFileLookup", "true")
        .parquet(str(directory))
    )


def scrape_metrics(host: str, port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One scrape of a process's Prometheus endpoint: (sample name, sorted labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def driver_pids(application_id: str) -> set[int]:
    """Python drivers of the job (the processes that take the lease), from the process table."""
    name = job_of(application_id).encode()
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if any(part.endswith(b"spark_jobs/driver/run.py") for part in cmd) and name in cmd and b"java" not in cmd[0]:
            pids.add(int(entry.name))
    return pids


def driver_diagnosis(settings, application_id: str) -> str:
    """What a timed-out wait on a driver shows: its lease, status and the tail of its newest log."""
    status = read_status(settings.status_dir, application_id)
    logs = sorted((settings.logs_dir / "jobs").glob(f"{application_id}-*.log"), key=lambda p: p.stat().st_mtime)
    tail = logs[-1].read_text(errors="replace")[-3000:] if logs else "(no driver log)"
    return (
        f"lease: {JobLease(settings.status_dir, application_id).holder()}\n"
        f"status: {status}\n"
        f"newest driver log ({logs[-1].name if logs else '-'}):\n{tail}"
    )


def wait_for_success(airflow, dag_id: str, run_id: str, timeout_s: float = 300, diagnose=lambda: "") -> None:
    """Wait for a DAG run triggered through the API or the UI; when it fails, the assertion shows its tasks'
    logs (and ``diagnose()``): the stack is gone by the time a CI run reports the failure."""
    state = airflow.wait_for_run(dag_id, run_id, timeout_s=timeout_s)
    assert state == "success", f"{dag_id} run {run_id}: {state}\n{airflow.task_logs(dag_id, run_id)}\n{diagnose()}"


def age_delta_removals(path: Path, days: float) -> None:
    """Removals as if committed ``days`` ago: vacuum goes by the remove actions' ``deletionTimestamp``."""
    shift = int(days * 86_400_000)
    for commit in (path / "_delta_log").glob("*.json"):
        lines = []
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "remove" in action and action["remove"].get("deletionTimestamp"):
                action["remove"]["deletionTimestamp"] -= shift
            lines.append(json.dumps(action))
        commit.write_text("\n".join(lines) + "\n")


#: the repository's documentation: README.md and the site's pages (docs/, mkdocs.yml)
DOCUMENTATION = (Path(__file__).parents[1] / "README.md", *sorted((Path(__file__).parents[1] / "docs").rglob("*.md")))


def docs_page(page: str) -> str:
    """The text of the documentation site's page ``page`` (a path under docs/, e.g. ``writing-jobs/top-n.md``)."""
    return (Path(__file__).parents[1] / "docs" / page).read_text()


def documentation_text() -> str:
    """README.md and every page of the site, one text: what the documentation promises, wherever a page says it."""
    return "\n".join(path.read_text() for path in DOCUMENTATION)


def readme_declaration(start: str) -> str:
    """The documentation's Python block (README.md or a page of docs/) from the line starting with ``start`` to its
    closing ``)`` line: what a test holds to the job module's own source (a page shows a declaration whole, and it
    must stay the real one)."""
    text = next((t for t in map(Path.read_text, DOCUMENTATION) if start in t), None)
    assert text is not None, f"no page of the documentation shows {start!r}"
    declaration = text[text.index(start) :]
    return declaration[: declaration.index("\n)\n") + 3]


def rate_limited_cuts(sizes: dict, limit: int) -> list[dict]:
    """Where Spark's Kafka source ends each micro-batch under ``maxOffsetsPerTrigger`` = ``limit``, over an input
    that is all there when the query starts: ``sizes`` (place, e.g. a (topic, partition), -> records from the
    query's start to the end) -> one dict per batch, place -> records read by the end of that batch.

    ``KafkaMicroBatchStream.rateLimit``: each batch shares ``limit`` among the places with records left, in
    proportion to what each has left, a share below 1 rounded up (no place starves), a larger one down. The cuts
    depend only on where a batch starts, so a driver killed and restarted at a batch's start (from its checkpoint,
    or from a restore at a committed batch's end) cuts the rest as an uninterrupted run would."""
    import math

    read, cuts = dict.fromkeys(sizes, 0), []
    while any(read[place] < size for place, size in sizes.items()):
        left = {place: size - read[place] for place, size in sizes.items() if size > read[place]}
        total = sum(left.values())
        for place, n in left.items():
            share = limit * (n / total)  # as Spark computes it, in doubles
            read[place] = min(sizes[place], read[place] + (math.ceil(share) if share < 1 else math.floor(share)))
        cuts.append(dict(read))
    return cuts


def order_payment_cuts(kafka, spec, limit: int) -> list[dict]:
    """:func:`rate_limited_cuts` of an ``order_payments`` copy's two topics, as (side, partition) -> end offset
    (``payments.expected_join_in_cuts``)."""
    from spark_jobs.reference.generators import payments

    sides = {spec.source_topic: payments.ORDER, spec.join_topics[0]: payments.PAYMENT}
    sizes = {
        (side, p): high for topic, side in sides.items() for p, (_low, high) in partition_offsets(kafka, topic).items()
    }
    return rate_limited_cuts(sizes, limit)


def every_record(kafka, topic: str) -> list[tuple[int, str, bytes | None]]:
    """Every committed record of ``topic``: (partition, key as text, value), each partition in offset order."""
    from confluent_kafka import Consumer

    from spark_jobs.io.kafka_topics import read_partition

    settings = {"group.id": f"read-{topic}", "enable.partition.eof": True, "isolation.level": "read_committed"}
    consumer = Consumer(client_config(kafka, settings))
    try:
        return [
            (partition, msg.key().decode(), msg.value())
            for partition in partition_offsets(kafka, topic)
            for msg in read_partition(consumer, topic, partition)
        ]
    finally:
        consumer.close()
