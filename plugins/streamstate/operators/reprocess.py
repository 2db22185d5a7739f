"""Operators of the reprocessing DAGs: plan, prepare, wait for catch-up, compare, reset, promote, audit.

The logic is in ``spark_jobs.operations.reprocess`` (plain Python, testable without Airflow) and
``spark_jobs.versions``; these operators read the DAG run's params, hand over the plan through XCom
and say in the task log what they did. Every step is safe to run again (a cleared task, a re-run).
"""

from __future__ import annotations

import datetime as dt
import json

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from streamstate.operators.deferral import defer_unless_settled
from streamstate.operators.streaming_job import StreamingJobFailed, apply_submit, run_label, who_triggered
from streamstate.triggers.events import WaitOutcome
from streamstate.triggers.streaming_job import StreamingJobCaughtUpTrigger

from runtime.settings import Settings
from spark_jobs.layout import JobLayout, application_id, comparison_report_file
from spark_jobs.operations.reprocess.plan import BadReprocessRequest, ReprocessPlan, make_plan, write_start_offsets
from spark_jobs.registry import get_job
from spark_jobs.state.snapshots import SnapshotStore

PLAN_TASK = "plan"


def _plan(context) -> ReprocessPlan:
    data = context["ti"].xcom_pull(task_ids=PLAN_TASK)
    if not data or "rejected" in data:
        raise AirflowFailException("no plan: the plan task did not produce one")
    return ReprocessPlan.from_dict(data)


def _reject(context, message: str):
    """Fail the run here, without retries; the audit task records the reason as ``rejected``."""
    context["ti"].xcom_push(key="return_value", value={"rejected": message})
    raise AirflowFailException(f"rejected: {message}")


class PlanReprocessingOperator(BaseOperator):
    """Validate the trigger form and make the plan (changes nothing). A bad form fails the run here,
    without retries, with the reason; the audit task records it as ``rejected``."""

    def execute(self, context):
        params = dict(context["params"])
        try:
            plan = make_plan(Settings.from_env(), params)
        except BadReprocessRequest as err:
            _reject(context, str(err))
        self.log.info(
            "%s%s", "DRY RUN - nothing will be changed\n" if params.get("dry_run", True) else "", plan.render()
        )
        return plan.to_dict()


class PrepareSideBySideOperator(BaseOperator):
    """Leave the start position in the new version's checkpoint (unless it already has batches)."""

    def execute(self, context):
        plan, settings = _plan(context), Settings.from_env()
        spec = plan.spec()
        layout = JobLayout.of(spec, settings)
        from spark_jobs.state.checkpoint_offsets import latest_committed_batch_id

        if latest_committed_batch_id(layout.checkpoint) is not None:
            self.log.info("%s resumes from its checkpoint; start position not applied", spec.application_id)
            return {"start_offsets_file": None}
        path = write_start_offsets(layout, plan.start_offsets)
        self.log.info("%s starts at %s (%s)", spec.application_id, plan.start_offsets, path)
        return {"start_offsets_file": str(path)}


class MigrateStateOperator(SparkSubmitOperator):
    """Build the new version's state from the current version's (``spark_jobs/state/migration.py`` on
    ``spark_default``): its first snapshot, at the current version's input position. Safe to run again:
    a store already migrated is kept, and a version already running from the migrated state is left alone."""

    def __init__(self, *, conn_id: str = "spark_default", **kwargs) -> None:
        super().__init__(conn_id=conn_id, application="", **kwargs)

    def execute(self, context):
        from runtime.settings import PROJECT_ROOT
        from spark_jobs.driver.submit import application_submit_spec
        from spark_jobs.state.migration import migrated_and_running

        plan, settings = _plan(context), Settings.from_env()
        target = plan.spec()
        args = (plan.job, str(plan.current_version), str(plan.target_version))
        application = PROJECT_ROOT / "spark_jobs" / "state" / "migration.py"
        apply_submit(self, application_submit_spec(settings, f"migrate-{target.application_id}", application, args))
        super().execute(context)
        snapshots = {s.name: SnapshotStore.of(JobLayout.of(target, settings), s.name).latest() for s in target.stores}
        migrated = {name: info for name, info in snapshots.items() if info is not None and info.writer == "migration"}
        if not migrated and migrated_and_running(settings, target) is None:
            raise StreamingJobFailed(f"the migration wrote no snapshot for {target.application_id}")
        summary = {
            name: {
                "rows": i.rows,
                "batch_id": i.batch_id,
                "migrated_from": i.migrated_from,
                "input_offsets": i.input_offsets,
            }
            for name, i in migrated.items()
        }
        self.log.info("%s starts from: %s", target.application_id, json.dumps(summary, indent=2))
        return summary


