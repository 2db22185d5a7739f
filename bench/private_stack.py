"""What the single-figure benchmarks share: a Kafka broker of their own, and where their section goes."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from runtime.kafka_broker import LocalKafkaBroker
from runtime.process import free_port
from runtime.settings import PROJECT_ROOT, Settings


@contextlib.contextmanager
def private_broker(prefix: str) -> Iterator[Settings]:
    """Settings for a local broker on free ports with a fresh data directory; the broker runs inside. The
    drivers' extra JVM options come from ``STREAMSTATE_SPARK_DRIVER_JAVA_OPTIONS`` (a profiler, GC logging);
    every other setting is the default."""
    ports = sorted({free_port() for _ in range(3)})
    settings = Settings(
        data_dir=Path(tempfile.mkdtemp(prefix=prefix)),
        kafka_port=ports[0],
        kafka_controller_port=ports[1],
        airflow_port=ports[2],
        spark_driver_java_options=Settings.from_env().spark_driver_java_options,
    )
    broker = LocalKafkaBroker(settings)
    broker.start()
    try:
        yield settings
    finally:
        broker.stop()


def append_section(lines: list[str], console: Console) -> None:
    """Print a benchmark's BENCHMARKS.md section and append it there (each run adds a dated section)."""
    text = "\n".join(lines)
    console.print(text)
    with open(PROJECT_ROOT / "BENCHMARKS.md", "a") as out:
        out.write("\n" + text)
