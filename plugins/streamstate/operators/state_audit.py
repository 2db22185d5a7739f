"""Operators of the state-size audit DAG: read the checkpoints (Spark), then audit, alert and report.

The logic is in ``spark_jobs.operations.state_audit``; these operators pick the stores, hand the rows over, log
one line per store and tell on-call (once per condition, resolved when it clears) when a store has
crossed a budget or is projected to within its ``warn_days``, or when its declared TTL is measured not
to evict idle keys.
"""

from __future__ import annotations

import dataclasses

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from streamstate.alert_ledger import AlertLedger
from streamstate.operators.streaming_job import apply_submit
from streamstate.supervision import Condition

from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.documents import from_json, to_json
from spark_jobs.io.kafka_topics import existing_topics
from spark_jobs.layout import JobLayout
from spark_jobs.operations.state_audit.checkpoint_state import checkpoint_rows
from spark_jobs.operations.state_audit.collect import (
    audit_rows,
    audit_store,
    latest_changelog_measurements,
    record_audit,
)
from spark_jobs.operations.state_audit.report import write_report
from spark_jobs.operations.state_audit.rows import Measure, StoreAudit, TtlVerdict
from spark_jobs.registry import registered_versions
from spark_jobs.state.restore_history import restore_measurements

UNITS: dict[Measure, str] = {"rows": "rows", "bytes": "bytes", "restore_s": "s restore"}


@dataclasses.dataclass(frozen=True)
class StoreSummary:
    """One store's line in the audit task's result."""

    application_id: str
    store: str
    state_rows: int | None
    unbounded: bool | None
    days_to_budget: float | None
    ttl_verdict: TtlVerdict | None

    @classmethod
    def of(cls, audit: StoreAudit) -> StoreSummary:
        return cls(
            audit.application_id,
            audit.store,
            audit.state_rows,
            audit.unbounded,
            audit.days_to_budget,
            audit.ttl_verdict,
        )


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """What the audit task returns (its XCom): the report page and a summary of every store audited. Read it
    back with :meth:`of`."""

    report: str
    stores: tuple[StoreSummary, ...] = ()

    @classmethod
    def of(cls, xcom: dict) -> AuditResult:
        return from_json(cls, xcom)


class ReadCheckpointStateOperator(SparkSubmitOperator):
    """Run ``spark_jobs/operations/state_audit/checkpoint_state.py`` on ``spark_default`` for this run."""

    def __init__(self, *, conn_id: str = "spark_default", **kwargs) -> None:
        super().__init__(conn_id=conn_id, application="", **kwargs)

    def execute(self, context):
        from spark_jobs.driver.submit import application_submit_spec

        settings = Settings.from_env()
        apply_submit(
            self,
            application_submit_spec(
                settings,
                "state-audit-checkpoints",
                PROJECT_ROOT / "spark_jobs" / "operations" / "state_audit" / "checkpoint_state.py",
                (context["run_id"],),
            ),
        )
        super().execute(context)


def conditions_for(audit: StoreAudit) -> list[Condition]:
    """A crossed budget (error), or one projected to be crossed within warn_days (warning); a declared
    TTL that does not evict (warning)."""
    return budget_conditions(audit) + ttl_conditions(audit)


def ttl_conditions(audit: StoreAudit) -> list[Condition]:
    """The store declares ``ttl_ms`` but its changelog holds live keys idle far longer (``ttl_not_enforced``)."""
    if audit.ttl_verdict != "ttl_not_enforced":
        return []
    store = audit.store
    numbers = {
        "ttl_ms": audit.ttl_ms,
        "keys_checked": audit.ttl_keys_checked,
        "keys_overdue": audit.ttl_keys_overdue,
        "oldest_overdue_ms": audit.ttl_oldest_overdue_ms,
    }
    return [
        Condition(
            f"state_ttl_not_enforced_{store}",
            "warning",
            f"store {store} declares a TTL but does not evict: {audit.ttl_reason}",
            numbers,
            "check that the job's processor registers a timer per key and deletes the key when it fires "
            "(and that the job still runs batches); until then the store keeps every key it ever saw",
        )
    ]


def _likely_cause(audit: StoreAudit) -> str:
    if audit.unbounded:
        return audit.unbounded_reason
    return f"growing {audit.rows_per_day:,.0f} rows/day" if audit.rows_per_day else "size without visible growth"


