"""The main job: the whole path on the embedded stack, ending in a summary a person can check.

1. resolve JVM jars, start the local Kafka broker (and Airflow standalone);
2. create the source topic and produce a batch of realistic purchase events;
3. run the stateful ``purchase_counts`` job through ``spark-submit`` (the path Airflow uses) until it
   has processed everything available;
4. read the Delta output and print what happened, with a consistency check: the Delta table equals
   the per-user counts computed in plain Python over every event in the topic (closed accounts
   deleted).

Re-running is safe: each run adds a new batch of events (new seed) and the job continues from its
checkpoint, so totals grow and the check still holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from rich.console import Console
from rich.table import Table

from runtime import jvm
from runtime.airflow_standalone import LocalAirflow
from runtime.kafka_broker import LocalKafkaBroker
from runtime.kafka_connection import KafkaTarget
from runtime.settings import Settings

JOB = "purchase_counts"
console = Console(highlight=False, width=None if Console().is_terminal else 140)


def topic_record_count(kafka: KafkaTarget, topic: str) -> int:
    """Records currently in ``topic`` (sum over partitions of high minus low watermark)."""
    from spark_jobs.kafka_topics import partition_offsets

    return sum(high - low for low, high in partition_offsets(kafka, topic, 10).values())


def _next_seed(settings: Settings) -> int:
    counter = settings.status_dir / "demo-runs"
    counter.parent.mkdir(parents=True, exist_ok=True)
    runs = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(runs + 1))
    return 1000 + runs


def run_demo(settings: Settings, *, events: int, users: int, with_airflow: bool) -> int:
    from spark_jobs import kafka_topics
    from spark_jobs.dead_letter import dead_letter_topic
    from spark_jobs.generators import purchases
    from spark_jobs.registry import get_job
    from spark_jobs.run import report_path
    from spark_jobs.state.changelog import changelog_topic_name
    from spark_jobs.submit import submit_spec

    started = time.monotonic()
    spec = get_job(JOB)
    jvm.resolve(settings, log=console.print)

    with console.status("starting the Kafka broker…"):
        LocalKafkaBroker(settings).start()
    console.print(f"[green]✓[/green] Kafka broker at {settings.kafka}")
    if with_airflow:
        with console.status("starting Airflow standalone (first start migrates its database)…"):
            LocalAirflow(settings).start()
        console.print(f"[green]✓[/green] Airflow at {settings.airflow_url}")

    created = kafka_topics.ensure_topic(
        settings.kafka, spec.source_topic, spec.source_partitions, settings.kafka_replication_factor
    )
    seed = _next_seed(settings)
    batch = list(purchases.generate(events, users=users, seed=seed))
    with console.status(f"producing {len(batch):,} purchase events to '{spec.source_topic}'…"):
        purchases.produce(settings.kafka, spec.source_topic, batch)
    console.print(f"[green]✓[/green] produced {len(batch):,} events (seed {seed}) to topic '{spec.source_topic}'"
                  + (" (created)" if created else ""))  # fmt: skip

    submit = submit_spec(spec, settings, available_now=True)
    log_file = settings.logs_dir / f"{spec.application_id}.spark-submit.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with console.status(f"running {spec.application_id} with spark-submit (master {settings.spark_master})…"):
        with open(log_file, "w") as log:
            proc = subprocess.run(submit.command(), env={**os.environ, **submit.env}, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        console.print(f"[red]spark-submit failed ({proc.returncode}); see {log_file}[/red]")
        console.print("\n".join(log_file.read_text().splitlines()[-20:]))
        return 1
    report = json.loads(report_path(spec, settings).read_text())
    console.print(f"[green]✓[/green] {spec.application_id} processed {report['input_rows']:,} events "
                  f"in {report['batches']} micro-batch(es)")  # fmt: skip

    summary = _read_output(settings, report["output"])
    in_topic = topic_record_count(settings.kafka, spec.source_topic)
    # The check: Delta holds exactly what plain Python computes from every event in the topic.
    expected = purchases.expected_counts(kafka_topics.read_json_records(settings.kafka, spec.source_topic))
    summary["matches"] = summary.pop("state") == expected
    summary["changelogs"] = {
        name: topic_record_count(settings.kafka, name)
        for name in (changelog_topic_name(spec.application_id, s.name) for s in spec.stores)
    }
    dlq = dead_letter_topic(spec.application_id)
    summary["dead_letters"] = (dlq, topic_record_count(settings.kafka, dlq))
    _print_summary(settings, spec, report, summary, in_topic, time.monotonic() - started, log_file)
    if not summary["matches"]:
        console.print(f"[red]check failed: the Delta table {report['output']} differs from the counts computed "
                      f"in plain Python over the {in_topic:,} events of '{spec.source_topic}'[/red]")  # fmt: skip
        return 1
    return 0


def _read_output(settings: Settings, path: str) -> dict:
    """The output table's totals, top spenders and rows, read with delta-rs (no Spark session to start)."""
    from deltalake import DeltaTable

    with console.status("reading the Delta output…"):
        table = DeltaTable(path)
        rows = table.to_pyarrow_table(columns=["user_id", "purchases", "amount_spent", "last_purchase_at"]).to_pylist()
    top = sorted(rows, key=lambda r: r["amount_spent"], reverse=True)[:5]
    return {"keys": len(rows), "total_purchases": sum(r["purchases"] or 0 for r in rows), "top": top,
            "version": table.version(), "state": {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in rows}}  # fmt: skip


def _print_summary(settings, spec, report, summary, in_topic, elapsed, log_file) -> None:
    table = Table(title=f"{spec.application_id}: summary", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("events in (this run)", f"{report['input_rows']:,}"),
        ("events in topic (all runs)", f"{in_topic:,}"),
        ("keys in state", f"{report['state_rows']:,} users ({report['state_memory_bytes']:,} bytes in RocksDB)"),
        ("outputs written", f"{summary['keys']:,} rows in Delta (table version {summary['version']})"),
        ("check", "[green]OK[/green]: Delta = plain-Python counts over every event in the topic"
         if summary["matches"] else "[red]MISMATCH[/red]"),
        ("purchases counted", f"{summary['total_purchases']:,} (closed accounts' purchases are deleted)"),
        ("input offsets", json.dumps(report["end_offsets"])),
        *[("changelog", f"{name}: {count:,} records (compacted; latest value per key = state)")
          for name, count in summary["changelogs"].items()],
        ("dead letters", f"{summary['dead_letters'][0]}: {summary['dead_letters'][1]:,} records"),
        ("status", str(settings.status_dir / f"{spec.application_id}.status.json")),
        ("Delta table", report["output"]),
        ("checkpoint", report["checkpoint"]),
        ("topic", f"{spec.source_topic} @ {settings.kafka}"),
        ("Airflow UI", f"{settings.airflow_url}  (DAG drain__{spec.name})"),
        *[("state query", f"{settings.airflow_url}/state-api/jobs/{spec.name}/stores/{spec.stores[0].name}/keys/"
           f"{summary['top'][0]['user_id']}  (from the Delta snapshot while the job is stopped)")][: 1 if summary["top"] else 0],
        ("spark-submit log", str(log_file)),
        ("elapsed", f"{elapsed:.0f} s"),
    ]  # fmt: skip
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    top = Table(title="top spenders")
    for column in ("user_id", "purchases", "amount_spent", "last_purchase_at"):
        top.add_column(column)
    for row in summary["top"]:
        top.add_row(row["user_id"], str(row["purchases"]), str(row["amount_spent"]), str(row["last_purchase_at"]))
    console.print(top)
