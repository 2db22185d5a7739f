"""What a waiting trigger fires with, typed: the triggerer builds a :class:`WaitOutcome`, Airflow carries its
:meth:`~WaitOutcome.payload` (JSON) to the resumed task, and the operator reads it back with :meth:`WaitOutcome.of`:
attributes, not string keys, on both sides of the process boundary (:mod:`spark_jobs.documents`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from spark_jobs.documents import from_json, to_json
from spark_jobs.driver.lease import LeaseHolder

#: what the wait ended with: a launched process ``running`` (holds its lease), ``already_running`` (another held it),
#: ``failed``; a stopped driver ``stopped``; a drained version ``caught_up``; a watched driver ``exited``; or
#: ``timeout``
WaitState = Literal["running", "already_running", "failed", "stopped", "caught_up", "exited", "timeout"]


@dataclasses.dataclass(frozen=True)
class WaitOutcome:
    """One trigger event: its ``state``, the facts that state comes with (the others None), and the echoes of the
    operator that deferred (``launch_at``, ``version``, ``carry``)."""

    state: WaitState
    #: running: the new holder's lease epoch; exited: the epoch watched
    epoch: int | None = None
    #: running: the holder's pid
    pid: int | None = None
    #: running: the driver's published lifecycle state (RUNNING, or RESTORING: a long restore counts as started)
    lifecycle_state: str | None = None
    #: failed: the launch's exit code (None: the driver published ERROR before it exited) and why it failed;
    #: exited, stopped: the error the driver published last
    exit_code: int | None = None
    error: str | None = None
    #: already_running: the lease's holder
    holder: LeaseHolder | None = None
    #: stopped, exited: the driver's last published lifecycle state
    final_state: str | None = None
    #: caught_up, stopped (a drain): the offsets committed (topic -> partition -> offset), and those still behind
    committed: dict[str, dict[str, int]] | None = None
    behind: dict[str, dict[str, int]] | None = None
    #: timeout: how long the trigger waited
    timeout_s: float | None = None
    #: the deferring operator's echoes: which launch, of which version, and its own state across the deferral
    #: (``dag.test()`` passes a resumed method the event only, not the ``kwargs`` of ``defer``)
    launch_at: float | None = None
    version: int | None = None
    carry: dict[str, Any] | None = None

    def payload(self) -> dict[str, Any]:
        """The event's JSON: the fields that are set."""
        return {name: value for name, value in to_json(self).items() if value is not None}

    @classmethod
    def of(cls, event: Mapping[str, Any]) -> WaitOutcome:
        """The outcome an operator's resumed method was given (its payload)."""
        return from_json(cls, event)