class WaitForCatchUpOperator(BaseOperator):
    """Defer until the version has consumed its source up to the source's end as it is now (for a version
    that re-keys its source: re-keyed and applied by its stateful stage); the old version keeps serving
    meanwhile. Fails when the driver stops first or the timeout passes."""

    template_fields = ("timeout_min",)

    def __init__(self, *, timeout_min: int | str = 120, **kwargs) -> None:
        super().__init__(**kwargs)
        self.timeout_min = timeout_min

    def execute(self, context):
        from spark_jobs.io.kafka_topics import partition_offsets

        plan, settings = _plan(context), Settings.from_env()
        spec = plan.spec()
        targets = {
            topic: {p: high for p, (_low, high) in partition_offsets(settings.kafka, topic).items()}
            for topic in plan.inputs
        }
        self.log.info("waiting for %s to consume its inputs up to %s", spec.application_id, targets)
        trigger = StreamingJobCaughtUpTrigger(
            spec.name, spec.version, str(settings.status_dir), targets, float(self.timeout_min) * 60
        )
        return defer_unless_settled(self, context, trigger, "execute_complete")

    def execute_complete(self, context, event: dict):
        outcome = WaitOutcome.of(event)
        if outcome.state != "caught_up":
            raise StreamingJobFailed(f"not caught up: {event}")
        self.log.info("caught up: committed %s", outcome.committed)
        return event


