"""From a stateful processor's output to a store's changelog, and from a restored store back to
initial state.

Jobs whose state needs custom logic (deletes, timers, versions) keep it in ``transformWithState``
processors. Such a processor emits **one row per changed store key per micro-batch**: the key
columns, the full new value columns, and ``tombstone = true`` when the key left the store (delete
on event, TTL expiry, window eviction). :class:`StoreChanges` says how those rows become changelog
records (key string, JSON value or null); :func:`restored_rows` turns a restored store back into
typed rows for the processor's ``initialState``.

The JSON is Spark's own ``to_json``/``from_json`` over the store's declared value schema, so a value
written by one batch reads back with exactly the same types on restore.
"""

from __future__ import annotations

import dataclasses
import functools

TOMBSTONE = "tombstone"
#: the column naming the store a change row belongs to, in the rows of a processor that keeps several
STORE_COLUMN = "store"


@dataclasses.dataclass(frozen=True)
class StoreChanges:
    """How a processor's change rows map to one store's changelog.

    Attributes:
        store: the store name (its changelog topic is ``<application_id>-<store>-changelog``).
        value_ddl: the stored value's schema, e.g. ``"purchases BIGINT, amount_spent DECIMAL(22,2)"``.
        key: SQL expression of the changelog key of a change row (default: the ``key`` column).
        rows: SQL condition picking the change rows when the processor emits other rows too.
    """

    store: str
    value_ddl: str
    key: str = "key"
    rows: str | None = None

    def value_columns(self) -> list[str]:
        return list(_field_names(self.value_ddl))

    def changelog_records(self, changes):
        """``changes`` (processor output) -> DataFrame(key STRING, value STRING|null) for the changelog."""
        # SQL text: built every micro-batch, and a Column per field is a call into the JVM each
        fields = ", ".join(f"`{c}`" for c in self.value_columns())
        if self.rows:
            changes = changes.where(self.rows)
        return changes.selectExpr(
            f"CAST({self.key} AS STRING) AS key",
            f"CASE WHEN `{TOMBSTONE}` THEN CAST(NULL AS STRING) ELSE to_json(struct({fields})) END AS value",
        )


@functools.cache
def _field_names(ddl: str) -> tuple[str, ...]:
    """The field names of a DDL schema (parsed by Spark, in the JVM: once per schema)."""
    from pyspark.sql.types import _parse_datatype_string

    return tuple(f.name for f in _parse_datatype_string(ddl).fields)


def several_stores(first: StoreChanges, more: tuple[StoreChanges, ...]) -> tuple[StoreChanges, ...]:
    """The stores of a processor that keeps ``first`` and ``more``, each picking its change rows by
    :data:`STORE_COLUMN` (a row without one is ``first``'s: a processor written for one store keeps working
    when it gains another)."""
    stores = (first, *more)
    if len({s.store for s in stores}) != len(stores):
        raise ValueError(f"a processor keeps each store once, not {[s.store for s in stores]}")
    columns = [c for s in stores for c in s.value_columns()]
    if clash := sorted({c for c in columns if columns.count(c) > 1}):
        raise ValueError(
            f"the stores' values share the column(s) {clash}: each store's value columns need names of their own"
        )

    def picking(changes: StoreChanges, condition: str) -> StoreChanges:
        return dataclasses.replace(changes, rows=f"({changes.rows}) AND {condition}" if changes.rows else condition)

    return (
        picking(first, f"coalesce(`{STORE_COLUMN}`, '{first.store}') = '{first.store}'"),
        *(picking(s, f"`{STORE_COLUMN}` = '{s.store}'") for s in more),
    )


def restored_rows(store, value_ddl: str):
    """A restored store, DataFrame(key STRING, value STRING) (see ``RestoredState.store_frame``), as
    DataFrame(key STRING, <value columns>)."""
    from pyspark.sql import functions as F

    return store.select("key", F.from_json("value", value_ddl).alias("v")).select("key", "v.*")
