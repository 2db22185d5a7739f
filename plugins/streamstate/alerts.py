"""Alerts: one per job and condition, opened once, resolved once.

:func:`reconcile` compares the conditions that hold now with the alerts already open (kept in the
supervision record) and returns only the changes: new alerts to fire and open ones to resolve. A
condition that persists across checks produces nothing, so repeated checks never spam; the stable
:func:`dedup_key` lets PagerDuty (and any webhook consumer) correlate a trigger with its resolve.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from streamstate.supervision import Condition

FIRING = "firing"
RESOLVED = "resolved"


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


def reconcile(
    job: str, application_id: str, open_alerts: dict[str, dict], now_holding: list[Condition], links: dict | None = None
) -> tuple[list[Alert], list[Alert]]:
    """(alerts to fire, alerts to resolve). Updates ``open_alerts`` in place to match."""
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
        open_alerts[name] = {
            "opened_at": at,
            "dedup_key": key,
            "severity": condition.severity,
            "summary": condition.summary,
        }
    resolve = []
    for name in [n for n in open_alerts if n not in holding]:
        opened = open_alerts.pop(name)
        resolve.append(
            Alert(
                job,
                application_id,
                name,
                RESOLVED,
                opened.get("severity", "info"),
                f"cleared (open since {opened['opened_at']}): {opened.get('summary', '')}",
                {},
                "",
                opened["dedup_key"],
                at,
                dict(links or {}),
            )
        )
    return fire, resolve
