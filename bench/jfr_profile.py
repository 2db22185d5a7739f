"""Where a driver's executor tasks spend their time, from a Java Flight Recorder file: each sample of a task
thread named by the **innermost** frame that belongs to a known part (its own work, not what called it).

Why innermost: a stage's operators run nested in one thread (the Kafka read and decoding inside the processor's
input iterator, the processor inside the batch cache's builder, all inside the shuffle writer). A sample
attributed to the first part found anywhere in its stack charges the outer ones for their callees: the batch
cache's builder pulls the processor's rows, so "any frame in the cache" counted the processor as the cache (21%
of payments' samples on 2026-12-03 in BENCHMARKS.md; 7.5% of enrichment's by this tool the same day).

Record a run with the driver's flight recorder on, then read the file::

    STREAMSTATE_SPARK_DRIVER_JAVA_OPTIONS="-XX:StartFlightRecording=filename=/tmp/jfr/,settings=profile" \\
        .venv/bin/python bench/compare.py --workloads payments --events 1000000 --repeats 1 --peers platform
    .venv/bin/python bench/jfr_profile.py /tmp/jfr/*.jfr [--processor-methods 12]

Prints a Markdown table (samples and share per part) and, with ``--processor-methods``, the platform's Java
methods (``streamstate.*``) that the samples of its processors fell in.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime import jvm  # noqa: E402
from runtime.settings import Settings  # noqa: E402

#: the parts of a task's work, each a test of one frame (``package.Class.method``); the first that matches,
#: from the innermost frame outwards, names the sample
PARTS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("processor rows to Spark rows (the output's serializer)", lambda f: "serializefromobject" in f),
    ("state encoding (Avro)", lambda f: "org.apache.avro" in f or ".sql.avro." in f),
    ("state store (RocksDB)", lambda f: "org.rocksdb" in f or "RocksDB" in f or "StateStore" in f),
    ("batch cache (columnar build and read)", lambda f: ".execution.columnar." in f),
    ("JSON decoding", lambda f: "JsonDecoder" in f or "com.fasterxml.jackson.core.json" in f),
    ("Kafka reads", lambda f: "org.apache.kafka.clients.consumer" in f or ".kafka010.consumer." in f),
    ("Kafka writes", lambda f: "org.apache.kafka.clients.producer" in f or "KafkaWriteTask" in f),
    ("shuffle", lambda f: "org.apache.spark.shuffle" in f or "DiskBlockObjectWriter" in f),
    ("compression", lambda f: "lz4" in f.lower() or "zstd" in f.lower() or "snappy" in f.lower()),
    ("the platform's processors (streamstate.*)", lambda f: f.startswith("streamstate.")),
    ("sorts", lambda f: "UnsafeExternalSorter" in f or "UnsafeInMemorySorter" in f),
    ("aggregations", lambda f: "Aggregat" in f),
    ("Arrow (rows collected by the driver)", lambda f: "arrow" in f.lower()),
    ("Delta and Parquet", lambda f: "delta" in f.lower() or "parquet" in f.lower()),
    ("Spark's generated code (projections, filters, stages)", lambda f: "GeneratedClass" in f),
    ("Spark's row conversions", lambda f: "CatalystTypeConverters" in f or "ExpressionEncoder" in f),
)
OTHER = "other (JDK and Scala frames only)"
#: parts that own everything under them, wherever in the stack: the work is theirs whatever it calls
OWNERS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    (
        "state handles made per task and batch (encoders, column families)",
        lambda f: "StatefulProcessorHandleImpl.get" in f,
    ),
)
#: what a stage of Spark's generated code feeds, by the first frame above it that is not generated code
CONSUMERS: tuple[tuple[str, str], ...] = (
    ("DefaultCachedBatchSerializer", "the batch cache"),
    ("ShuffleWriter", "a shuffle"),
    ("KafkaWriteTask", "a Kafka write"),
    ("ArrowConverters", "the driver (Arrow)"),
    ("WritingSparkTask", "a sink (noop, Delta)"),
    ("FileFormatWriter", "a file write"),
    ("ObjectAggregationIterator", "an object aggregation (interpreted)"),
    ("SortAggregateExec", "a sort aggregation"),
    ("Ordering.compare", "a sort's comparisons"),
    ("ExpressionEncoder$Serializer", "an encoder (objects to rows)"),
)


def samples(recording: Path) -> Iterable[tuple[str, list[str]]]:
    """(thread name, frames innermost first) of every execution sample in ``recording``."""
    jfr = Path(jvm.java_binary(Settings.from_env())).with_name("jfr")
    printed = subprocess.run(
        [str(jfr), "print", "--json", "--stack-depth", "128", "--events", "jdk.ExecutionSample", str(recording)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for event in json.loads(printed)["recording"]["events"]:
        values = event["values"]
        thread = (values.get("sampledThread") or {}).get("javaName") or ""
        frames = (values.get("stackTrace") or {}).get("frames", [])
        yield thread, [f"{fr['method']['type']['name'].replace('/', '.')}.{fr['method']['name']}" for fr in frames]


def part_of(frames: list[str]) -> str:
    """The part of an owner found anywhere in ``frames``, else the one the innermost matching frame belongs to
    (Spark's generated code named by what its stage feeds)."""
    for name, matches in OWNERS:
        if any(matches(frame) for frame in frames):
            return name
    for at, frame in enumerate(frames):
        for name, matches in PARTS:
            if matches(frame):
                return f"{name}, feeding {_consumer(frames[at:])}" if name.startswith("Spark's generated") else name
    return OTHER


def _consumer(frames: list[str]) -> str:
    """What the generated code at ``frames[0]`` produces rows for."""
    for frame in frames:
        for marker, consumer in CONSUMERS:
            if marker in frame:
                return consumer
    return "another operator"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", nargs="+", type=Path)
    parser.add_argument("--processor-methods", type=int, default=0, help="list this many streamstate.* methods")
    args = parser.parse_args()
    parts: collections.Counter[str] = collections.Counter()
    methods: collections.Counter[str] = collections.Counter()
    for recording in args.recordings:
        for thread, frames in samples(recording):
            if not thread.startswith("Executor task launch"):
                continue
            part = part_of(frames)
            parts[part] += 1
            if part.startswith("the platform's processors"):
                methods[next(f for f in frames if f.startswith("streamstate."))] += 1
    total = sum(parts.values())
    print("| part of the tasks' work (innermost frame) | samples | share |\n|---|---:|---:|")
    for name, count in parts.most_common():
        print(f"| {name} | {count:,} | {100 * count / total:.1f}% |")
    print(f"| all task samples | {total:,} | 100% |")
    if args.processor_methods:
        print("\n| the processors' own methods | samples |\n|---|---:|")
        for method, count in methods.most_common(args.processor_methods):
            print(f"| `{method.removeprefix('streamstate.')}` | {count:,} |")


if __name__ == "__main__":
    main()
