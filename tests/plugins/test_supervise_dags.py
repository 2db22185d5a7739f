"""The supervision DAGs on the real stack: real Airflow (``airflow dags test``), spark-submit drivers,
the Kafka broker, a local webhook receiving the alerts, and the Airflow UI page over HTTP.

One job (patient_heart_rate) is started, killed with kill -9, restarted, raced and stopped by the
DAGs; another (vote_counts, with a driver config that cannot start) crash-loops.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
import urllib.request

import pytest
from streamstate.alert_ledger import AlertLedger
from streamstate.supervision import read_record

from runtime.settings import PROJECT_ROOT
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import JobState, SpareState, read_spare_status, read_standby_status, read_status
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import spare_name
from spark_jobs.operations.standby.follower import standby_id
from spark_jobs.reference.generators import pulse
from spark_jobs.registry import get_job
from tests.fixtures import two_stage_jobs
from tests.helpers import STACK_JOB_MODULES, driver_diagnosis, driver_pids
from tests.helpers import wait_for as _wait

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def airflow_cli(airflow, dag_runner, settings, webhook):
    """Runs DAGs the way ``dag.test()`` does, with the webhook connection configured. Afterwards kills
    whatever the DAGs launched (the drivers are detached: nothing else would)."""
    env = {"AIRFLOW_CONN_STREAMSTATE_WEBHOOK": json.dumps({"conn_type": "http", "host": webhook.url})}

    def run(dag_id: str, conf: dict | None = None, **extra_env: str):
        supervise = dag_id.startswith("supervise__")
        if supervise and conf is None:
            conf = {"watch_s": 0}  # the check and the launch; the watch: test_on_call_in_browser.py
        dag_file = PROJECT_ROOT / "dags" / ("supervise_jobs.py" if supervise else "control_jobs.py")
        return dag_runner.dags_test(dag_id, conf, env={**env, **extra_env}, dag_file=dag_file)

    yield run
    for app in (
        get_job("patient_heart_rate").application_id,
        get_job("vote_counts").application_id,
        "crash_looping_votes-v1",
        *(spec.application_id for spec in two_stage_jobs.JOBS),
    ):
        for launch in (
            read_record(settings.status_dir, app).launches
            + read_record(settings.status_dir, standby_id(app)).launches
            + read_record(settings.status_dir, spare_name(app)).launches
        ):
            try:
                os.killpg(launch.launcher_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, TypeError):
                pass


def _ok(result) -> None:
    assert result.returncode == 0, f"DAG run failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"


def _wait_out_the_backoff(settings, app: str) -> None:
    """The start counts as a launch in the crash-loop window: a check within the restart backoff after it
    (rightly) waits instead of restarting. A driver that starts fast dies well inside it, so wait it out."""
    launched_at = read_record(settings.status_dir, app).last_launch.at
    time.sleep(max(0.0, launched_at + JOB.supervision.backoff_s(1) - time.time()) + 0.5)


JOB = get_job("patient_heart_rate")
FAULT_JOBS = "tests.fixtures.fault_jobs"


@pytest.fixture(scope="module")
def heart_rate_input(settings, kafka_broker):
    ensure_topic(settings.kafka_bootstrap_servers, JOB.source_topic, JOB.source_partitions)
    pulse.produce(settings.kafka_bootstrap_servers, JOB.source_topic, list(pulse.generate(patients=5, seconds=60)))


def test_killed_job_is_restarted_and_on_call_hears_once(settings, airflow_cli, webhook, heart_rate_input):
    app = JOB.application_id
    lease = JobLease(settings.status_dir, app)

    _ok(airflow_cli(f"supervise__{JOB.name}"))  # never ran: started quietly
    first = lease.holder()
    assert first is not None
    standby = JobLease(settings.status_dir, standby_id(app))
    follower = standby.holder()
    assert follower is not None  # its warm standby was started beside it
    _wait(lambda: read_status(settings.status_dir, app).state == "RUNNING", 120, "RUNNING")
    assert webhook.of(app) == []

    os.kill(first.pid, signal.SIGKILL)
    _wait(lambda: lease.holder() is None, 60, "the kernel to drop the killed driver's lease")
    _wait_out_the_backoff(settings, app)

    _ok(airflow_cli(f"supervise__{JOB.name}"))  # down: alert, then restart
    second = lease.holder()
    assert second is not None and second.epoch == first.epoch + 1
    _wait(lambda: read_status(settings.status_dir, app).state == "RUNNING", 120, "RUNNING")
    assert webhook.of(app) == [("down", "firing")]
    down = next(a for a in webhook.received if a["condition"] == "down")
    assert down["dedup_key"] == f"streamstate/{app}/down" and down["next_step"] and down["job"] == JOB.name

    assert standby.holder().epoch == follower.epoch  # the standby kept following meanwhile

    os.kill(follower.pid, signal.SIGKILL)  # the standby dies: supervised like a job
    _wait(lambda: standby.holder() is None, 60, "the kernel to drop the killed follower's lease")
    _wait_out_the_backoff(settings, standby_id(app))
    _ok(airflow_cli(f"supervise__{JOB.name}"))  # back: resolved; the standby restarted
    assert standby.holder().epoch == follower.epoch + 1
    _ok(airflow_cli(f"supervise__{JOB.name}"))  # healthy: nothing new
    assert webhook.of(app) == [("down", "firing"), ("down", "resolved")]
    assert lease.holder().epoch == second.epoch  # the healthy checks started nothing
    assert read_standby_status(settings.status_dir, app).state in ("CATCHING_UP", "FOLLOWING")


def test_racing_supervision_and_retried_launches_never_run_two_instances(
    settings, airflow_cli, webhook, heart_rate_input
):
    app = JOB.application_id
    lease = JobLease(settings.status_dir, app)
    if lease.holder() is None:  # (when run on its own)
        _ok(airflow_cli("start_streaming_job", {"job": JOB.name}))
    running = lease.holder()

    # A retried launch task (a second start of a running job) starts nothing.
    _ok(airflow_cli("start_streaming_job", {"job": JOB.name}))
    assert lease.holder().epoch == running.epoch and driver_pids(app) == {running.pid}

    # Kill it, then let two supervision runs and two manual starts race to bring it back.
    os.kill(running.pid, signal.SIGKILL)
    killed_at = time.time()
    # No backoff to wait out: the manual start above reset the restart count (a start on request clears it).
    _wait(lambda: lease.holder() is None, 60, "the lease to be free")
    runs = [f"supervise__{JOB.name}", f"supervise__{JOB.name}", "start_streaming_job", "start_streaming_job"]
    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        results = list(pool.map(lambda d: airflow_cli(d, {"job": JOB.name} if d.startswith("start") else None), runs))
    for result in results:
        _ok(result)
    time.sleep(5)  # a straggler driver would have taken (or failed to take) the lease by now

    after = lease.holder()
    assert after is not None
    # The fencing token: exactly one driver acquired the lease in the whole race.
    assert after.epoch == running.epoch + 1
    assert driver_pids(app) == {after.pid}
    race = [launch for launch in read_record(settings.status_dir, app).launches if launch.at >= killed_at]
    assert [launch.outcome for launch in race] == ["running"]  # the other runs waited for it or found it running
    assert webhook.of(app).count(("down", "firing")) <= 2  # this outage announced at most once


def test_ui_page_lists_every_job_with_live_numbers(settings, airflow, airflow_cli, heart_rate_input):
    from spark_jobs.registry import registered_versions

    def page_json():
        with urllib.request.urlopen(f"{settings.airflow_url}/streamstate/api/jobs", timeout=10) as resp:
            return {job["job"]: job for job in json.loads(resp.read())["jobs"]}

    if JobLease(settings.status_dir, JOB.application_id).holder() is None:  # (when run on its own)
        _ok(airflow_cli("start_streaming_job", {"job": JOB.name}))
    # New input, so the running driver (restarted after everything was processed) reports a batch.
    pulse.produce(
        settings.kafka_bootstrap_servers, JOB.source_topic, list(pulse.generate(patients=3, seconds=30, seed=11))
    )
    # (A restarted driver on a loaded 2-core machine: Spark's start, the RocksDB restore of the checkpoint
    # and the Python workers of transformWithState before the first batch; CI has taken over 180 s.)
    jobs = _wait(
        lambda: (p := page_json()) and p[JOB.name]["batch_id"] is not None and p,
        360,
        "a batch on the page",
        lambda: driver_diagnosis(settings, JOB.application_id),
    )
    assert set(jobs) == set(registered_versions(STACK_JOB_MODULES))  # the stack's jobs
    live = jobs[JOB.name]
    status = read_status(settings.status_dir, JOB.application_id)
    assert live["lifecycle_state"] == "RUNNING"
    assert live["driver"]["lease_epoch"] == status.lease_epoch
    assert live["input_lag_records"] is not None and live["state_rows"] is not None
    assert (
        live["links"]["spark_ui"].startswith("http")
        and live["links"]["supervise_dag"] == f"/dags/supervise__{JOB.name}"
    )
    assert jobs["vote_counts"]["lifecycle_state"] in ("NEVER_RAN", "NOT_RUNNING")
    with urllib.request.urlopen(f"{settings.airflow_url}/streamstate/", timeout=10) as resp:
        html = resp.read().decode()
    assert all(name in html for name in jobs) and "Spark UI" in html
    assert "Look up a key" in html and "standby " in html  # the lookup form; the running standby's numbers
    plugin = next(p for p in airflow._request("GET", "/plugins")["plugins"] if p["name"] == "streamstate")
    assert plugin["external_views"][0]["href"] == "/streamstate/"
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/streamstate", "/state-api"]

    # The state query API, served by Airflow's API server: the running job answers live.
    def state_api(path: str) -> dict:
        with urllib.request.urlopen(f"{settings.airflow_url}/state-api{path}", timeout=10) as resp:
            return json.loads(resp.read())

    store = _wait(
        lambda: (a := state_api(f"/jobs/{JOB.name}/stores/pulse-counts")) and a["source"] == "live" and a,
        60,
        "a live answer through Airflow",
    )
    assert store["keys"] > 0 and store["standby"]["follower_running"] and store["batch_id"] is not None
    first = state_api(f"/jobs/{JOB.name}/stores/pulse-counts/keys?page_size=1")["items"][0]
    window = first["key"]
    one = state_api(
        f"/jobs/{JOB.name}/stores/pulse-counts/keys/{window['patient_id']}?window_start={window['window_start']}"
    )
    assert one["found"] and one["source"] == "live"
    # the job runs on: a batch between the two answers may have added beats to this open window, never others
    assert {k: v for k, v in one["value"].items() if k != "beats"} == {
        k: v for k, v in first["value"].items() if k != "beats"
    }
    assert one["value"]["beats"] >= first["value"]["beats"]
    with urllib.request.urlopen(
        f"{settings.airflow_url}/streamstate/lookup?target={JOB.name}/pulse-counts"
        f"&key={window['patient_id']}&window_start={window['window_start']}",
        timeout=10,
    ) as resp:
        assert "live" in resp.read().decode()


def test_stop_dag_stops_cleanly_and_supervision_leaves_it_stopped(settings, airflow_cli, webhook):
    app = JOB.application_id
    lease = JobLease(settings.status_dir, app)
    assert lease.holder() is not None
    _ok(airflow_cli("stop_streaming_job", {"job": JOB.name, "reason": "test maintenance"}))
    assert lease.holder() is None
    assert read_status(settings.status_dir, app).state == "NOT_RUNNING"  # a clean stop, not a kill
    _ok(airflow_cli(f"supervise__{JOB.name}"))
    record = read_record(settings.status_dir, app)
    assert lease.holder() is None and record.last_assessment.state == "stopped"
    assert AlertLedger(settings.status_dir).open_alerts(app, "supervision") == []
    assert webhook.of(app)[-1][1] == "resolved"  # a stop on request is not an outage


def test_a_spare_driver_takes_over_a_killed_driver_and_supervision_keeps_one(
    settings, airflow_cli, webhook, heart_rate_input
):
    """With spare drivers on (``STREAMSTATE_SPARE_DRIVERS``; off elsewhere in this stack): the supervise DAG keeps a
    warm spare beside the driver; a kill -9 of the driver is a takeover, not an outage (no ``down`` alert, no
    launch); the next check starts a new spare; a stop, even a forced one, stops the spare first."""
    app = JOB.application_id
    spares = {"STREAMSTATE_SPARE_DRIVERS": "true"}
    lease, spare_lease = JobLease(settings.status_dir, app), JobLease(settings.status_dir, spare_name(app))
    _ok(airflow_cli("start_streaming_job", {"job": JOB.name}, **spares))  # (the previous test stopped it)
    _ok(airflow_cli(f"supervise__{JOB.name}", **spares))  # the spare task starts the spare
    driver, spare = lease.holder(), spare_lease.holder()
    assert driver is not None and spare is not None
    _wait(
        lambda: (
            (s := read_spare_status(settings.status_dir, app))
            and s.state is SpareState.READY
            and s.watching_epoch == driver.epoch
        ),
        300,
        "the spare READY, watching the driver",
    )
    launches, alerts = len(read_record(settings.status_dir, app).launches), webhook.of(app)

    os.kill(driver.pid, signal.SIGKILL)
    _wait(
        lambda: (
            (h := lease.holder())
            and h.epoch == driver.epoch + 1
            and read_status(settings.status_dir, app).state is JobState.RUNNING
        ),
        120,
        "the spare RUNNING as the driver",
    )
    assert lease.holder().pid == spare.pid
    _ok(airflow_cli(f"supervise__{JOB.name}", **spares))  # a takeover is no outage; the next spare starts
    assert webhook.of(app) == alerts and len(read_record(settings.status_dir, app).launches) == launches
    assert spare_lease.holder() is not None and spare_lease.holder().epoch == spare.epoch + 1

    stop = {"job": JOB.name, "reason": "test done", "force": True}  # SIGKILL: only a stopped spare stays out
    _ok(airflow_cli("stop_streaming_job", stop, **spares))
    assert lease.holder() is None and spare_lease.holder() is None
    time.sleep(1)  # (a spare left running would have taken the lease within a poll)
    assert lease.holder() is None


def test_crash_looping_job_stops_being_restarted_after_k_tries(
    settings, airflow_cli, webhook, kafka_broker, monkeypatch
):
    # vote_counts with a 1 s backoff (tests/fixtures/fault_jobs.py): the policy's rules, not its default waits
    monkeypatch.setenv("STREAMSTATE_JOB_MODULES", FAULT_JOBS)
    spec = get_job("crash_looping_votes")
    app, policy = spec.application_id, spec.supervision
    bad = {
        "STREAMSTATE_SPARK_DRIVER_MEMORY": "1k",  # the driver JVM cannot start with this heap
        "STREAMSTATE_JOB_MODULES": FAULT_JOBS,
        "PYTHONPATH": str(PROJECT_ROOT),
    }

    def supervise():
        return airflow_cli(f"supervise__{spec.name}", **bad)

    deadline = time.monotonic() + 600
    while read_record(settings.status_dir, app).crash_loop_since is None:
        assert time.monotonic() < deadline, "never marked crash-looping"
        before = len(read_record(settings.status_dir, app).launches)
        result = supervise()
        launches = read_record(settings.status_dir, app).launches
        if len(launches) > before:
            assert result.returncode != 0, "the launch of a driver that cannot start must fail the run"
            assert launches[-1].outcome == "failed" and "exited with code 1" in launches[-1].error
        else:
            _ok(result)  # waiting out the backoff (or just marked crash-looping)
            time.sleep(2)
    launches = read_record(settings.status_dir, app).launches
    assert len(launches) == policy.crash_loop_restarts
    for i in range(1, len(launches)):  # each restart waited its (doubling) backoff
        assert launches[i].at - launches[i - 1].at >= policy.backoff_s(i)
    _ok(supervise())  # and it stays that way, silently
    record = read_record(settings.status_dir, app)
    assert len(record.launches) == policy.crash_loop_restarts and record.crash_loop_since is not None
    assert JobLease(settings.status_dir, app).holder() is None
    assert webhook.of(app) == [("down", "firing"), ("crash_loop", "firing")]
    crash = next(a for a in webhook.received if a["application_id"] == app and a["condition"] == "crash_loop")
    assert crash["severity"] == "critical" and "start_streaming_job" in crash["next_step"]
    assert crash["numbers"]["restarts_in_window"] == policy.crash_loop_restarts


def test_the_two_stage_top_movers_run_under_supervision_and_both_come_back_after_kill_9(
    settings, airflow_cli, kafka_broker, monkeypatch
):
    """Stage 1 (daily changes, to its one-partition upsert topic) and stage 2 (the day's top 10 over that
    topic), each started by its supervision DAG: stage 2's outputs reach the reference for the closed days;
    both drivers killed with kill -9 and restarted by supervision, the next day's ticks close it and the
    outputs equal the reference over everything."""
    from spark_jobs.reference.generators.producer import produce_keyed
    from spark_jobs.versions import read_rows
    from tests.spark_jobs.test_batch_jobs import LATER, TICKS
    from tests.spark_jobs.test_top_movers import _ranking, _reference_movers

    modules = "tests.fixtures.two_stage_jobs"
    monkeypatch.setenv("STREAMSTATE_JOB_MODULES", modules)
    env = {"STREAMSTATE_JOB_MODULES": modules, "PYTHONPATH": str(PROJECT_ROOT)}
    one, two = two_stage_jobs.STAGE_ONE, two_stage_jobs.STAGE_TWO
    ensure_topic(settings.kafka, one.source_topic, one.source_partitions)
    leases = [JobLease(settings.status_dir, spec.application_id) for spec in (one, two)]

    def top_movers():
        try:
            return _ranking(read_rows(str(settings.lake / two.output_table_dir)))
        except Exception:  # not written yet
            return {}

    def supervise_both() -> list:
        for spec in (one, two):
            _ok(airflow_cli(f"supervise__{spec.name}", **env))
        for spec in (one, two):
            _wait(lambda s=spec: read_status(settings.status_dir, s.application_id).state == "RUNNING", 180, "RUNNING")
        return [lease.holder() for lease in leases]

    first = supervise_both()
    produce_keyed(settings.kafka, one.source_topic, TICKS, one.key_field)
    want = _reference_movers(TICKS)
    _wait(lambda: top_movers() == want, 300, "stage 2's top movers of the three closed days", lambda: top_movers())

    for holder in first:
        os.kill(holder.pid, signal.SIGKILL)
    for lease, spec in zip(leases, (one, two), strict=True):
        _wait(lambda lease=lease: lease.holder() is None, 60, "the kernel to drop the killed driver's lease")
        _wait_out_the_backoff(settings, spec.application_id)
    second = supervise_both()
    assert [h.epoch for h in second] == [h.epoch + 1 for h in first], "each stage restarted once, fenced"

    produce_keyed(settings.kafka, one.source_topic, LATER, one.key_field)
    everything = _reference_movers([*TICKS, *LATER])
    assert len({day for day, _ in everything}) == 4
    _wait(lambda: top_movers() == everything, 300, "the fourth day ranked after the restarts", lambda: top_movers())