def budget_conditions(audit: StoreAudit) -> list[Condition]:
    """A crossed budget (error), or one projected to be crossed within warn_days (warning)."""
    checks = audit.budget_status
    cause = _likely_cause(audit)
    numbers = {c.measure: round(c.current, 1) for c in checks} | {f"max_{c.measure}": c.limit for c in checks}
    crossed = [c for c in checks if c.crossed]
    store = audit.store
    if crossed:
        what = ", ".join(f"{c.current:,.0f} {UNITS[c.measure]} > budget {c.limit:,.0f}" for c in crossed)
        return [
            Condition(
                f"state_budget_{store}",
                "error",
                f"store {store} is over its budget: {what}; likely cause: {cause}",
                numbers,
                "shrink the state (TTL, retention, deletes) or raise the budget in the registry "
                "after checking the restore time; the state-size report has the trend",
            )
        ]
    soon = [c for c in checks if c.days_left is not None and c.days_left <= (audit.budget_warn_days or 7)]
    if soon:
        first = min(soon, key=lambda c: c.days_left)
        return [
            Condition(
                f"state_budget_forecast_{store}",
                "warning",
                f"store {store} will cross its {first.measure} budget ({first.limit:,.0f}) in "
                f"{first.days_left:.1f} days at {first.per_day:,.0f}/day; likely cause: {cause}",
                numbers | {"days_left": round(first.days_left, 2)},
                "act before the budget is crossed: the state-size report has the trend",
            )
        ]
    return []


class AuditStateSizeOperator(BaseOperator):
    """Audit every store of every registered job version that has any state; append the rows to
    ``_streamstate/state_audit``, alert on budgets, write the report."""

    def execute(self, context):
        settings = Settings.from_env()
        run_id = context["run_id"]
        read = checkpoint_rows(settings, run_id)
        if not read:
            self.log.warning(
                "no live state read from checkpoints in this run (the read task failed, or no job has "
                "committed a batch): live rows come from the jobs' latest progress"
            )
        latest_changelog = latest_changelog_measurements(settings)
        restores = restore_measurements(settings)
        ledger = AlertLedger(settings.status_dir)
        audited, by_store, undelivered = [], {}, []
        for versions in registered_versions().values():
            for spec in versions.values():
                layout = JobLayout.of(spec, settings)
                topics = list(layout.changelog_topics)
                present = existing_topics(settings.kafka, topics) if topics else set()
                if not layout.checkpoint.exists() and not present:
                    continue  # never ran here
                for store in spec.stores:
                    history = audit_rows(settings, spec.application_id, store.name)
                    audit = audit_store(
                        settings,
                        run_id,
                        spec,
                        store,
                        checkpoint_rows=[
                            r for r in read if r.application_id == spec.application_id and r.store == store.name
                        ],
                        changelog=latest_changelog.get(layout.changelog_topic(store.name)),
                        restores=restores,
                        history=history,
                    )
                    audited.append(audit)
                    by_store[(spec.application_id, store.name)] = [*history, audit]
                    self._log(audit)
                    undelivered += self._alert(context, ledger, spec, audit)
        record_audit(settings, audited)
        page = write_report(settings, by_store)
        self.log.info("report: %s (%d stores)", page, len(by_store))
        if undelivered:
            raise AirflowFailException(f"alerts not delivered on any channel: {undelivered}")
        return to_json(AuditResult(str(page), tuple(StoreSummary.of(audit) for audit in audited)))

    def _log(self, audit: StoreAudit) -> None:
        """One line per store (two with a TTL check)."""
        self.log.info(
            "%s/%s: %s live rows (%s), restore ~%s s (snapshot + tail) / ~%s s (full), %s/day, days to budget %s%s",
            audit.application_id,
            audit.store,
            audit.state_rows,
            audit.state_rows_source,
            _round(audit.restore_snapshot_tail_s),
            _round(audit.restore_full_replay_s),
            _round(audit.rows_per_day),
            _round(audit.days_to_budget),
            f"; UNBOUNDED: {audit.unbounded_reason}" if audit.unbounded else "",
        )
        if audit.ttl_verdict:
            self.log.info("%s/%s: %s: %s", audit.application_id, audit.store, audit.ttl_verdict, audit.ttl_reason)

    @staticmethod
    def _alert(context, ledger: AlertLedger, spec, audit: StoreAudit) -> list[str]:
        """Fire / resolve this store's budget and TTL alerts; the job's other alerts are left alone."""
        store = audit.store
        delivery = ledger.reconcile_and_send(
            context,
            job=spec.name,
            application_id=spec.application_id,
            source="state_audit",
            conditions=conditions_for(audit),
            links={"report": "/streamstate/state-audit/index.html"},
            scope={f"state_budget_{store}", f"state_budget_forecast_{store}", f"state_ttl_not_enforced_{store}"},
        )
        return [alert.dedup_key for alert, _ in delivery.undelivered]


def _round(value):
    return None if value is None else round(value, 1)
