"""Operators of the changelog compaction tuning DAG: measure, tune (dry run / apply / roll back), verify.

The logic is in ``spark_jobs.operations.changelog_tuning`` (plain Python); these operators read the run's
params, log every measurement and every recommendation with its reason, and hand the measurements
to the next tasks through XCom.
"""

from __future__ import annotations

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from streamstate.alert_ledger import AlertLedger
from streamstate.operators.streaming_job import who_triggered
from streamstate.supervision import Condition

from runtime.settings import Settings
from spark_jobs.layout import application_id
from spark_jobs.operations.changelog_tuning import history
from spark_jobs.operations.changelog_tuning.latest import LatestMeasurement, write_latest
from spark_jobs.operations.changelog_tuning.measure import ChangelogMeasurement, changelog_targets, describe_measurement
from spark_jobs.operations.changelog_tuning.recommend import human_ms, recommend
from spark_jobs.operations.changelog_tuning.tuner import apply_recommendations, measure_all, roll_back

MEASURE_TASK = "measure"
MODES = ("dry_run", "apply", "rollback")


def _measured(context) -> list[tuple[dict, ChangelogMeasurement]]:
    data = context["ti"].xcom_pull(task_ids=MEASURE_TASK) or []
    return [(item, ChangelogMeasurement.from_dict(item["measurement"])) for item in data]


def tuning_mode(context, settings: Settings) -> str:
    """Scheduled runs follow the deployment's policy; a manual run does what its form says."""
    run_type = getattr(context["dag_run"], "run_type", "")
    if getattr(run_type, "value", run_type) == "scheduled":
        return settings.compaction.scheduled_mode
    mode = context["params"].get("mode", "dry_run")
    if mode not in MODES:
        raise AirflowFailException(f"mode {mode!r}: expected one of {MODES}")
    return mode


class MeasureChangelogsOperator(BaseOperator):
    """Measure every changelog topic of every registered job version; record and return the measurements."""

    def execute(self, context):
        settings = Settings.from_env()
        results = measure_all(
            settings,
            context["run_id"],
            on_topic=lambda i, n, m: self.log.info("[%d/%d] %s", i, n, describe_measurement(m)),
        )
        if not results:
            self.log.info("no changelog topic exists yet (no job has run)")
        _write_latest(settings, results)
        return [
            {
                "job": t.spec.name,
                "version": t.spec.version,
                "store": t.store.name,
                "kind": t.store.kind,
                "measurement": m.to_dict(),
            }
            for t, m in results
        ]


class TuneChangelogsOperator(BaseOperator):
    """dry_run: recommend and record, change nothing. apply: recommend, validate, apply, verify.
    rollback: restore the values a change replaced (``rollback_run_id``, default the newest) and hold
    the topic. ``topics`` limits the run to those topics; naming a held topic in an apply resumes it."""

    def execute(self, context):
        settings = Settings.from_env()
        mode = tuning_mode(context, settings)
        params = context["params"]
        named = set(params.get("topics") or [])
        by = who_triggered(context)
        run_id = context["run_id"]
        targets = {t.topic: t for t in changelog_targets()}
        unknown = named - set(targets)
        if unknown:
            raise AirflowFailException(f"topics {sorted(unknown)} are not changelogs of registered jobs")
        outcomes = []
        if mode == "rollback":
            chosen = sorted(named) or sorted(
                {r["topic"] for r in history.changes(settings) if r["action"] == history.APPLIED}
            )
            for topic in chosen:
                if topic not in targets:
                    continue
                outcome = roll_back(
                    settings, run_id, targets[topic], undo_run_id=params.get("rollback_run_id") or None, by=by
                )
                self.log.info("%s: %s %s %s", topic, outcome.action, outcome.changes, outcome.detail)
                outcomes.append(outcome)
        else:
            dry_run = mode == "dry_run"
            self.log.info(
                "%s",
                "DRY RUN - recommendations are validated by the broker and recorded, nothing is changed"
                if dry_run
                else "APPLY - recommendations are validated, applied and verified",
            )
            for _item, m in _measured(context):
                if named and m.topic not in named:
                    continue
                target = targets[m.topic]
                if m.topic not in named and history.is_held(history.changes(settings, m.topic)):
                    self.log.info(
                        "%s: held since a rollback; trigger an apply naming it in 'topics' to resume", m.topic
                    )
                    outcomes.append({"topic": m.topic, "action": "held"})
                    continue
                recs = recommend(target.spec, target.store, m, settings.compaction)
                for rec in recs:
                    self.log.info(
                        "%s: %s%s %s -> %s because %s",
                        m.topic,
                        "HELD BY THE JOB: " if rec.held_by_job else "",
                        rec.config,
                        rec.current,
                        rec.proposed,
                        rec.reason,
                    )
                applicable = [rec for rec in recs if not rec.held_by_job]  # the team's own configs win
                outcome = apply_recommendations(settings, run_id, target, applicable, dry_run=dry_run, by=by)
                self.log.info("%s: %s %s", m.topic, outcome.action, outcome.detail)
                outcomes.append(outcome)
        result = [
            o
            if isinstance(o, dict)
            else {"topic": o.topic, "action": o.action, "changes": o.changes, "detail": o.detail}
            for o in outcomes
        ]
        failed = [o for o in result if o["action"] == "failed"]
        if failed:
            raise AirflowFailException(f"{len(failed)} topic(s) not changed: " + "; ".join(o["detail"] for o in failed))
        return result


