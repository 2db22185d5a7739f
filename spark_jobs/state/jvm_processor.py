"""Calling a Java ``transformWithState`` processor of ``jvm/state-processors`` from a Python job.

Each processor class has a static ``changes(events, keyColumn, initial, ...)`` that groups ``events``
by ``keyColumn``, runs the processor (seeded with ``initial`` after a restore) and returns its output
rows; this wraps the py4j call so a job passes and gets DataFrames.
"""

from __future__ import annotations

from pyspark.sql import DataFrame


def jvm_changes(class_name: str, events: DataFrame, key_column: str, initial: DataFrame | None, *args) -> DataFrame:
    """``streamstate.jobs.<class_name>.changes(events, key_column, initial, *args)`` as a DataFrame."""
    spark = events.sparkSession
    processor = getattr(spark._jvm.streamstate.jobs, class_name)
    jdf = processor.changes(events._jdf, key_column, None if initial is None else initial._jdf, *args)
    return DataFrame(jdf, spark)
