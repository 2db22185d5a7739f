"""The keyed-aggregate primitive (spark_jobs/primitives): a declaration is checked before anything runs, and
the generic Java processor computes what an independent Python reference of the documented semantics
computes (every aggregate kind, nulls, where, delete, restored state, out-of-order offsets), whatever the
micro-batching."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from decimal import Decimal

import pytest
from pyspark.sql import Row
from pyspark.sql import types as T

from spark_jobs.driver.session import session_conf
from spark_jobs.primitives import Aggregate, JsonEvents, KeyedAggregate
from spark_jobs.primitives.pipeline import IN_MEMORY_QUERY_CONF
from spark_jobs.reference.jobs import purchase_counts
from spark_jobs.registry import JobSpec, JobSpecError, StoreSpec, registered_versions
from tests.helpers import collect_available_now, file_stream, state_key_schema

SCHEMA = T.StructType(
    [
        T.StructField("user", T.StringType()),
        T.StructField("type", T.StringType()),
        T.StructField("qty", T.IntegerType()),
        T.StructField("price", T.DoubleType()),
        T.StructField("amount", T.DecimalType(10, 2)),
        T.StructField("at", T.TimestampType()),
        T.StructField("note", T.StringType()),
    ]
)

EVERY_KIND = KeyedAggregate(
    store="totals",
    events=JsonEvents(SCHEMA, types=("buy", "view", "erase")),
    values={
        "events": Aggregate.count(),
        "notes": Aggregate.count("note"),
        "qty": Aggregate.sum("qty"),
        "spent": Aggregate.sum("amount"),
        "price_total": Aggregate.sum("price"),
        "cheapest": Aggregate.min("amount"),
        "first_at": Aggregate.min("at"),
        "last_at": Aggregate.max("at"),
        "last_note": Aggregate.latest("note"),
        "revenue": Aggregate.sum("qty * amount", type="DECIMAL(20,2)"),
    },
    where="type <> 'view'",
    delete_when="type = 'erase'",
)
SPEC = JobSpec(
    name="every_kind",
    version=1,
    source_topic="every-kind",
    key_field="user",
    output_table="every_kind",
    entrypoint="tests.spark_jobs.test_keyed_aggregate:EVERY_KIND",
    stores=(StoreSpec("totals"),),
)


def test_the_state_format_follows_from_the_declaration():
    EVERY_KIND.check(SPEC)
    assert EVERY_KIND.state_ddl == (
        "events BIGINT, notes BIGINT, qty BIGINT, spent DECIMAL(20,2), price_total DOUBLE, cheapest DECIMAL(10,2), "
        "first_at TIMESTAMP, last_at TIMESTAMP, last_note STRING, revenue DECIMAL(20,2), touched_at_ms BIGINT"
    )
    # purchase_counts, rewritten as a declaration, keeps the store format its versions already wrote
    assert purchase_counts.STATE_DDL == (
        "purchases BIGINT, amount_spent DECIMAL(22,2), last_purchase_at TIMESTAMP, touched_at_ms BIGINT"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"store": "nope"}, "job every_kind has no store 'nope'"),
        ({"values": {}}, "job every_kind: values: declare at least one aggregate"),
        ({"values": {"touched_at_ms": Aggregate.count()}}, "job every_kind: values.touched_at_ms: use lower-case"),
        ({"values": {"user": Aggregate.count()}}, "job every_kind: values.user: use lower-case"),
        ({"values": {"x": Aggregate.sum("note")}}, "job every_kind: values.x: cannot sum 'note', a string field"),
        (
            {"values": {"x": Aggregate.max("qty * 2")}},
            "job every_kind: values.x: 'qty * 2' is not a field of the event",
        ),
        ({"values": {"x": Aggregate.sum("qty", type="STRING")}}, "job every_kind: values.x: a sum is stored as BIGINT"),
        ({"values": {"x": Aggregate("median", "qty")}}, "job every_kind: values.x: unknown aggregate 'median'"),
        (
            {"events": JsonEvents(T.StructType([f for f in SCHEMA.fields if f.name != "type"]))},
            None,
        ),  # fine: no type vocabulary
    ],
)
def test_a_declaration_that_cannot_run_is_refused_naming_the_job_and_field(change, message):
    declaration = dataclasses.replace(EVERY_KIND, **change)
    if message is None:
        declaration.check(SPEC)
        return
    with pytest.raises(JobSpecError, match=message.replace("(", r"\(").replace("*", r"\*")):
        declaration.check(SPEC)


def test_a_spec_that_does_not_fit_the_declaration_is_refused():
    with pytest.raises(JobSpecError, match="job every_kind: key_field 'owner' is not a field of the event schema"):
        EVERY_KIND.check(dataclasses.replace(SPEC, key_field="owner"))
    with pytest.raises(JobSpecError, match="job every_kind: key_field 'qty' must be a string field"):
        EVERY_KIND.check(dataclasses.replace(SPEC, key_field="qty"))
    windowed = StoreSpec("totals", kind="windowed", retention_ms=60_000, window_ms=10_000)
    with pytest.raises(
        JobSpecError,
        match="job every_kind: store 'totals': this primitive keeps a key_value, lru or in_memory store, not windowed",
    ):
        EVERY_KIND.check(dataclasses.replace(SPEC, stores=(windowed,)))


T0 = dt.datetime(2026, 11, 1, 12, 0, 0)
_offsets = iter(range(1, 1000))


def _e(user, type_, qty=None, price=None, amount=None, minute=None, note=None, offset=None) -> Row:
    return Row(
        user=user,
        type=type_,
        qty=qty,
        price=price,
        amount=None if amount is None else Decimal(amount),
        at=None if minute is None else T0 + dt.timedelta(minutes=minute),
        note=note,
        offset=offset if offset is not None else next(_offsets),
    )


# Offsets decide the order of a key's events; rows are written out of that order on purpose.
EVENTS = [
    _e("a", "buy", 2, 0.5, "3.10", 9, "gift", offset=2),
    _e("a", "buy", 1, 0.25, "1.00", 3, None, offset=1),
    _e("a", "view", 99, 99.0, "0.01", 0, "ignored", offset=3),  # not aggregated (where)
    _e("b", "buy", 1, 1.0, "5.00", 1, "x", offset=4),
    _e("b", "erase", offset=5),  # created and erased: tombstone
    _e("c", "erase", offset=6),  # erasing a key never seen: tombstone (the outputs may hold it)
    _e("r", "buy", None, None, None, None, None, offset=7),  # restored key: counts on, nulls change nothing else
    _e("s", "erase", offset=8),  # restored key erased
    _e("v", "view", 1, 1.0, "1.00", 1, "only views", offset=9),  # never aggregated: no change row at all
    _e("d", "erase", offset=10),
    _e("d", "buy", 4, 2.0, "2.50", 7, "again", offset=11),  # erased, then anew
    _e("a", "buy", 3, 0.5, "0.90", 5, None, offset=12),
    _e("a", "erase", offset=13),
    _e("a", "buy", 1, 0.5, "7.00", 2, "n", offset=14),
    _e("e", "buy", 1, 0.5, "4.00", 4, "e1", offset=15),
    _e("e", "buy", None, None, "1.00", None, None, offset=16),
]
RESTORED = {
    "r": {
        "events": 10,
        "notes": 2,
        "qty": 5,
        "spent": Decimal("20.00"),
        "price_total": 1.5,
        "cheapest": Decimal("1.00"),
        "first_at": T0,
        "last_at": T0,
        "last_note": "old",
        "revenue": Decimal("30.00"),
    },
    "s": {
        "events": 1,
        "notes": 0,
        "qty": 1,
        "spent": Decimal("1.00"),
        "price_total": 1.0,
        "cheapest": Decimal("1.00"),
        "first_at": T0,
        "last_at": T0,
        "last_note": None,
        "revenue": Decimal("1.00"),
    },
}
FIELDS = list(EVERY_KIND.values)


def _reference(batches: list[list[Row]], fields: list[str] = FIELDS) -> set[tuple]:
    """The documented semantics, written independently of the processor: per batch, per key in offset order."""
    fresh = {
        "events": 0,
        "notes": 0,
        "qty": 0,
        "spent": Decimal(0),
        "price_total": 0.0,
        "cheapest": None,
        "first_at": None,
        "last_at": None,
        "last_note": None,
        "revenue": Decimal(0),
    }

    def keep(old, new, pick):
        return old if new is None else new if old is None else pick(old, new)

    store, out = {k: dict(v) for k, v in RESTORED.items()}, set()
    for batch_id, rows in enumerate(batches):
        for user in sorted({r.user for r in rows}):
            mine = sorted((r for r in rows if r.user == user and r.type != "view"), key=lambda r: r.offset)
            if not mine:
                continue
            alive, value = user in store, dict(store.get(user, fresh))
            for r in mine:
                if r.type == "erase":
                    alive, value = False, dict(fresh)
                    continue
                alive = True
                value["events"] += 1
                value["notes"] += r.note is not None
                value["qty"] += r.qty or 0
                value["spent"] += r.amount or 0
                value["price_total"] += r.price or 0.0
                value["cheapest"] = keep(value["cheapest"], r.amount, min)
                value["first_at"] = keep(value["first_at"], r.at, min)
                value["last_at"] = keep(value["last_at"], r.at, max)
                value["last_note"] = keep(value["last_note"], r.note, lambda _old, new: new)
                if r.qty is not None and r.amount is not None:
                    value["revenue"] += r.qty * r.amount
            if alive:
                store[user] = value
                out.add((batch_id, user, False, *(value[f] for f in fields)))
            else:
                store.pop(user, None)
                out.add((batch_id, user, True, *([None] * len(fields))))
    return out


EVENT_COLUMNS = T.StructType([*SCHEMA.fields, T.StructField("offset", T.LongType())])


def _changes(
    spark, tmp_path, name: str, batches, declaration=EVERY_KIND, events=None, store=None, **options
) -> set[tuple]:
    events = events if events is not None else file_stream(spark, batches, EVENT_COLUMNS, tmp_path / f"events-{name}")
    fields = list(declaration.values)
    restored = [Row(key=k, **{f: v[f] for f in fields}, touched_at_ms=1) for k, v in RESTORED.items()]
    initial = spark.createDataFrame(restored, f"key STRING, {declaration.state_ddl}")

    def row_of(row, batch_id: int) -> tuple:
        assert row.tombstone or row.touched_at_ms > 0, row
        return (batch_id, row.key, row.tombstone, *(row[f] for f in fields))

    changes = declaration.changes(events, "user", initial, store, job=SPEC.name, **options)
    return collect_available_now(changes, "update", tmp_path / f"checkpoint-{name}", row_of)


@pytest.mark.integration
def test_every_aggregate_kind_equals_the_reference_whatever_the_batching(spark, tmp_path):
    for name, batches in {"one": [EVENTS], "two": [EVENTS[:9], EVENTS[9:]], "rows": [[e] for e in EVENTS[:6]]}.items():
        expected = _reference(batches)
        assert _changes(spark, tmp_path, name, batches) == expected, name
    # the store's key as every checkpoint so far holds it (the key encoder's): keyed otherwise, a later build
    # could not continue them
    assert state_key_schema(spark, tmp_path / "checkpoint-two", EVERY_KIND.store) == "struct<value:string>"
    # the input holds what the test is for
    two = _reference([EVENTS[:9], EVENTS[9:]])
    assert {u for _, u, tombstone, *_ in two if tombstone} == {"b", "c", "s"}
    assert not any(u == "v" for _, u, *_ in two)  # only views: never reached the processor
    (a_reset,) = [row for row in two if row[:2] == (1, "a")]
    assert a_reset[3] == 1 and a_reset[FIELDS.index("last_note") + 3] == "n"  # erased, then one event


#: every kind but a DOUBLE sum, whose last bits depend on the order of additions: its events may be combined
COMBINABLE = dataclasses.replace(EVERY_KIND, values={k: v for k, v in EVERY_KIND.values.items() if k != "price_total"})


def _random_events(seed: int, count: int) -> list[Row]:
    """Events of a few keys in offset order: many per key, deletes among them, nulls in every input."""
    rng = random.Random(seed)

    def maybe(value):
        return None if rng.random() < 0.2 else value

    return [
        _e(
            rng.choice("abrsx"),
            rng.choices(["buy", "view", "erase"], [75, 12, 13])[0],
            maybe(rng.randint(0, 9)),
            maybe(rng.random()),
            maybe(f"{rng.randint(0, 999) / 100:.2f}"),
            maybe(rng.randint(0, 600)),
            maybe(rng.choice(["n1", "n2", "n3"])),
            offset=offset,
        )
        for offset in range(1, count + 1)
    ]


def _two_partitions(spark, batches: list[list[Row]], directory, seed: int):
    """A stream whose every micro-batch has two input partitions, each a contiguous offset range in offset
    order (as a Kafka partition read in two splits): two file sources, one file each per batch, unioned."""
    rng = random.Random(seed)
    cuts = [rng.randint(0, len(rows)) for rows in batches]
    first = [rows[:cut] for rows, cut in zip(batches, cuts, strict=True)]
    second = [rows[cut:] for rows, cut in zip(batches, cuts, strict=True)]
    return file_stream(spark, first, EVENT_COLUMNS, directory / "first").unionByName(
        file_stream(spark, second, EVENT_COLUMNS, directory / "second")
    )


@pytest.mark.integration
def test_events_combined_before_the_shuffle_give_the_same_changes_as_one_by_one(spark, tmp_path):
    events = _random_events(seed=21, count=240)
    batches = [events[:70], events[70:71], events[71:200], events[200:]]
    expected = _reference(batches, list(COMBINABLE.values))
    stream = _two_partitions(spark, batches, tmp_path / "events", seed=5)
    combined = COMBINABLE.changes(stream, "user", None, None, job=SPEC.name, offset_ordered=True)
    assert "MapPartitions" in combined._jdf.queryExecution().analyzed().toString()  # combined indeed
    assert _changes(spark, tmp_path, "combined", batches, COMBINABLE, events=stream, offset_ordered=True) == expected
    # the input holds what the test is for: keys erased mid-batch then bought again, several events per key
    assert sum(1 for _, _, tombstone, *_ in expected if tombstone) >= 3
    assert max(row[3] for row in expected if not row[2]) >= 10
    # a DOUBLE sum is never combined (its result would depend on the combination)
    doubles = EVERY_KIND.changes(stream, "user", None, None, job=SPEC.name, offset_ordered=True)
    assert "MapPartitions" not in doubles._jdf.queryExecution().analyzed().toString()
    assert _changes(spark, tmp_path, "doubles", batches, events=stream, offset_ordered=True) == _reference(batches)


@pytest.mark.integration
def test_an_in_memory_store_gives_the_same_changes_from_spark_s_in_memory_state_store(spark, tmp_path):
    """``kind="in_memory"``: the same rules through ``flatMapGroupsWithState`` in Spark's in-memory state store
    (``InMemoryAggregate``), seeded by the same restored rows, its events combined or not."""
    in_memory = StoreSpec("totals", kind="in_memory")
    with session_conf(spark, IN_MEMORY_QUERY_CONF):
        for name, batches in {"one": [EVENTS], "rows": [[e] for e in EVENTS[:6]]}.items():
            assert _changes(spark, tmp_path, f"in-memory-{name}", batches, store=in_memory) == _reference(batches)
        events = _random_events(seed=21, count=240)
        batches = [events[:70], events[70:71], events[71:200], events[200:]]
        stream = _two_partitions(spark, batches, tmp_path / "in-memory-events", seed=5)
        combined = _changes(
            spark, tmp_path, "in-memory-combined", batches, COMBINABLE, stream, in_memory, offset_ordered=True
        )
        assert combined == _reference(batches, list(COMBINABLE.values))
    state = {p.suffix for p in (tmp_path / "checkpoint-in-memory-combined" / "state").rglob("*") if p.is_file()}
    assert ".delta" in state and ".changelog" not in state, state  # Spark's in-memory store, not RocksDB


@pytest.mark.integration
def test_combining_input_that_is_not_in_offset_order_stops_the_query_with_a_clear_error(spark, tmp_path):
    backwards = [_e("a", "buy", 1, offset=2), _e("a", "buy", 2, offset=1)]
    with pytest.raises(Exception, match="input partition not in offset order: offset 1 after 2"):
        _changes(spark, tmp_path, "backwards", [backwards], COMBINABLE, offset_ordered=True)


@pytest.mark.integration
def test_an_expression_that_does_not_apply_to_the_events_is_refused_naming_the_field(spark, tmp_path):
    events = file_stream(spark, [EVENTS[:1]], EVENT_COLUMNS, tmp_path / "events")
    broken = dataclasses.replace(EVERY_KIND, delete_when="type = 'erase' AND colour = 'red'")
    with pytest.raises(JobSpecError, match="job every_kind: delete_when does not apply to the event's fields"):
        broken.changes(events, "user", None, None, job=SPEC.name)


def test_a_job_module_with_an_inconsistent_declaration_is_refused_when_it_is_loaded(tmp_path, monkeypatch):
    (tmp_path / "broken_stock_jobs.py").write_text(
        "from tests.spark_jobs.test_keyed_aggregate import EVERY_KIND, SPEC\n"
        "import dataclasses\n"
        "from spark_jobs.primitives import Aggregate\n"
        "BROKEN = dataclasses.replace(EVERY_KIND, values={'n': Aggregate.sum('note')})\n"
        "JOBS = (dataclasses.replace(SPEC, entrypoint='broken_stock_jobs:BROKEN'),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(JobSpecError, match="job every_kind: values.n: cannot sum 'note'"):
        registered_versions("broken_stock_jobs")