class CompareOutputsOperator(SparkSubmitOperator):
    """Run the comparison (``spark_jobs/operations/reprocess/compare.py``) on ``spark_default``, then log the
    readable report, keep it as a file in ``<status_dir>/reports/`` and return it (XCom)."""

    def __init__(self, *, conn_id: str = "spark_default", **kwargs) -> None:
        super().__init__(conn_id=conn_id, application="", **kwargs)

    def execute(self, context):
        from runtime.settings import PROJECT_ROOT
        from spark_jobs.driver.submit import application_submit_spec
        from spark_jobs.operations.reprocess.compare import render_report, reports_table
        from spark_jobs.versions import read_rows

        plan, settings = _plan(context), Settings.from_env()
        run_id = context["run_id"]
        args = (plan.job, str(plan.current_version), str(plan.target_version), run_id)
        apply_submit(
            self,
            application_submit_spec(
                settings,
                f"compare-{plan.job}",
                PROJECT_ROOT / "spark_jobs" / "operations" / "reprocess" / "compare.py",
                args,
            ),
        )
        super().execute(context)
        report = next((r for r in read_rows(reports_table(settings)) if r["run_id"] == run_id), None)
        if report is None:
            raise StreamingJobFailed(f"the comparison wrote no report for run {run_id}")
        text = render_report(report)
        if gap := plan.history_gap_text():  # accepted when the plan was made: not a full replay
            text += "\n\nHistory gap accepted: " + gap
        path = comparison_report_file(settings.status_dir, plan.job, plan.current_version, plan.target_version, run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        self.log.info("report (%s):\n%s", path, text)
        return {**report, "report_file": str(path)}


class ResetJobStateOperator(BaseOperator):
    """Execute the reset part of the plan under the job's lease (refuses while a driver holds it)."""

    def execute(self, context):
        from spark_jobs.operations.reprocess.reset import ResetRefused, reset_in_place

        try:
            done = reset_in_place(Settings.from_env(), _plan(context))
        except ResetRefused as err:
            raise AirflowFailException(str(err)) from None
        self.log.info("reset done: %s", json.dumps(done, indent=2))
        return done


class PromoteJobVersionOperator(BaseOperator):
    """Switch the version pointer of a job (readers and supervision follow it). Dry run: says what
    would change. Returns ``{"old_version", "new_version", "changed"}`` for the retire steps."""

    template_fields = ("job", "version", "dry_run", "confirm")

    def __init__(
        self, *, job: str, version: int | str | None, dry_run: bool | str, confirm: str | None, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.job, self.version, self.dry_run, self.confirm = job, version, dry_run, confirm

    def execute(self, context):
        from spark_jobs.driver.lease import JobLease
        from spark_jobs.registry import JobSpecError
        from spark_jobs.state.source_position import committed_source_offsets
        from spark_jobs.versions import JobVersions

        settings = Settings.from_env()
        versions = JobVersions(settings)
        try:
            new = get_job(self.job, None if self.version in (None, "", "None") else self.version)
        except JobSpecError as err:
            _reject(context, str(err))
        old = versions.current_spec(self.job)
        resumed = new.version == old.version and versions.unfinished_promotion(self.job)
        if resumed:  # an earlier run moved the pointer, then died before the old version was stopped and retired
            old = get_job(self.job, resumed)
        dry_run = str(self.dry_run).lower() == "true"
        if not dry_run and self.confirm != self.job:
            _reject(context, f"promotion stops {old.application_id}; type {self.job!r} in 'confirm' to run it")
        committed = committed_source_offsets(JobLayout.of(new, settings), settings.kafka)
        if committed is None and new.version != old.version:
            _reject(
                context, f"{new.application_id} has not committed any batch yet; run reprocess_job side_by_side first"
            )
        running = JobLease(settings.status_dir, new.application_id).holder() is not None
        if new.version != old.version:
            from spark_jobs.operations.reprocess.purge import owned_targets

            self.log.info(
                "v%s and its standby will be stopped and retired; purge_retired_versions deletes, after "
                "the retention: %s",
                old.version,
                owned_targets(settings, JobLayout.of(old, settings)),
            )
        summary = {
            "old_version": old.version,
            "new_version": new.version,
            "changed": new.version != old.version,
            "new_running": running,
            "new_committed": committed,
            "dry_run": dry_run,
        }
        if resumed:
            summary["resumed"] = (
                f"v{new.version} is already current; finishing the promotion: stop and retire v{old.version}"
            )
            self.log.info(summary["resumed"])
        elif not summary["changed"]:
            summary["nothing_to_do"] = f"v{new.version} is already the current version: nothing to promote"
            self.log.info(summary["nothing_to_do"])
        self.log.info(
            "%spromote %s: v%s -> v%s (v%s %s, committed %s)",
            "DRY RUN: " if dry_run else "",
            self.job,
            old.version,
            new.version,
            new.version,
            "running" if running else "not running",
            committed,
        )
        if not dry_run and summary["changed"]:
            versions.promote(
                self.job,
                new.version,
                by=who_triggered(context),
                run_id=context["run_id"],
                note=f"promoted by {run_label(context)}",
            )
        return summary


class RetireJobVersionOperator(BaseOperator):
    """Record the old version as retired, keeping its data ``retain_days`` (purged after that by
    ``purge_retired_versions``)."""

    template_fields = ("job", "retain_days")

    def __init__(self, *, job: str, retain_days: int | str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.job, self.retain_days = job, retain_days

    def execute(self, context):
        from spark_jobs.versions import JobVersions

        promoted = context["ti"].xcom_pull(task_ids="promote")
        until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=float(self.retain_days))
        JobVersions(Settings.from_env()).retire(
            self.job,
            int(promoted["old_version"]),
            by=who_triggered(context),
            retain_until=until,
            run_id=context["run_id"],
        )
        self.log.info("%s v%s retired; its data is kept until %s", self.job, promoted["old_version"], until.isoformat())
        return {"retired_version": promoted["old_version"], "retain_until": until.isoformat()}


class RecordReprocessingOperator(BaseOperator):
    """The last task of every reprocessing run, whatever happened: append who, when, the parameters,
    the plan and the outcome to the audit table. The outcome is read from the steps' results:
    ``final_task`` (per mode) returned -> succeeded; otherwise the first step without a result failed."""

    def __init__(self, *, steps: dict[str, list[str]], plan_task: str = PLAN_TASK, **kwargs) -> None:
        super().__init__(trigger_rule="all_done", **kwargs)
        #: mode -> its tasks in order (the last one's result means the run succeeded)
        self.steps = steps
        #: the task whose result is the run's plan (or ``{"rejected": reason}``)
        self.plan_task = plan_task

    def execute(self, context):
        from spark_jobs.operations.reprocess.audit import record_run

        ti, params = context["ti"], dict(context["params"])
        plan = ti.xcom_pull(task_ids=self.plan_task) or {}
        mode = params.get("mode") or next(iter(self.steps))
        if "rejected" in plan:
            outcome, detail, plan = "rejected", plan["rejected"], None
        elif not plan:
            outcome, detail = "failed", f"the {self.plan_task} task failed"
        elif str(params.get("dry_run", True)).lower() == "true":
            outcome, detail = "dry_run", "nothing changed"
        elif plan.get("nothing_to_do"):
            outcome, detail = "succeeded", plan["nothing_to_do"]
        else:
            missing = [task for task in self.steps.get(mode, []) if ti.xcom_pull(task_ids=task) is None]
            outcome, detail = ("succeeded", "") if not missing else ("failed", f"step {missing[0]} did not finish")
        run = context["dag_run"]
        row = record_run(
            Settings.from_env(),
            run_id=context["run_id"],
            dag_id=ti.dag_id,
            job=params.get("job"),
            mode=mode,
            triggered_by=who_triggered(context),
            started_at=getattr(run, "start_date", None),
            params=params,
            plan=plan,
            outcome=outcome,
            detail=detail,
        )
        self.log.info("audit: %s %s (%s)", row["outcome"], row["detail"], row["run_id"])
        if outcome in ("failed", "rejected"):
            # this task is the run's only leaf: failing it is what marks the run failed
            raise AirflowFailException(f"run {outcome}: {detail}")
        return {"outcome": outcome, "detail": detail}


class PurgeRetiredVersionsOperator(BaseOperator):
    """Delete the data of retired versions whose retention (set at promotion) has passed. Lists
    every retired version, due or not, with what it owns; ``dry_run`` deletes nothing."""

    template_fields = ("dry_run",)

    def __init__(self, *, dry_run: bool | str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.dry_run = dry_run

    def execute(self, context):
        from spark_jobs.operations.reprocess.purge import purge_candidates, purge_version

        settings = Settings.from_env()
        dry_run = str(self.dry_run).lower() == "true"
        candidates = purge_candidates(settings)
        result = {"candidates": [c.to_dict() for c in candidates], "purged": {}}
        for c in candidates:
            self.log.info(
                "%s v%s: %s; owns %s",
                c.job,
                c.version,
                c.blocked or ("due (dry run)" if dry_run else "due"),
                c.targets or "nothing any more",
            )
            if c.blocked is None and not dry_run:
                result["purged"][application_id(c.job, c.version)] = purge_version(
                    settings, c.job, c.version, by=who_triggered(context), run_id=context["run_id"]
                )
        if not candidates:
            result["nothing_to_do"] = "no retired versions"
        return result