def _write_latest(settings: Settings, results) -> None:
    write_latest(
        settings,
        {
            m.topic: LatestMeasurement(
                application_id=t.spec.application_id,
                store=t.store.name,
                records=m.records,
                live_keys=m.live_keys,
                replay_ratio=round(m.replay_ratio, 2),
                excess_replay_ratio=round(m.excess_replay_ratio, 2),
                bytes=m.bytes,
                measured_at=m.measured_at.isoformat(timespec="seconds"),
                target=settings.compaction.target_replay_ratio,
            )
            for t, m in results
        },
    )


class VerifyCompactionOperator(BaseOperator):
    """Judge the effect of earlier changes: records a restore would replay vs live keys when the
    newest change was made and now; alert on-call (once, resolved when it clears) when a topic has
    stayed above the target ratio for ``alert_after_runs`` runs."""

    def execute(self, context):
        settings = Settings.from_env()
        policy = settings.compaction
        ledger = AlertLedger(settings.status_dir)
        run_id = context["run_id"]
        summary, undelivered = [], []
        for item, m in _measured(context):
            measured = history.measurements(settings, m.topic)
            earlier_changes = [r for r in history.changes(settings, m.topic) if r["run_id"] != run_id]
            effect = history.before_and_after(measured, earlier_changes)
            streak = history.runs_above_target(measured, policy.target_replay_ratio)
            if effect:
                self.log.info(
                    "%s: since the %s of %s: %s records for %s live keys -> %s for %s (%.1fx fewer)",
                    m.topic,
                    effect["change"],
                    effect["changed_at"],
                    effect["before"]["records"],
                    effect["before"]["live_keys"],
                    effect["now"]["records"],
                    effect["now"]["live_keys"],
                    effect["records_reduction"],
                )
            conditions = []
            if streak >= policy.alert_after_runs:
                conditions.append(self._condition(m, item["store"], streak, earlier_changes, settings))
            app, name = application_id(item["job"], item["version"]), _condition_name(item["store"])
            # only this store's condition is reconciled here; the job's other stores keep theirs
            delivery = ledger.reconcile_and_send(
                context,
                job=item["job"],
                application_id=app,
                source="changelog_tuning",
                conditions=conditions,
                scope={name},
            )
            undelivered += [alert.dedup_key for alert, _ in delivery.undelivered]
            summary.append(
                {
                    "topic": m.topic,
                    "replay_ratio": round(m.replay_ratio, 2),
                    "runs_above_target": streak,
                    "effect": effect,
                    "alerting": any(a.condition == name for a in ledger.open_alerts(app, "changelog_tuning")),
                }
            )
        if undelivered:
            raise AirflowFailException(f"alerts not delivered on any channel: {undelivered}")
        return summary

    @staticmethod
    def _condition(
        m: ChangelogMeasurement, store: str, streak: int, change_rows: list[dict], settings: Settings
    ) -> Condition:
        policy = settings.compaction
        if history.is_held(change_rows):
            next_step = (
                "tuning of this topic is held since a rollback: fix the cause, then trigger "
                f"tune_changelog_compaction with mode=apply and topics=[{m.topic}]"
            )
        elif policy.scheduled_mode == "dry_run" and not any(r["action"] == history.APPLIED for r in change_rows):
            next_step = (
                "scheduled runs only recommend (STREAMSTATE_COMPACTION_SCHEDULED_MODE=dry_run): review and apply"
            )
        else:
            next_step = (
                "configs are tuned but the log is not getting smaller: check the broker's log cleaner "
                "(log-cleaner.log: a dead cleaner thread, or a dedupe buffer too small for the key count)"
            )
        age = "-" if m.oldest_obsolete_age_ms is None else human_ms(m.oldest_obsolete_age_ms)
        return Condition(
            name=_condition_name(store),
            severity="warning",
            summary=(
                f"{m.topic}: a restore replays {m.records:,} records for {m.live_keys:,} live keys "
                f"({m.excess_replay_ratio:.1f} per key beyond kept history), above the target "
                f"{policy.target_replay_ratio:g} for {streak} runs"
            ),
            numbers={
                "records": m.records,
                "live_keys": m.live_keys,
                "replay_ratio": round(m.excess_replay_ratio, 2),
                "target": policy.target_replay_ratio,
                "runs": streak,
                "dirty_ratio": m.dirty_ratio,
                "oldest_removable_age": age,
            },
            next_step=next_step,
        )


def _condition_name(store: str) -> str:
    return f"changelog_replay_{store}"
