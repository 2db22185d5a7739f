"""The alert ledger: every open alert of every source, in one file of the status directory.

Five checks decide alerts: supervision (the driver), the standby check, the changelog compaction tuner,
the state-size audit and a batch job's runs (:data:`~streamstate.alerts.Source`). Each calls
:meth:`AlertLedger.reconcile_and_send` with the conditions that hold now; the ledger compares them with
the alerts it holds open for that job version and source (:func:`~streamstate.alerts.reconcile`),
sends what changed through the configured channels (:func:`streamstate.notifiers.routing.send`), and
records it. One rule for a failed delivery: an alert no channel took is not recorded (neither opened nor
resolved), so the next check finds the same change and tries again; the alerts that were delivered are
recorded whatever happened to the others.

The file (``<status_dir>/alert_ledger/open.json``) is rewritten whole by an atomic rename under an
exclusive lock (``runtime/files.py``): the jobs page reads it without a lock, and writers in other
processes (several supervise DAGs, the audit, the tuner) never lose each other's records. A check holds
a lock of its own (job version and source) while it sends, so two checks of the same alerts take turns
without keeping the others waiting on a slow channel.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from pathlib import Path

from streamstate.alerts import SOURCES, Alert, OpenAlert, Source, dedup_key, reconcile
from streamstate.notifiers import routing
from streamstate.supervision import Condition

from runtime.files import exclusive, write_json_atomically
from spark_jobs.layout import AUDIT_REPORT_DIR, STANDBY_SUFFIX, job_of

#: the ledger's folder in the status directory (its file and its locks)
LEDGER_DIR = "alert_ledger"
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Delivery:
    """What one :meth:`AlertLedger.reconcile_and_send` found and sent."""

    fired: tuple[Alert, ...]
    resolved: tuple[Alert, ...]
    #: (alert, channel -> "sent" | "error: ...") of each alert no channel took: not recorded
    undelivered: tuple[tuple[Alert, dict[str, str]], ...]

    @property
    def fired_conditions(self) -> list[str]:
        return [a.condition for a in self.fired]

    @property
    def resolved_conditions(self) -> list[str]:
        return [a.condition for a in self.resolved]


class AlertLedger:
    """The open alerts of every job version and source (the only reader and writer of its file)."""

    def __init__(self, status_dir: Path) -> None:
        self.folder = Path(status_dir) / LEDGER_DIR
        self.path = self.folder / "open.json"

    def open_alerts(self, application_id: str | None = None, source: Source | None = None) -> list[OpenAlert]:
        """The open alerts (of one job version, of one source), oldest first. No lock: the file is only
        ever replaced whole."""
        return [
            a
            for a in sorted(self._read().values(), key=lambda a: (a.opened_at, a.key))
            if (application_id is None or a.application_id == application_id) and (source is None or a.source == source)
        ]

    def reconcile_and_send(
        self,
        context,
        *,
        job: str,
        application_id: str,
        source: Source,
        conditions: list[Condition],
        links: dict | None = None,
        scope: Collection[str] | None = None,
    ) -> Delivery:
        """Fire the ``conditions`` that are not open yet and resolve the open alerts of
        (``application_id``, ``source``) that no longer hold; send each, record those delivered.

        ``scope``: the condition names this check decides (a store's, say), when it does not decide
        all of its source's for the job version: open alerts outside it are left alone."""
        if source not in SOURCES:
            raise ValueError(f"source {source!r}: expected one of {SOURCES}")
        if scope is not None and (outside := [c.name for c in conditions if c.name not in scope]):
            raise ValueError(f"conditions {outside} are outside the check's scope {sorted(scope)}")
        if not self.path.exists():
            self._import_earlier_records()
        with exclusive(self.folder / f"{source}@{application_id}"):
            mine = {
                a.condition: a
                for a in self.open_alerts(application_id, source)
                if scope is None or a.condition in scope
            }
            fire, resolve = reconcile(job, application_id, mine, conditions, links)
            undelivered = []
            for alert in fire + resolve:
                results = routing.send(alert, context)
                if not any(result == "sent" for result in results.values()):
                    undelivered.append((alert, results))
            if len(undelivered) < len(fire) + len(resolve):
                failed = {id(alert) for alert, _ in undelivered}
                with exclusive(self.path):
                    ledger = self._read()
                    for alert in fire:
                        if id(alert) not in failed:
                            opened = OpenAlert.of(alert, source)
                            ledger[opened.key] = opened
                    for alert in resolve:
                        if id(alert) not in failed:
                            ledger.pop((application_id, source, alert.condition), None)
                    self._write(ledger)
        return Delivery(tuple(fire), tuple(resolve), tuple(undelivered))

    def _import_earlier_records(self) -> None:
        """Once, before the ledger's first record: the open alerts the checks kept in their own places
        before it (supervision records' ``open_alerts``, the tuner's and the audit's ``open_alerts.json``),
        so an upgrade neither repeats an alert on-call has nor forgets to resolve one. The two files go."""
        status_dir = self.folder.parent
        earlier: list[tuple[str, Source, dict]] = []
        for path in status_dir.glob("*.supervision.json"):
            name = path.name.removesuffix(".supervision.json")
            try:
                alerts = json.loads(path.read_text()).get("open_alerts") or {}
            except (OSError, ValueError):
                continue
            if name.endswith(STANDBY_SUFFIX):
                earlier.append((name.removesuffix(STANDBY_SUFFIX), "standby", alerts))
            else:
                earlier.append((name, "supervision", alerts))
        files = {"changelog_tuning": status_dir / "changelog_tuning", "state_audit": status_dir / AUDIT_REPORT_DIR}
        for source, folder in files.items():
            try:
                by_app = json.loads((folder / "open_alerts.json").read_text())
            except (OSError, ValueError):
                continue
            earlier += [(app, source, alerts) for app, alerts in by_app.items()]
        with exclusive(self.path):
            if self.path.exists():
                return  # another process imported them first
            ledger = {}
            for app, source, alerts in earlier:
                for condition, opened in alerts.items():
                    alert = OpenAlert(
                        app,
                        source,
                        condition,
                        job_of(app),
                        opened.get("severity", "info"),
                        opened.get("summary", ""),
                        opened.get("dedup_key") or dedup_key(app, condition),
                        opened.get("opened_at", ""),
                    )
                    ledger[alert.key] = alert
            self._write(ledger)
        for folder in files.values():
            (folder / "open_alerts.json").unlink(missing_ok=True)

    def _read(self) -> dict[tuple[str, str, str], OpenAlert]:
        try:
            document = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        alerts = (OpenAlert(**record) for record in document["open"])
        return {a.key: a for a in alerts}

    def _write(self, ledger: dict[tuple[str, str, str], OpenAlert]) -> None:
        records = [dataclasses.asdict(a) for _, a in sorted(ledger.items())]
        write_json_atomically(self.path, {"format": FORMAT, "open": records})
