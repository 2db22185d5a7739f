"""purchase_counts' two processors, Java (the job's default) and Python (the one to subclass), run the
same micro-batches from the same restored state and must write the same change rows: changelogs,
snapshots and restores rely on that, whichever one ran."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from pyspark.sql import Row
from pyspark.sql import types as T

from spark_jobs.reference.jobs.purchase_counts import (
    CHANGE_DDL,
    EVENT_SCHEMA,
    STATE_DDL,
    PurchaseCounter,
    state_changes,
)
from tests.helpers import collect_available_now, file_stream

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 11, 1, 12, 0, 0)


def _event(offset: int, kind: str, user: str, amount: str | None = None, minute: int = 0) -> Row:
    return Row(
        event_id=f"e{offset}",
        type=kind,
        user_id=user,
        item="book" if amount else None,
        amount=Decimal(amount) if amount else None,
        event_time=T0 + dt.timedelta(minutes=minute),
        offset=offset,
    )


# Two micro-batches. Rows of one user are deliberately out of offset order where it matters (the
# processors sort by offset); event times are out of order too (last_purchase_at is the latest).
BATCHES = [
    [
        _event(2, "purchase", "a", "5.50", minute=9),
        _event(1, "purchase", "a", "4.50", minute=3),
        _event(3, "purchase", "b", "1.00"),
        _event(4, "account_closed", "b"),  # created and closed: tombstone
        _event(5, "account_closed", "c"),  # closing an unknown user: tombstone (the outputs may hold it)
        _event(6, "purchase", "r", "2.00", minute=1),  # restored user: counts on from the restored value
        _event(7, "account_closed", "s"),  # restored user closed: tombstone
        _event(9, "account_closed", "d"),
        _event(8, "purchase", "d", "3.00"),  # purchase, then closed
        _event(10, "purchase", "e", "7.25", minute=2),
    ],
    [
        _event(12, "purchase", "a", "1.00", minute=5),
        _event(11, "account_closed", "a"),  # reset, then 1
        _event(13, "account_closed", "e"),
        _event(14, "purchase", "f", "0.00"),
    ],
]
RESTORED = [
    Row(key="r", purchases=10, amount_spent=Decimal("100.00"), last_purchase_at=T0, touched_at_ms=1),
    Row(key="s", purchases=2, amount_spent=Decimal("3.00"), last_purchase_at=T0, touched_at_ms=1),
]
EXPECTED = {
    (0, "a", False, 2, Decimal("10.00"), T0 + dt.timedelta(minutes=9)),
    (0, "r", False, 11, Decimal("102.00"), T0 + dt.timedelta(minutes=1)),
    (0, "s", True, None, None, None),
    (0, "b", True, None, None, None),
    (0, "c", True, None, None, None),
    (0, "d", True, None, None, None),
    (0, "e", False, 1, Decimal("7.25"), T0 + dt.timedelta(minutes=2)),
    (1, "a", False, 1, Decimal("1.00"), T0 + dt.timedelta(minutes=5)),
    (1, "e", True, None, None, None),
    (1, "f", False, 1, Decimal("0.00"), T0),
}


def _changes(spark, tmp_path, name: str, processor) -> set[tuple]:
    schema = T.StructType([*EVENT_SCHEMA.fields, T.StructField("offset", T.LongType())])
    events = file_stream(spark, BATCHES, schema, tmp_path / f"events-{name}")
    initial = spark.createDataFrame(RESTORED, f"key STRING, {STATE_DDL}")

    def row_of(row, batch_id: int) -> tuple:
        assert row.tombstone or row.touched_at_ms > 0, row
        return (batch_id, row.key, row.tombstone, row.purchases, row.amount_spent, row.last_purchase_at)

    changes = state_changes(events, initial, None, processor)
    assert [f.simpleString() for f in changes.schema.fields] == [
        f.simpleString() for f in spark.createDataFrame([], CHANGE_DDL).schema.fields
    ]
    return collect_available_now(changes, "update", tmp_path / f"checkpoint-{name}", row_of)


def test_java_and_python_processors_write_the_same_changes(spark, tmp_path):
    java = _changes(spark, tmp_path, "java", None)
    python = _changes(spark, tmp_path, "python", PurchaseCounter)
    assert java == EXPECTED
    assert python == EXPECTED
