"""user_sessions: session windows (Kafka Streams' ``SessionWindows``) held to the plain-Python reference
spark_jobs.reference.generators.sessions.expected:

* the reference itself on named cases (no Spark): merging, a late event within grace bridging two sessions,
  a closed session extended and emitted again, the grace boundary, deletes, eviction;
* the session processor on the named and on generated adversarial events cut into micro-batches down to one
  record: what it emits on close, on every update, what it keeps and refuses must be the same whatever the cut;
* the registered job end to end on the real broker, Spark and Delta, across a lost checkpoint (the second
  run restores the sessions and the partitions' stream times from the changelog): outputs and dead letters.

The Kafka Streams app runs the same topology on the same input in tests/bench/test_kafka_streams_peer.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import shutil

import pytest

from bench.answers import latest_per_key
from spark_jobs.layout import JobLayout
from spark_jobs.primitives.event_time import CHANGE, LATE
from spark_jobs.primitives.sessions import EMIT
from spark_jobs.reference.generators import sessions
from spark_jobs.reference.jobs.user_sessions import EVENT_SCHEMA, VISITS
from spark_jobs.registry import get_job
from spark_jobs.registry import store as store_spec
from spark_jobs.testing import JobHarness
from tests.helpers import collect_available_now, file_stream, source_rows, with_source_columns

PARTITIONS = 2
MINUTE = sessions.MINUTE
SPEC = get_job("user_sessions")
STORE = store_spec(SPEC, "user-sessions")
VALUES = tuple(VISITS.values)
T0 = sessions.START
MS0 = int(T0.timestamp() * 1000)


def _event(n: int, user: str, minutes: float, kind: str = sessions.CLICK, page: str = "/") -> dict:
    at = (T0 + dt.timedelta(minutes=minutes)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"event_id": f"e{n}", "type": kind, "user_id": user, "page": page, "event_time": at}


# Users "a" and "b" live in partition 0, "d" in partition 1 (Kafka's murmur2, 2 partitions). Gap 30 min,
# grace 5 min: a session closes when stream time reaches its end + 35 min; retention 2 h from its end.
NAMED = [
    _event(1, "a", 0),
    _event(2, "a", 10, sessions.PAGE_VIEW, "/item"),
    _event(3, "a", 50),  # 40 min after a's last event: a second session [50, 50]
    _event(4, "b", 60),  # stream time 60: a's [0, 10] closes (10 + 35 <= 60) and is emitted
    _event(5, "a", 30, sessions.PAGE_VIEW, "/cart"),  # within gap of [0, 10] (closed) and [50, 50]: one [0, 50]
    _event(6, "b", 100),  # closes b's [60, 60] and a's [0, 50] (emitted again: the same start, a later end)
    _event(7, "a", 40),  # would merge into [0, 50], closed at 85 < 100: late
    _event(8, "d", 10),  # partition 1's stream time is its own: nothing of d closes by partition 0's
    _event(9, "b", 200),
    _event(10, "b", 232),  # 32 min after 200: a session of its own; [200, 200] still open (closes at 235)
    _event(11, "b", 216, sessions.PAGE_VIEW, "/checkout"),  # late, within grace: bridges [200] and [232]
    _event(12, "a", 300),  # closes b's [200, 232]
    _event(13, "a", 310),
    _event(14, "a", 320, sessions.FORGET_ME),  # deletes a's open [300, 310]: never emitted
    # partition 1: d's forget_me at 45 closes d's [10, 10] by its own time (10 + 35), which emits it, then
    # deletes d (a Kafka Streams suppress buffer would drop it: README, "Known differences")
    _event(15, "d", 45, sessions.FORGET_ME),
    _event(16, "b", 500),  # evicts what ended by 380 (retention 2 h)
    _event(17, "a", 465),  # end + 35 == stream time: not late (Kafka Streams: end < stream time - 35), closes at once
    _event(18, "b", 465 - 1 / 60_000),  # one millisecond earlier (and no session of b within gap): late
]


def _ms(minutes: float) -> int:
    return MS0 + round(minutes * MINUTE)


def _millis(iso: str) -> int:
    """Milliseconds since the epoch of a JSON timestamp (Spark's ``to_json``: ``...T09:00:00.000Z``)."""
    return int(dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _reference(events: list[dict]) -> sessions.Sessions:
    return sessions.expected_visits(events, STORE.gap_ms, STORE.grace_ms, STORE.retention_ms, PARTITIONS)


def test_the_reference_merges_bridges_re_emits_and_refuses_late_events():
    want = _reference(NAMED)
    assert want.emitted[("a", _ms(0))] == (_ms(50), (4, 2, "/cart"))  # emitted at 60 as [0, 10], again as [0, 50]
    assert want.emitted[("b", _ms(60))] == (_ms(60), (1, 0, "/"))
    assert want.emitted[("b", _ms(200))] == (_ms(232), (3, 1, "/checkout"))  # the bridge
    assert want.emitted[("a", _ms(465))] == (_ms(465), (1, 0, "/"))  # closed at once, at the boundary
    assert want.late == {"e7", "e18"} and want.bridges == {"e5", "e11"} and want.reopened == {"e5"}
    assert ("a", _ms(300)) not in want.emitted and ("a", _ms(300)) not in want.updated  # deleted while open
    assert want.emitted[("d", _ms(10))] == want.updated[("d", _ms(10))] == (_ms(10), (1, 0, "/"))
    assert not any(user == "d" for user, _ in want.state)
    # eviction: what ended by 380 left the store; the outputs keep it
    assert set(want.state) == {("b", _ms(500)), ("a", _ms(465))}
    assert want.stream_times == {0: _ms(500), 1: _ms(45)}
    # the update view holds every session's latest values; merged-away sessions are gone from it
    assert ("b", _ms(232)) not in want.updated and want.updated[("b", _ms(500))] == (_ms(500), (1, 0, "/"))


def test_the_readme_shows_the_whole_declaration_of_the_job():
    from pathlib import Path

    import spark_jobs.reference.jobs.user_sessions as job
    from tests.helpers import docs_page

    page = docs_page("writing-jobs/session-aggregate.md")
    declaration = page[page.index("VISITS = SessionAggregate(") :]
    declaration = declaration[: declaration.index("\n)\n") + 3]
    assert declaration in Path(job.__file__).read_text() and "retention_ms=2 * 3600 * 1000" in declaration
    assert (STORE.gap_ms, STORE.grace_ms, STORE.retention_ms) == (30 * MINUTE, 5 * MINUTE, 2 * 3600 * 1000)


def test_a_session_closes_at_end_plus_gap_plus_grace_not_before():
    events = [_event(1, "a", 0), _event(2, "b", 34.99), _event(3, "a", 1)]
    assert _reference(events).emitted == {} and _reference(events).late == set()
    events = [_event(1, "a", 0), _event(2, "b", 35), _event(3, "a", 1)]  # 1 + 35 >= 35: extends, not late
    want = _reference(events)
    assert want.late == set() and want.emitted == {("a", _ms(0)): (_ms(0), (1, 0, "/"))}
    assert want.state[("a", _ms(0))] == (_ms(1), (2, 0, "/"), False)


def test_a_session_store_is_declared_checked_addressed_and_audited_by_its_sessions_end():
    from streamstate.state_api.keys import InvalidKey, KeySchema

    from spark_jobs.operations.state_audit import trends
    from spark_jobs.operations.state_audit.collect import windows_beyond_retention
    from spark_jobs.operations.state_audit.rows import SnapshotEntry
    from spark_jobs.registry import JobSpecError, StoreSpec
    from spark_jobs.state.changelog import ChangelogTopic

    for bad, field in (
        (dict(gap_ms=0), "gap_ms > 0"),
        (dict(gap_ms=MINUTE, grace_ms=-1), "grace_ms >= 0"),
        (dict(gap_ms=MINUTE, grace_ms=MINUTE, retention_ms=MINUTE), "shorter than gap_ms + grace_ms"),
        (dict(gap_ms=MINUTE, window_ms=MINUTE), "window_ms is for windowed stores"),
    ):
        with pytest.raises(JobSpecError, match=re.escape(field)):
            StoreSpec("visits", kind="session", **{"retention_ms": 3600_000, **bad})
    with pytest.raises(JobSpecError, match="gap_ms is for session stores"):
        StoreSpec("visits", kind="windowed", window_ms=MINUTE, retention_ms=3600_000, gap_ms=MINUTE)
    configs = ChangelogTopic("app", STORE.name, 2, kind="session", retention_ms=STORE.retention_ms).configs()
    assert configs["cleanup.policy"] == "compact,delete" and int(configs["retention.ms"]) > STORE.retention_ms

    keys = KeySchema.of(SPEC, STORE)
    assert keys.encode("u001", 1_234_567) == "u001@1234567" and "a session's start" in keys.describe()["window_start"]
    assert keys.decode("u001@1234567") == {"user_id": "u001", "window_start": 1_234_567}
    with pytest.raises(InvalidKey, match="needs window_start"):
        keys.encode("u001")

    horizon = STORE.retention_ms  # counted from a session's end
    values = [
        SnapshotEntry.decode(json.dumps(value))
        for value in (
            {"session_start_ms": 0, "session_end_ms": horizon, "source_partition": 0},
            {"session_start_ms": 0, "session_end_ms": 0, "source_partition": 1},
            {"session_end_ms": None, "source_partition": 0, "stream_time_ms": 2 * horizon - 1},
            {"session_end_ms": None, "source_partition": 1, "stream_time_ms": horizon + 1},
        )
    ]
    assert windows_beyond_retention(STORE, values, stream_time_ms=0) == 1  # partition 1's, by its own time
    assert trends.unbounded_growth(STORE, [], 1).flagged and "sessions" in trends.unbounded_growth(STORE, [], 1).reason


def _run(spark, tmp_path, declaration, events: list[dict], cut: int, name: str) -> sessions.Sessions:
    """The processor over ``events`` in micro-batches of ``cut`` records; what it emitted (on close or on
    every update, as ``declaration.emit`` says), kept and refused, in the reference's terms."""
    rows = source_rows(events, EVENT_SCHEMA, "user_id", PARTITIONS, T0)
    batches = [rows[i : i + cut] for i in range(0, len(rows), cut)]
    stream = file_stream(spark, batches, with_source_columns(EVENT_SCHEMA), tmp_path / f"events-{name}")
    changes = declaration.changes(stream, "user_id", None, STORE, job="user_sessions")

    def row_of(row, batch_id: int) -> tuple:
        return batch_id, tuple(sorted(row.asDict().items(), key=lambda item: item[0]))

    seen = sorted(collect_available_now(changes, "append", tmp_path / f"checkpoint-{name}", row_of), key=lambda r: r[0])
    got = sessions.Sessions({}, {}, {}, set(), set(), {})
    outputs = got.emitted if declaration.emit == "close" else got.updated
    for _, items in seen:
        row = dict(items)
        session, values = (row["user_id"], row["session_start_ms"]), tuple(row[v] for v in VALUES)
        if row["kind"] == LATE:
            got.late.add(bytes(row["raw"]).decode())
            assert row["session_end_ms"] + STORE.gap_ms + STORE.grace_ms < row["stream_time_ms"]
        elif row["user_id"] is None:
            assert row["kind"] == CHANGE
            got.stream_times[row["source_partition"]] = row["stream_time_ms"]
        elif row["kind"] == EMIT:
            if row["tombstone"]:
                outputs.pop(session, None)
            else:
                # what the sink relies on to append: a session emitted again on close is flagged reopened
                assert declaration.emit == "update" or row["reopened"] or session not in outputs, session
                outputs[session] = (row["session_end_ms"], values)
        elif row["tombstone"]:
            got.state.pop(session, None)
        else:
            got.state[session] = (row["session_end_ms"], values, row["closed"])
    return got


def _same(got: sessions.Sessions, want: sessions.Sessions, emit: str) -> bool:
    view = "emitted" if emit == "close" else "updated"
    return (got.state, getattr(got, view), got.late, got.stream_times) == (
        want.state,
        getattr(want, view),
        want.late,
        want.stream_times,
    )


@pytest.mark.integration
def test_sessions_match_kafka_streams_semantics_whatever_the_batching(spark, tmp_path):
    """Named and generated events, on close and on every update, cut down to one record per batch."""
    updates = dataclasses.replace(VISITS, emit="update")
    want = _reference(NAMED)
    for declaration, cut in ((VISITS, len(NAMED)), (VISITS, 1), (updates, 1)):
        got = _run(spark, tmp_path, declaration, NAMED, cut, f"named-{declaration.emit}-{cut}")
        assert _same(got, want, declaration.emit), f"named, emit={declaration.emit}, micro-batches of {cut}"
    events = list(sessions.adversarial(240, users=6, seed=5))
    want = _reference(events)
    assert want.late and want.bridges and want.reopened and want.emitted and set(want.updated) - set(want.emitted)
    assert any(e["type"] == sessions.FORGET_ME for e in events)
    for declaration, cut in ((VISITS, len(events)), (VISITS, 7), (updates, 20)):
        got = _run(spark, tmp_path, declaration, events, cut, f"gen-{declaration.emit}-{cut}")
        assert _same(got, want, declaration.emit), f"generated, emit={declaration.emit}, micro-batches of {cut}"
    # A clickstream in a few large micro-batches: within one batch many sessions are extended (in place),
    # come due, are put back extended, close and are evicted, by the processor's queue of due sessions
    events = list(sessions.generate(40, seconds=8 * 3600, seed=11))
    want = _reference(events)
    assert len(want.emitted) > 100
    for declaration, cut in ((VISITS, 500), (updates, 700)):
        got = _run(spark, tmp_path, declaration, events, cut, f"visits-{declaration.emit}-{cut}")
        assert _same(got, want, declaration.emit), f"visits, emit={declaration.emit}, micro-batches of {cut}"


@pytest.mark.integration
def test_the_job_writes_closed_sessions_dead_letters_late_events_and_survives_a_lost_checkpoint(
    spark, kafka_broker, settings, unique
):
    spec = dataclasses.replace(
        SPEC,
        source_topic=f"user-activity-{unique}",
        name=f"sessions_{unique}",
        output_table=f"sessions_{unique}",
        output_topic=f"visits-{unique}",
    )
    events = list(sessions.adversarial(200, users=6, seed=7))
    bad = {"event_id": "bad", "type": "click", "user_id": "u001", "page": "/"}  # no event time
    rounds = [events[:110], [*events[110:], bad]]
    want = _reference(events)  # the bad event is a dead letter, not an event
    assert want.late and want.bridges and want.reopened
    with JobHarness(settings=settings, spark=spark) as harness:
        first = harness.run(spec, rounds[0])
        # Lose the checkpoint: the second run restores the sessions and the partitions' stream times from
        # the changelog, and goes on exactly as if nothing had happened.
        shutil.rmtree(first.report.checkpoint)
        second = harness.run(spec, rounds[1])
    assert second.report.restores[STORE.name].keys > 0
    outputs = {
        (r["user_id"], int(r["session_start"].timestamp() * 1000)): (
            int(r["session_end"].timestamp() * 1000),
            tuple(r[v] for v in VALUES),
        )
        for r in second.outputs
    }
    assert outputs == want.emitted and len(first.outputs) < len(outputs)
    # the same sessions in the job's upsert topic (a lost checkpoint's replay rewrites some: an upsert absorbs it)
    published = {}
    for key, value in latest_per_key(settings.kafka, JobLayout.of(spec, settings).output_topic).items():
        row = json.loads(value)
        assert json.loads(key) == {"user_id": row["user_id"], "session_start": row["session_start"]}
        published[(row["user_id"], _millis(row["session_start"]))] = (
            _millis(row["session_end"]),
            tuple(row[v] for v in VALUES),
        )
    assert published == want.emitted
    late = [x for x in (*first.dead_letters, *second.dead_letters) if x.reason == "late"]
    assert {json.loads(x.value)["event_id"] for x in late} == want.late
    assert all("had closed" in x.message for x in late)
    assert any(x.value and b'"bad"' in x.value and x.reason != "late" for x in second.dead_letters)
