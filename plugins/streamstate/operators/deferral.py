"""Deferring only when the wait is long.

Airflow 3.3 fails a deferred task whose trigger fires before the scheduler has processed the executor's report of
the worker leaving the deferral: the report ("success") then meets a task instance already queued or running
again, which the scheduler takes for a task killed from outside (apache/airflow#67287 and #72716; fixed upstream
for a queued task by #68741, after 3.3.2, the newest release). A trigger that fires at once invites it: a driver
that reaches RESTORING seconds after its launch failed a manual start in the UI that way (the suite on
2026-12-03). So an operator waits for what its trigger waits for in its own worker first, for
:data:`SETTLE_BEFORE_DEFER_S`, and defers only when that is not enough; and the trigger it defers on fires no
sooner than :data:`DEFERRED_AT_LEAST_S` after the deferral (``WaitingTrigger.fires_after``), by when the scheduler
has seen the worker go. That second rule covers what the first cannot: a watched driver killed just as its watch
deferred (the suite on 2026-12-03 again: the trigger fired 1.2 s after the deferral, the executor's report of the
worker's exit reached the scheduler 5.4 s after it, on two busy cores; the resumed try was failed, and its retry
took over its launch).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from streamstate.triggers.events import WaitOutcome

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from streamstate.triggers.streaming_job import WaitingTrigger

#: how long an operator waits in its worker before it defers (a driver reaching RUNNING or stopping takes seconds)
SETTLE_BEFORE_DEFER_S = 30.0
#: the least time between a deferral and its trigger's event (the scheduler saw the worker's exit 5.4 s after it
#: on a loaded machine; what it costs: a driver that exits within this of its watch's deferral restarts that late)
DEFERRED_AT_LEAST_S = 15.0


def defer_unless_settled(
    operator: BaseOperator,
    context,
    trigger: WaitingTrigger,
    method_name: str,
    within_s: float = SETTLE_BEFORE_DEFER_S,
) -> Any:
    """Resume ``operator`` through ``method_name`` at once when ``trigger``'s event comes within ``within_s`` (its
    return value is the task's), else defer on ``trigger``, to fire no sooner than :data:`DEFERRED_AT_LEAST_S`
    from now (raises ``TaskDeferred``, as ``BaseOperator.defer`` does)."""
    event = trigger.settled_within(within_s)
    if event is not None:
        operator.log.info("settled without deferring: %s", WaitOutcome.of(event).state)
        return getattr(operator, method_name)(context, event)
    trigger.fires_after = time.time() + DEFERRED_AT_LEAST_S
    operator.defer(trigger=trigger, method_name=method_name)
