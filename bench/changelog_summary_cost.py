"""What a long changelog range's first pass costs (spark_jobs/state/changelog_spark.py: the summary a Spark
snapshot or restore plans its cut from), in the shape it has now and in the one it had before 2026-12-03.

The records are made in memory and cached before timing (two source partitions, a marker every
``--batch-records`` records of a partition, keys with a store's long shared prefix), so what is timed is the
aggregation, not a Kafka read:

* **now**: :func:`spark_jobs.state.changelog_spark._summarize_in_spark`: a marker is a group of its own, every
  aggregate fixed-width (Spark's generated hash aggregation);
* **before**: the markers gathered per (partition, batch) by ``collect_list``, which makes the aggregation Spark's
  interpreted object hash aggregation.

Both must find the same markers and spans (checked). Each runs ``--repeats`` times, the two in turn; the report gives every run's
seconds and the fastest::

    .venv/bin/python bench/changelog_summary_cost.py [--records 2000000] [--batch-records 80000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.settings import Settings  # noqa: E402
from spark_jobs.driver.session import build_spark_session  # noqa: E402
from spark_jobs.state import changelog_spark  # noqa: E402
from spark_jobs.state.batch_records import MARKER_KEY, BatchMarker  # noqa: E402
from spark_jobs.state.cut_rules import BatchSpan, MarkerRecord  # noqa: E402


def records(spark, count: int, batch_records: int):
    """DataFrame(partition, offset, key, value, timestamp_ms, batch_id), as changelog_spark._records reads one."""
    from pyspark.sql import functions as F

    marker = BatchMarker(0, {"in": {0: 1}}, batch_records).to_bytes()
    offset = (F.col("id") / 2).cast("long")
    is_marker = offset % batch_records == batch_records - 1
    return (
        spark.range(count, numPartitions=2)
        .select(
            (F.col("id") % 2).cast("int").alias("partition"),
            offset.alias("offset"),
            F.when(is_marker, F.lit(MARKER_KEY))
            .otherwise(F.format_string("~window@%d@left@order-%09d", F.col("id") % 2, (F.col("id") * 7919) % count))
            .alias("key"),
            F.when(is_marker, F.lit(marker))
            .otherwise(F.format_string('{"side":"left","records":[{"time":%d,"amount":12.5}]}', "id").cast("binary"))
            .alias("value"),
            (F.col("id") + 1_700_000_000_000).alias("timestamp_ms"),
            (offset / batch_records).cast("long").alias("batch_id"),
        )
        .persist()
    )


def summarized_before(frame, is_marker) -> tuple[list[MarkerRecord], list[BatchSpan]]:
    """The first pass as it was before 2026-12-03 (the markers collected as a list per group)."""
    from pyspark.sql import functions as F

    summary = (
        frame.groupBy("partition", "batch_id", is_marker.alias("is_marker"))
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.min("offset").alias("first_offset"),
            F.max("offset").alias("last_offset"),
            F.collect_list(F.when(is_marker, F.struct("offset", "value", "timestamp_ms"))).alias("markers"),
        )
        .collect()
    )
    markers = [
        MarkerRecord(row["partition"], m["offset"], BatchMarker.from_bytes(bytes(m["value"])), m["timestamp_ms"])
        for row in summary
        if row["is_marker"]
        for m in row["markers"]
    ]
    spans = [
        BatchSpan(row["partition"], row["batch_id"], row["records"], row["first_offset"], row["last_offset"])
        for row in summary
        if not row["is_marker"]
    ]
    return markers, spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--batch-records", type=int, default=80_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spark = build_spark_session(Settings.from_env(), "changelog-summary-cost")
    frame = records(spark, args.records, args.batch_records)
    frame.count()
    is_marker = frame["key"] == MARKER_KEY
    shapes = {"now": changelog_spark._summarize_in_spark, "before": summarized_before}
    found, seconds = {}, {name: [] for name in shapes}
    for _ in range(args.repeats):  # alternating, so that the machine's moods fall on both
        for name, summarize in shapes.items():
            started = time.perf_counter()
            found[name] = summarize(frame, is_marker)
            seconds[name].append(time.perf_counter() - started)
    print(f"| shape ({args.records:,} records) | fastest s | every run, s |\n|---|---:|---|")
    for name, runs in seconds.items():
        print(f"| {name} | {min(runs):.2f} | {', '.join(f'{s:.2f}' for s in runs)} |")
    assert [sorted(x, key=repr) for x in found["now"]] == [sorted(x, key=repr) for x in found["before"]], "summaries"
    spark.stop()


if __name__ == "__main__":
    main()
