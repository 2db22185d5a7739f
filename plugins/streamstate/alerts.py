"""Alerts: one per job and condition, opened once, resolved once.

:func:`reconcile` compares the conditions that hold now with the alerts already open (an
:class:`OpenAlert` each, kept in the alert ledger: ``streamstate/alert_ledger.py``) and returns only the
changes: new alerts to fire and open ones to resolve. A condition that persists across checks produces
nothing, so repeated checks never spam; the stable :func:`dedup_key` lets PagerDuty (and any webhook
consumer) correlate a trigger with its resolve.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Literal, get_args

from streamstate.supervision import Condition

FIRING = "firing"
RESOLVED = "resolved"

#: who decides an alert: the supervise DAG's check of the driver, of its spare driver and of its warm standby,
#: the changelog compaction tuner, the state-size audit, a batch job's runs
Source = Literal["supervision", "spare", "standby", "changelog_tuning", "state_audit", "batch"]
SOURCES: tuple[Source, ...] = get_args(Source)


def dedup_key(application_id: str, condition: str) -> str:
    return f"streamstate/{application_id}/{condition}"


@dataclasses.dataclass(frozen=True)
class Alert:
    job: str
    application_id: str
    condition: str
    #: firing | resolved
    status: str
    severity: str
    summary: str
    numbers: dict
    next_step: str
    dedup_key: str
    at: str
    links: dict = dataclasses.field(default_factory=dict)

    @property
    def title(self) -> str:
        verb = "RESOLVED" if self.status == RESOLVED else self.severity.upper()
        return f"[{verb}] {self.job}: {self.condition.replace('_', ' ')}"

    def text(self) -> str:
        numbers = ", ".join(f"{k}={v}" for k, v in self.numbers.items())
        lines = [self.title, self.summary]
        if numbers:
            lines.append(f"Numbers: {numbers}")
        if self.next_step:
            lines.append(f"Next step: {self.next_step}")
        lines += [f"{name}: {url}" for name, url in self.links.items()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "title": self.title}

    @classmethod
    def from_dict(cls, body: dict) -> Alert:
        """The alert a webhook received (:meth:`to_dict`'s output); keys it does not know are ignored."""
        return cls(**{f.name: body[f.name] for f in dataclasses.fields(cls) if f.name in body})


@dataclasses.dataclass(frozen=True)
class OpenAlert:
    """An alert on-call was told about and not yet told is resolved."""

    #: the job version's application id (``<job>-v<version>``)
    application_id: str
    source: Source
    condition: str
    job: str
    severity: str
    summary: str
    dedup_key: str
    #: when it fired (ISO 8601, UTC)
    opened_at: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.application_id, self.source, self.condition)

    @classmethod
    def of(cls, alert: Alert, source: Source) -> OpenAlert:
        """The record of ``alert``, fired and delivered."""
        return cls(
            alert.application_id,
            source,
            alert.condition,
            alert.job,
            alert.severity,
            alert.summary,
            alert.dedup_key,
            alert.at,
        )


def reconcile(
    job: str,
    application_id: str,
    open_alerts: Mapping[str, OpenAlert],
    now_holding: list[Condition],
    links: dict | None = None,
) -> tuple[list[Alert], list[Alert]]:
    """(alerts to fire, alerts to resolve): the conditions in ``now_holding`` not open yet, and the open
    alerts (condition -> :class:`OpenAlert`) whose condition no longer holds. Records nothing."""
    at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    holding = {c.name: c for c in now_holding}
    fire = []
    for name, condition in holding.items():
        if name in open_alerts:
            continue
        key = dedup_key(application_id, name)
        fire.append(
            Alert(
                job,
                application_id,
                name,
                FIRING,
                condition.severity,
                condition.summary,
                condition.numbers,
                condition.next_step,
                key,
                at,
                dict(links or {}),
            )
        )
    resolve = []
    for name, opened in open_alerts.items():
        if name in holding:
            continue
        resolve.append(
            Alert(
                job,
                application_id,
                name,
                RESOLVED,
                opened.severity,
                f"cleared (open since {opened.opened_at}): {opened.summary}",
                {},
                "",
                opened.dedup_key,
                at,
                dict(links or {}),
            )
        )
    return fire, resolve
