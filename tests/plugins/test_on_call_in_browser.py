"""What on-call does, in a real browser (tests/plugins/airflow_ui.py) against the real Airflow
standalone: its scheduler, workers and triggerer run what the forms trigger, spark-submit launches the
drivers, and alerts reach the jobs page's inbox (the stack's default ``streamstate_webhook``).

- ``reprocess_job`` triggered from its form as a dry run, the plan read in the task's log;
- ``reprocess_job`` in mode migrate from its form (a dry run), for a job whose v2 migrates v1's state:
  the migration's plan read in the task's log;
- ``promote_job_version`` from its form (a dry run), what it would do read in the task's log;
- purchase_counts started from its form, a key looked up on the jobs page, its supervision started from
  its form; kill -9 of the driver: the watch restarts it within seconds with its state, the ``down``
  alert arrives; stopped from its form; the state-size report before and after an audit run
  triggered from its form.

The last story's screenshots of the jobs page and the received alerts are the documentation's (README.md, and
docs/operating/on-call.md in the site): with ``UPDATE_README_SCREENSHOTS=1`` they are written to ``docs/img/`` too.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import re
import shutil
import signal
import urllib.error
import urllib.parse
import urllib.request

import pytest
from streamstate.supervision import read_record

from runtime.settings import PROJECT_ROOT
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import observe_driver
from spark_jobs.driver.run import run
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from spark_jobs.versions import JobVersions
from streamstate_cli.job_processes import stop_job_processes
from tests.fixtures import ui_jobs
from tests.helpers import (
    driver_diagnosis,
    driver_pids,
    expected_purchase_counts,
    read_topic,
    wait_for,
    wait_for_success,
)

pytestmark = pytest.mark.integration

JOB = get_job("purchase_counts")
#: upgraded_counts v2's declared migration of v1's state
MIGRATION = "tests.fixtures.reprocess_jobs:add_tier"
SUPERVISE = f"supervise__{JOB.name}"
README_IMAGES = PROJECT_ROOT / "docs" / "img"


@pytest.fixture(scope="module")
def purchases_input(settings, kafka_broker):
    ensure_topic(settings.kafka_bootstrap_servers, JOB.source_topic, JOB.source_partitions)
    purchases.produce(
        settings.kafka_bootstrap_servers, JOB.source_topic, list(purchases.generate(400, users=20, seed=5))
    )


TRIGGERED = (
    "audit_state_size",
    "reprocess_job",
    "promote_job_version",
    "start_streaming_job",
    "stop_streaming_job",
    SUPERVISE,
)


@pytest.fixture(scope="module")
def leaves_the_stack_quiet(settings, airflow):
    """Runs on a quiet stack, and leaves it quiet. Before: earlier tests ran these DAGs with ``airflow
    dags test`` on the same metadata DB, some killing it mid-run (tests/faults), which leaves runs
    "running" that would hold back a new one (``max_active_runs=1``): they are failed, as on-call would.
    After: the forms unpaused the DAGs they triggered (Airflow's default): paused again, and whatever
    driver or standby the stories left running is stopped."""
    for dag_id in TRIGGERED:
        airflow.fail_unfinished_runs(dag_id)
    yield
    for dag_id in TRIGGERED:
        airflow.set_paused(dag_id, True)
    stop_job_processes(settings)


def _job_row(settings) -> dict:
    with urllib.request.urlopen(f"{settings.airflow_url}/streamstate/api/jobs", timeout=10) as resp:
        return next(job for job in json.load(resp)["jobs"] if job["job"] == JOB.name)


def _received(settings, dedup_key: str) -> list[dict]:
    """The alerts the jobs page's inbox received under ``dedup_key``, oldest first."""
    with urllib.request.urlopen(f"{settings.airflow_url}/streamstate/api/alerts", timeout=10) as resp:
        return [alert for alert in reversed(json.load(resp)["alerts"]) if alert.get("dedup_key") == dedup_key]


def _look_up(ui, key: str) -> str:
    """Look ``key`` up with the jobs page's form; the answer page's text."""
    from selenium.webdriver.support.ui import Select

    ui.open("/streamstate/")
    form = ui.browser.find_element("css selector", "form[action=lookup]")
    Select(form.find_element("name", "target")).select_by_value(f"{JOB.name}/counts")
    form.find_element("name", "key").send_keys(key)
    ui.button("Look up", within=form).click()
    return ui.wait_for_text(f"State lookup: {JOB.name}/counts {key}")


def _answer_text(settings, key: str) -> str:
    """The text of the lookup page :func:`_look_up` lands on, fetched without the browser ("" while Airflow
    does not answer): for waits, whose page loads every half second would compete with a starting driver."""
    query = urllib.parse.urlencode({"target": f"{JOB.name}/counts", "key": key})
    try:
        with urllib.request.urlopen(f"{settings.airflow_url}/streamstate/lookup?{query}", timeout=10) as resp:
            return html.unescape(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return ""


def _readme_screenshot(ui, name: str) -> None:
    path = ui.save_screenshot(name)
    if os.environ.get("UPDATE_README_SCREENSHOTS") == "1":
        README_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, README_IMAGES / path.name)


def test_a_reprocessing_dry_run_shows_its_plan_in_the_task_log(ui, airflow, purchases_input, leaves_the_stack_quiet):
    with ui.screenshot_on_failure("reprocess-trigger"):
        run_id = ui.trigger("reprocess_job", job=JOB.name, mode="reset")  # dry_run: on by default
    wait_for_success(airflow, "reprocess_job", run_id)
    with ui.screenshot_on_failure("reprocess-plan-log"):
        log = ui.task_log("reprocess_job", run_id, "plan", expect="DRY RUN - nothing will be changed")
        assert f"Reprocessing plan: {JOB.name} v{JOB.version}, mode reset" in log
        assert f"input {JOB.source_topic} (stream), start: earliest" in log and "records to process: 400" in log
        assert "delete checkpoint" in log and "restart" in log
    assert airflow.task_states("reprocess_job", "reset")[run_id] == "skipped"  # a dry run changes nothing
    # what a failed run's assertion prints: the same log through the API
    assert "DRY RUN - nothing will be changed" in airflow.task_logs("reprocess_job", run_id)


@pytest.mark.variation(
    of="test_a_reprocessing_dry_run_shows_its_plan_in_the_task_log (a migration's plan: test_reprocess_dags.py)"
)
def test_a_migration_dry_run_plans_the_new_versions_state_from_the_old_ones(
    ui, airflow, settings, spark, kafka_broker, leaves_the_stack_quiet
):
    """The reprocessing form's migrate mode, on the job with two versions the stack registers
    (tests/fixtures/ui_jobs.py): v1 has run; the plan names v1's state, the declared migration into v2,
    the copy of v1's outputs, and changes nothing."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STREAMSTATE_JOB_MODULES", ui_jobs.__name__)  # registered in the stack's Airflow too
        v1, v2 = get_job(ui_jobs.NAME, 1), get_job(ui_jobs.NAME, 2)
        bootstrap = settings.kafka_bootstrap_servers
        ensure_topic(bootstrap, v1.source_topic, v1.source_partitions)
        purchases.produce(bootstrap, v1.source_topic, list(purchases.generate(200, users=30, seed=8)))
        JobVersions(settings).promote(v1.name, 1, by="test: v1 was deployed first")
        run(v1, settings, available_now=True, spark=spark)

    with ui.screenshot_on_failure("migrate-trigger"):
        run_id = ui.trigger("reprocess_job", job=v1.name, mode="migrate")  # the newest version, dry run
    wait_for_success(airflow, "reprocess_job", run_id)
    with ui.screenshot_on_failure("migrate-plan-log"):
        log = ui.task_log("reprocess_job", run_id, "plan", expect="DRY RUN - nothing will be changed")
    assert f"Reprocessing plan: {v1.name} v2 beside v1, state migrated from v1, mode migrate" in log
    assert f"{v1.application_id}/counts through {MIGRATION}" in log and "migrated snapshot" in log, log[-3000:]
    assert f"copy of {settings.lake / v1.output_table_dir} as of the migration point" in log
    assert airflow.task_states("reprocess_job", "migrate_state")[run_id] == "skipped"
    assert not (settings.checkpoints / v2.application_id).exists()  # v2 untouched


def test_a_promotion_dry_run_says_what_it_would_do(ui, airflow, leaves_the_stack_quiet):
    with ui.screenshot_on_failure("promote-trigger"):
        run_id = ui.trigger("promote_job_version", job=JOB.name)  # the newest version, dry run: the defaults
    wait_for_success(airflow, "promote_job_version", run_id)
    with ui.screenshot_on_failure("promote-log"):
        log = ui.task_log("promote_job_version", run_id, "promote", expect=f"DRY RUN: promote {JOB.name}")
        assert f"v{JOB.version} is already the current version: nothing to promote" in log
    assert airflow.task_states("promote_job_version", "start_new")[run_id] == "skipped"


def test_start_look_up_lose_the_driver_hear_it_stop_and_audit(
    settings, ui, airflow, purchases_input, leaves_the_stack_quiet
):
    app = JOB.application_id
    lease = JobLease(settings.status_dir, app)

    def diagnose() -> str:
        return driver_diagnosis(settings, app)

    expected = expected_purchase_counts(read_topic(settings.kafka_bootstrap_servers, JOB.source_topic))
    user, (purchase_count, _amount) = max(expected.items(), key=lambda item: item[1][0])
    with ui.screenshot_on_failure("audit-before"):
        ui.open("/streamstate/state-audit/")
        before = ui.wait_for_text("State size audit")
        assert "No report yet" in before or "generated" in before, before[:500]

    with ui.screenshot_on_failure("start-trigger"):
        run_id = ui.trigger("start_streaming_job", job=JOB.name)
    wait_for_success(airflow, "start_streaming_job", run_id, diagnose=diagnose)
    started = lease.holder()
    wait_for(
        lambda: _job_row(settings)["input_lag_records"] == 0 and _job_row(settings)["lifecycle_state"] == "RUNNING",
        180,
        "the job to read all its input",
        diagnose,
    )

    with ui.screenshot_on_failure("lookup"):
        answer = _look_up(ui, user)
        assert f'"purchases": {purchase_count}' in answer and "source live" in answer, answer[-1500:]

    # supervision from its form: the check finds the job running, the watch defers on its lease
    with ui.screenshot_on_failure("supervise-trigger"):
        supervise_run = ui.trigger(SUPERVISE)
    wait_for(
        lambda: "deferred" in airflow.task_states(SUPERVISE, "watch").values(), 180, "the watch to defer", diagnose
    )
    batch_before_kill = _job_row(settings)["batch_id"]
    os.kill(started.pid, signal.SIGKILL)

    def back() -> bool:
        driver = observe_driver(settings.status_dir, app)
        return driver.alive and driver.holder.epoch > started.epoch and driver.state == "RUNNING"

    wait_for(back, 120, "the watch to restart the driver", diagnose)
    # the watch task records the launch's outcome when it resumes from its wait for RUNNING
    restart = wait_for(
        lambda: (launch := read_record(settings.status_dir, app).last_launch).outcome and launch,
        180,  # the trigger fires, the scheduler queues the task, a fresh task process resumes: slow on a busy day
        "the watch to record its launch",
        lambda: (
            f"{read_record(settings.status_dir, app).last_launch}\n"
            f"{airflow.task_logs(SUPERVISE, supervise_run, lines=80)}\n{diagnose()}"
        ),
    )
    assert f"{SUPERVISE}/" in restart.by and "/watch#" in restart.by and restart.outcome == "running", restart
    assert driver_pids(app) == {lease.holder().pid}  # one instance

    with ui.screenshot_on_failure("alert-arrives"):
        ui.open("/streamstate/alerts")
        alerts = ui.wait_for_text(f"{JOB.name}: down", timeout_s=60, reload_every_s=5)
        assert f"streamstate/{app}/down" in alerts
        received = _received(settings, f"streamstate/{app}/down")
        assert [a["status"] for a in received] == ["firing"], received  # once, not once per check
        _readme_screenshot(ui, "on-call-alerts")
    # the restarted job goes on from its state: new purchases add to the counts from before the kill
    purchases.produce(
        settings.kafka_bootstrap_servers, JOB.source_topic, list(purchases.generate(100, users=20, seed=6))
    )
    expected = expected_purchase_counts(read_topic(settings.kafka_bootstrap_servers, JOB.source_topic))
    with ui.screenshot_on_failure("restarted-jobs-page"):
        # The jobs page's input lag is the last batch's: it still reads 0 between the produce and the
        # next batch, so the wait is on the answer itself.
        counted = f'"purchases": {expected[user][0]}'
        wait_for(
            lambda: counted in _answer_text(settings, user),
            120,
            "the lookup to count the purchases sent after the restart",
            diagnose,
        )
        answer = _look_up(ui, user)
        assert counted in answer, answer[-1500:]
        # the lookup can answer (the batch's changelog is written) before the batch's progress event reaches
        # the status the jobs page reads
        wait_for(lambda: (_job_row(settings)["batch_id"] or 0) > batch_before_kill, 60, "a batch after the restart")
        ui.open("/streamstate/")
        page = ui.wait_for_text("RUNNING")
        assert "down" in page  # the open alert, until a check finds the job running again
        _readme_screenshot(ui, "on-call-jobs-page")

    with ui.screenshot_on_failure("stop-trigger"):
        run_id = ui.trigger("stop_streaming_job", job=JOB.name, reason="on-call drill in the browser")
    wait_for_success(airflow, "stop_streaming_job", run_id, diagnose=diagnose)
    assert lease.holder() is None and driver_pids(app) == set()
    with ui.screenshot_on_failure("stopped-jobs-page"):
        ui.open("/streamstate/")
        ui.wait_for_text("on-call drill in the browser", timeout_s=60, reload_every_s=5)
    # the stop request ends the watch: no run of supervision is left watching a job that should not run
    wait_for(lambda: "deferred" not in airflow.task_states(SUPERVISE, "watch").values(), 120, "the watch to end")

    # the job's state is audited on request: a report newer than the request, with the job's store
    asked_at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    with ui.screenshot_on_failure("audit-trigger"):
        run_id = ui.trigger("audit_state_size")
    wait_for_success(airflow, "audit_state_size", run_id)
    with ui.screenshot_on_failure("audit-after"):
        ui.open("/streamstate/state-audit/")
        report = ui.wait_for_text("generated")
        generated = dt.datetime.fromisoformat(re.search(r"generated (\S+)", report).group(1))
        assert generated >= asked_at, f"the report is older than the audit run: {report[:300]}"
        assert f"{app} / counts" in report, report[:1500]
