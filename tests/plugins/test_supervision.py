"""Supervision decisions and alert bookkeeping (pure logic; the real-stack tests are in test_supervise_dags.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

from streamstate.alerts import FIRING, RESOLVED, OpenAlert, dedup_key, reconcile
from streamstate.supervision import (
    DESIRED_STOPPED,
    Assessment,
    CheckResult,
    Condition,
    Launch,
    Observation,
    SupervisionRecord,
    assess,
    locked_record,
    read_record,
)

from spark_jobs.documents import from_json, to_json
from spark_jobs.driver.lease import FENCED, LeaseHolder
from spark_jobs.driver.lifecycle import PublishedStatus
from spark_jobs.registry import SupervisionPolicy, latest_jobs

SPEC = dataclasses.replace(
    latest_jobs()["purchase_counts"],
    supervision=SupervisionPolicy(
        restart_backoff_s=10,
        restart_backoff_max_s=40,
        crash_loop_restarts=3,
        crash_loop_window_s=600,
        max_input_lag_records=1000,
        no_progress_triggers=12,
        batch_duration_budget_s=30,
        restore_budget_s=100,
        dead_letter_growth_records=10,
    ),
)
NOW = 1_800_000_000.0


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()


def running_status(**progress) -> dict:
    return {
        "state": "RUNNING",
        "lease_epoch": 4,
        "started_at": iso(NOW - 300),
        "progress": {"progress_at": iso(NOW - 5), "input_lag": {"t-0": 10}, "batch_duration_ms": 800, **progress},
    }


HOLDER = {"pid": 123, "epoch": 4, "host": "h"}


def observed(now: float, holder: dict | None, status: dict | None, **seen) -> Observation:
    """What a check sees when the lease record and the status file hold these documents."""
    return Observation(
        now,
        from_json(LeaseHolder, holder) if holder is not None else None,
        from_json(PublishedStatus, {"application_id": SPEC.application_id, **status}) if status is not None else None,
        **seen,
    )


def names(assessment) -> set[str]:
    return {c.name for c in assessment.conditions}


def test_healthy_running_job_needs_nothing():
    a = assess(SPEC, observed(NOW, HOLDER, running_status()), SupervisionRecord("a"))
    assert (a.state, a.action, names(a)) == ("running", "none", set())


def test_records_not_keyed_by_the_key_wake_on_call_with_the_way_out():
    status = {**running_status(), "dead_letters": {"wrong_key": 42, "late": 3}}
    a = assess(SPEC, observed(NOW, HOLDER, status), SupervisionRecord("a"))
    (condition,) = [c for c in a.conditions if c.name == "source_not_keyed"]
    assert condition.severity == "error" and condition.numbers["wrong_key_records"] == 42
    assert "repartition=True" in condition.next_step
    late_only = {**running_status(), "dead_letters": {"late": 3}}
    assert "source_not_keyed" not in names(assess(SPEC, observed(NOW, HOLDER, late_only), SupervisionRecord("a")))


def test_metric_conditions_hold_with_their_numbers():
    status = running_status(input_lag={"t-0": 900, "t-1": 200}, batch_duration_ms=45_000, progress_at=iso(NOW - 200))
    status["started_at"] = iso(NOW - 400)
    a = assess(SPEC, observed(NOW, HOLDER, status), SupervisionRecord("a"))
    assert names(a) == {"input_lag", "batch_duration", "no_progress"}
    by_name = {c.name: c for c in a.conditions}
    assert by_name["input_lag"].numbers["lag_records"] == 1100
    assert by_name["batch_duration"].numbers["batch_duration_s"] == 45.0
    assert by_name["no_progress"].numbers["limit_s"] == 120.0  # 12 x 5 s, but at least 2 minutes
    assert all(c.next_step for c in a.conditions)


def test_the_first_batch_after_a_start_is_not_held_to_the_budget():
    first = running_status(batch_id=7, batch_duration_ms=95_000)
    first["first_batch_id"] = 7  # the catch-up batch of this run (replay after a crash, backlog, cold JVM)
    assert names(assess(SPEC, observed(NOW, HOLDER, first), SupervisionRecord("a"))) == set()
    later = {**first, "progress": {**first["progress"], "batch_id": 8}}
    assert names(assess(SPEC, observed(NOW, HOLDER, later), SupervisionRecord("a"))) == {"batch_duration"}


def test_idle_reports_count_as_signs_of_life():
    status = {**running_status(progress_at=iso(NOW - 900)), "idle_at": iso(NOW - 3)}
    assert "no_progress" not in names(assess(SPEC, observed(NOW, HOLDER, status), SupervisionRecord("a")))


def test_restoring_too_long_and_a_slow_finished_restore():
    restoring = {
        "state": "RESTORING",
        "lease_epoch": 4,
        "restore": {"counts": {"started_at": iso(NOW - 150), "records_read": 5}},
    }
    a = assess(SPEC, observed(NOW, HOLDER, restoring), SupervisionRecord("a"))
    assert (a.state, names(a)) == ("restoring", {"restore_slow"})
    finished = {**running_status(), "restore": {"counts": {"seconds": 130.0}}}
    assert names(assess(SPEC, observed(NOW, HOLDER, finished), SupervisionRecord("a"))) == {"restore_slow"}


def test_a_new_driver_that_has_not_published_is_starting():
    stale = {**running_status(), "lease_epoch": 3}
    assert assess(SPEC, observed(NOW, HOLDER, stale), SupervisionRecord("a")).state == "starting"


def test_never_started_job_is_started_quietly():
    a = assess(SPEC, observed(NOW, None, None), SupervisionRecord("a"))
    assert (a.state, a.action, names(a)) == ("not_started", "start", set())


def test_dead_job_is_down_and_restarted_with_backoff():
    record = SupervisionRecord("a", launches=[Launch(at=NOW - 4, by="r1", outcome="running")])
    dead = {**running_status(), "state": "RUNNING"}
    a = assess(SPEC, observed(NOW, None, dead), record)
    assert (a.state, a.action, names(a)) == ("down", "wait_backoff", {"down"})
    assert a.backoff_remaining_s == 6.0
    later = assess(SPEC, observed(NOW + 7, None, dead), record)
    assert later.action == "restart"
    record.launches.append(Launch(at=NOW + 7, by="r2", outcome="failed"))
    assert assess(SPEC, observed(NOW + 20, None, dead), record).action == "wait_backoff"  # 2 starts: 20 s
    assert assess(SPEC, observed(NOW + 28, None, dead), record).action == "restart"


def test_crash_loop_after_k_starts_in_the_window_then_a_manual_start_resets_it():
    record = SupervisionRecord("a", launches=[Launch(at=NOW - 100 + i, by=f"r{i}", outcome="failed") for i in range(3)])
    a = assess(SPEC, observed(NOW, None, None), record)
    assert (a.state, a.action, names(a)) == ("crash_looping", "give_up", {"down", "crash_loop"})
    assert "start_streaming_job" in {c.name: c for c in a.conditions}["crash_loop"].next_step
    # starts that found the job running, and starts before a manual reset, do not count
    record.launches.append(Launch(at=NOW - 1, by="x", outcome="already_running"))
    record.restarts_reset_at = NOW - 50
    assert assess(SPEC, observed(NOW, None, None), record).action == "restart"
    # starts outside the window do not count either
    old = SupervisionRecord("a", launches=[Launch(at=NOW - 700 + i, by="r", outcome="failed") for i in range(3)])
    assert assess(SPEC, observed(NOW, None, None), old).action == "restart"


def test_a_launch_in_flight_is_waited_for():
    record = SupervisionRecord("a", launches=[Launch(at=NOW - 20, by="r1", launcher_pid=99)])
    a = assess(SPEC, observed(NOW, None, None, launcher_alive=True), record)
    assert (a.state, a.action, names(a)) == ("starting", "none", set())  # a first start: nothing was down
    assert assess(SPEC, observed(NOW, None, None, launcher_alive=False), record).action == "restart"


def test_a_restart_in_flight_keeps_the_job_down_until_a_driver_holds_the_lease():
    crashed = {**running_status(), "state": "ERROR", "error": "boom"}
    before = Launch(at=NOW - 300, by="r1", outcome="running")
    record = SupervisionRecord("a", launches=[before, Launch(at=NOW - 5, by="watch", launcher_pid=99)])
    a = assess(SPEC, observed(NOW, None, crashed, launcher_alive=True), record)
    # the alert that fired when the driver died stays open: resolved here, a failed launch would page again
    assert (a.state, a.action, names(a)) == ("starting", "none", {"down"})
    assert "boom" in a.conditions[0].summary
    # once the new driver holds the lease (published or not yet), the job is no longer down
    assert names(assess(SPEC, observed(NOW, HOLDER, crashed), record)) == set()


def test_a_driver_taken_over_by_another_is_not_restarted_until_started_again():
    fenced = {**running_status(), "state": "ERROR", "error": "generation 1 was fenced by generation 2 (pid 7 on h2)"}
    record = SupervisionRecord("a", launches=[Launch(at=NOW - 60, by="r1", outcome="running", exit_file="x")])
    a = assess(SPEC, observed(NOW, None, fenced, last_exit_code=FENCED), record)
    assert (a.state, a.action, names(a)) == ("taken_over", "none", {"taken_over"})
    taken = a.conditions[0]
    assert taken.severity == "warning" and "fenced by generation 2 (pid 7 on h2)" in taken.summary
    assert "start_streaming_job" in taken.next_step
    # any other exit is a crash, restarted as before
    assert assess(SPEC, observed(NOW, None, fenced, last_exit_code=1), record).action == "restart"
    # a manual start is a new launch: its driver runs, or its own exit decides
    record.launches.append(Launch(at=NOW + 1, by="manual", outcome="running"))
    assert assess(SPEC, observed(NOW + 2, HOLDER, running_status()), record).state == "running"


def test_stopped_on_request_is_left_alone():
    record = SupervisionRecord(
        "a", desired=DESIRED_STOPPED, stop_reason="maintenance", launches=[Launch(NOW - 9, "r", outcome="running")]
    )
    a = assess(SPEC, observed(NOW, None, running_status()), record)
    assert (a.state, a.action, names(a)) == ("stopped", "none", set())


def test_dead_letter_growth_between_checks():
    record = SupervisionRecord("a", dead_letters_seen=100)
    assert names(assess(SPEC, observed(NOW, HOLDER, running_status(), dead_letters=105), record)) == set()
    grew = assess(SPEC, observed(NOW, HOLDER, running_status(), dead_letters=150), record)
    assert names(grew) == {"dead_letters_growing"} and grew.conditions[0].numbers["new_records"] == 50


def test_alerts_fire_once_and_resolve_once_with_a_stable_dedup_key():
    record = SupervisionRecord("a")
    down = assess(SPEC, observed(NOW, None, running_status()), record).conditions
    fire, resolve = reconcile("purchase_counts", "purchase_counts-v2", {}, list(down))
    assert [(a.condition, a.status) for a in fire] == [("down", FIRING)] and resolve == []
    assert fire[0].dedup_key == dedup_key("purchase_counts-v2", "down") == "streamstate/purchase_counts-v2/down"
    assert "Next step:" in fire[0].text() and fire[0].numbers["max_restarts"] == 3
    opened = {a.condition: OpenAlert.of(a, "supervision") for a in fire}  # what the alert ledger records
    again = reconcile("purchase_counts", "purchase_counts-v2", opened, list(down))
    assert again == ([], [])
    fire, resolve = reconcile("purchase_counts", "purchase_counts-v2", opened, [])
    assert fire == [] and [(a.condition, a.status, a.dedup_key) for a in resolve] == [
        ("down", RESOLVED, "streamstate/purchase_counts-v2/down")
    ]


def test_record_round_trips_under_its_lock(tmp_path):
    with locked_record(tmp_path, "a") as record:
        record.launches.append(Launch(at=NOW, by="r", launcher_pid=1, outcome="running", epoch=2))
        record.crash_loop_since = NOW
    again = read_record(tmp_path, "a")
    assert again.launches[0].epoch == 2 and again.crash_loop_since == NOW


def test_the_record_keeps_the_assessment_typed_and_reads_records_written_before():
    """The supervision record (Airflow's check writes it, the jobs page and the next check read it) keeps the last
    assessment as an Assessment, its conditions included; a record written by the previous release (an empty
    assessment, ``open_alerts``, a launch field this release does not know) reads without loss."""
    condition = Condition("down", "critical", "job-v1: no driver", {"exit_code": 1}, "look at the log")
    record = SupervisionRecord("job-v1", last_assessment=Assessment("down", "restart", "no driver", (condition,)))
    back = SupervisionRecord.from_json(record.to_json())
    assert back == record and back.last_assessment.conditions[0].numbers == {"exit_code": 1}
    older = {
        "application_id": "job-v1",
        "last_assessment": {},
        "open_alerts": {"x": 1},
        "launches": [{"at": 1.0, "by": "t", "launcher_pid": 7, "outcome": "running", "gone": True}],
    }
    read = SupervisionRecord.from_json(json.dumps(older))
    assert read.last_assessment is None and read.last_launch == Launch(
        at=1.0, by="t", launcher_pid=7, outcome="running"
    )
    assert CheckResult.of(to_json(CheckResult("down", "restart", "no driver", fired=("down",)))).fired == ("down",)
