"""Two change-data-capture tables for ``customer_accounts`` (a table-table join, :class:`~spark_jobs.primitives.
TableJoin`): customers and their accounts, keyed by ``customer_id``, and the plain-Python reference of their
inner, left and outer joins.

A record is ``(key, value)`` bytes, as a CDC connector writes it: the key the JSON object
``{"customer_id": ...}``, the value the row as JSON or None (a tombstone: the row was deleted). The tables
update rows, delete them and bring some back, hold customers without accounts and accounts without
customers, and mix in records a table must refuse: a value disagreeing with its key (``wrong_key``), a key
that is not the key's JSON object (``missing_key``), a value that is not JSON (``undecodable``).
"""

from __future__ import annotations

import json
import random
from decimal import Decimal

from spark_jobs.reference.generators.upserts import produce, verdict

__all__ = ["adversarial", "expected_join", "produce", "refused"]

TIERS = ("bronze", "silver", "gold", None)
STATUSES = ("open", "frozen", "closed")
#: the output row's fields, in order (spark_jobs/reference/jobs/customer_accounts.py)
FIELDS = ("customer_id", "name", "tier", "account_id", "status", "balance")


def key_of(customer: str) -> bytes:
    return json.dumps({"customer_id": customer}).encode()


def _customer(customer: str, rng: random.Random) -> dict:
    return {
        "customer_id": customer,
        "name": rng.choice(("Ann", "Bo", "Cy", "Di")) + customer,
        "tier": rng.choice(TIERS),
    }


def _account(customer: str, n: int, rng: random.Random) -> dict:
    # a JSON number of at most two decimals, as a CDC connector writes a NUMERIC(12, 2)
    balance = Decimal(rng.randint(-50_000, 5_000_000)) / 100
    return {"customer_id": customer, "account_id": f"a-{n}", "status": rng.choice(STATUSES), "balance": float(balance)}


def adversarial(
    count: int = 240, customers: int = 14, seed: int = 11
) -> tuple[list[tuple[bytes | None, bytes | None]], list[tuple[bytes | None, bytes | None]]]:
    """``(customers, accounts)``: ``count`` upserts and tombstones spread over both tables and ``customers``
    keys (some only ever in one table), then a few refused records in each."""
    rng = random.Random(seed)
    ids = [f"c{n:02d}" for n in range(customers)]
    only_customers, only_accounts = set(ids[:2]), set(ids[2:4])
    tables: tuple[list, list] = ([], [])
    for n in range(count):
        right = rng.random() < 0.5
        pool = [c for c in ids if c not in (only_customers if right else only_accounts)]
        customer = rng.choice(pool)
        if rng.random() < 0.15:
            tables[right].append((key_of(customer), None))
            continue
        row = _account(customer, n, rng) if right else _customer(customer, rng)
        tables[right].append((key_of(customer), json.dumps(row).encode()))
    for table, row in ((tables[0], _customer("c05", rng)), (tables[1], _account("c05", 0, rng))):
        table += [
            (key_of("c06"), json.dumps(row).encode()),  # wrong_key: c05's row under c06's key
            (b"c05", json.dumps(row).encode()),  # missing_key: not the key's JSON
            (None, json.dumps(row).encode()),  # missing_key: none
            (key_of("c05"), b"{not json"),  # undecodable
        ]
    return tables


def _verdict(key: bytes | None, value: bytes | None) -> str | None:
    """Why a table refuses a record (the reason of its dead letter), or None: it applies."""
    return verdict(key, value, ("customer_id",))


def refused(records) -> dict[str, int]:
    """How many of ``records`` a table refuses, by reason."""
    counts: dict[str, int] = {}
    for key, value in records:
        if reason := _verdict(key, value):
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def valid(records) -> list[tuple[bytes, bytes | None]]:
    """The records a table applies."""
    return [(key, value) for key, value in records if _verdict(key, value) is None]


def _table(records) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for key, value in valid(records):
        customer = json.loads(key)["customer_id"]
        if value is None:
            rows.pop(customer, None)
        else:
            rows[customer] = json.loads(value)
    return rows


def expected_join(customers, accounts, join: str = "left") -> dict[str, tuple]:
    """customer_id -> the joined row (:data:`FIELDS`' values, a balance as a Decimal) over both tables'
    latest rows: ``inner`` keys in both tables, ``left`` keys in customers, ``outer`` keys in either."""
    left, right = _table(customers), _table(accounts)
    keys = {"inner": left.keys() & right.keys(), "left": left.keys(), "outer": left.keys() | right.keys()}[join]
    joined = {}
    for customer in keys:
        c, a = left.get(customer, {}), right.get(customer, {})
        balance = a.get("balance")
        joined[customer] = (
            customer,
            c.get("name"),
            c.get("tier"),
            a.get("account_id"),
            a.get("status"),
            None if balance is None else Decimal(str(balance)),
        )
    return joined
