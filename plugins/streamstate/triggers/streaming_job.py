"""Triggers that only wait: for a launched driver to reach RUNNING, for a stopped one to let go, or for
a running one to exit.

They read the same files the hook does (lease, status, the launch's exit code); the decisions are
made by the operators when the trigger fires.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import inspect
import socket
import time
from collections.abc import AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent
from streamstate.triggers.events import WaitOutcome

from runtime.process import process_alive
from spark_jobs.driver.lease import ALREADY_RUNNING, JobLease
from spark_jobs.driver.lifecycle import JobState, published_by_holder, read_status


class WaitingTrigger(BaseTrigger):
    """A trigger that waits by calling its blocking :meth:`check` every ``poll_s`` for ``timeout_s``, and whose
    constructor's arguments, kept as attributes of the same names, are all it serializes.

    ``fires_after`` (epoch seconds): the trigger does not look before then, so it fires no sooner. A deferring
    operator sets it (:func:`~streamstate.operators.deferral.defer_unless_settled`): a trigger that fires within
    seconds of its deferral makes Airflow 3.3 fail the resumed task (see that module)."""

    timeout_s: float
    poll_s: float

    def __init__(self, fires_after: float = 0.0) -> None:
        super().__init__()
        self.fires_after = fires_after

    def serialize(self) -> tuple[str, dict]:
        names = [n for n in inspect.signature(type(self).__init__).parameters if n != "self"]
        return f"{type(self).__module__}.{type(self).__qualname__}", {n: getattr(self, n) for n in names}

    @abc.abstractmethod
    def check(self) -> WaitOutcome | None:
        """What the trigger waits for, looked at once: the outcome (before :meth:`event`), or None (not yet)."""

    def event(self, checked: WaitOutcome) -> WaitOutcome:
        """The outcome fired for what :meth:`check` (or the timeout) returned: the operator's echoes added."""
        return checked

    def _look(self, waited_s: float) -> WaitOutcome | None:
        """:meth:`check`, or the timeout's outcome once ``waited_s`` reached ``timeout_s``; None: wait on."""
        checked = self.check()
        if checked is None and waited_s >= self.timeout_s:
            checked = WaitOutcome("timeout", timeout_s=self.timeout_s)
        return checked

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.monotonic()
        await asyncio.sleep(max(0.0, self.fires_after - time.time()))  # (counts towards the timeout)
        while (checked := await asyncio.to_thread(self._look, time.monotonic() - started)) is None:
            await asyncio.sleep(self.poll_s)
        yield TriggerEvent(self.event(checked).payload())

    def settled_within(self, seconds: float) -> dict | None:
        """The event (its payload, as a resumed operator gets it) this trigger would fire, when it would fire within
        ``seconds`` (what it waits for happened, or its timeout passed), polled here in the caller's thread; else
        None, and ``timeout_s`` is then what is left of the wait, for the deferral. See
        :func:`streamstate.operators.deferral.defer_unless_settled`."""
        started = time.monotonic()
        while (checked := self._look(waited := time.monotonic() - started)) is None:
            if waited >= seconds:
                self.timeout_s -= waited
                return None
            time.sleep(self.poll_s)
        return self.event(checked).payload()


class StreamingJobStartedTrigger(WaitingTrigger):
    """Fires when the driver of a launch runs (or restores), failed, found another driver running, or
    timed out.

    Outcome ``state``: ``running`` (with ``epoch``, ``pid``, ``lifecycle_state``), ``already_running`` (with
    ``holder``), ``failed`` (with ``exit_code`` and ``error``) or ``timeout``.
    """

    def __init__(
        self,
        application_id: str,
        status_dir: str,
        launcher_pid: int,
        exit_file: str,
        previous_epoch: int,
        timeout_s: float,
        launch_at: float = 0.0,
        poll_s: float = 0.5,
        version: int | None = None,
        carry: dict | None = None,
        fires_after: float = 0.0,
    ) -> None:
        super().__init__(fires_after)
        #: the operator's own state across the deferral, echoed in the event (``dag.test()`` passes a
        #: resumed method the event only, not the ``kwargs`` of ``defer``)
        self.carry = carry
        #: which launch this is and of which version (echoed in every event: the operator finds its record by it)
        self.launch_at = launch_at
        self.version = version
        self.application_id = application_id
        self.status_dir = status_dir
        self.launcher_pid = launcher_pid
        self.exit_file = exit_file
        self.previous_epoch = previous_epoch
        self.timeout_s = timeout_s
        self.poll_s = poll_s

    def check(self) -> WaitOutcome | None:
        from streamstate.hooks.streaming_job import exit_code, process_alive

        holder = JobLease(self.status_dir, self.application_id).holder()
        status = read_status(self.status_dir, self.application_id)
        ours = holder is not None and holder.epoch > self.previous_epoch
        if ours and published_by_holder(status, holder):
            if status.state in (JobState.RUNNING, JobState.RESTORING):
                # Restoring counts as started: a long restore is watched by the restore budget alert,
                # and killing it at the start timeout would only restart the restore.
                return WaitOutcome("running", epoch=holder.epoch, pid=holder.pid, lifecycle_state=status.state.value)
            if status.state is JobState.ERROR:
                return WaitOutcome("failed", error=status.error)
        code = exit_code(self.exit_file)
        if code is not None or not process_alive(self.launcher_pid):
            if code == ALREADY_RUNNING:
                return WaitOutcome("already_running", holder=holder)
            failed_epoch = (status.lease_epoch if status else None) or 0
            error = status.error if status and failed_epoch > self.previous_epoch else None
            return WaitOutcome("failed", exit_code=code, error=error or f"driver exited with code {code}")
        return None

    def event(self, checked: WaitOutcome) -> WaitOutcome:
        return dataclasses.replace(checked, launch_at=self.launch_at, version=self.version, carry=self.carry)


class LeaseTakenTrigger(WaitingTrigger):
    """Fires when a launched process holds its lease (``running``, with ``epoch`` and ``pid``), when its launch
    ended without it (``failed``, with ``exit_code``), or on timeout: the start of a process that publishes no
    lifecycle of its own before it holds the lease (the warm standby: it needs no Spark, seconds).

    ``application_id`` is the lease's name (for a standby, ``<application_id>.standby``)."""

    def __init__(
        self,
        application_id: str,
        status_dir: str,
        launcher_pid: int,
        exit_file: str,
        previous_epoch: int,
        timeout_s: float,
        poll_s: float = 0.5,
        carry: dict | None = None,
        fires_after: float = 0.0,
    ) -> None:
        super().__init__(fires_after)
        self.application_id, self.status_dir = application_id, status_dir
        self.launcher_pid, self.exit_file, self.previous_epoch = launcher_pid, exit_file, previous_epoch
        self.timeout_s, self.poll_s = timeout_s, poll_s
        #: echoed in the event (see StreamingJobStartedTrigger.carry)
        self.carry = carry

    def check(self) -> WaitOutcome | None:
        from streamstate.hooks.streaming_job import exit_code, process_alive

        holder = JobLease(self.status_dir, self.application_id).holder()
        if holder is not None and holder.epoch > self.previous_epoch:
            return WaitOutcome("running", epoch=holder.epoch, pid=holder.pid)
        code = exit_code(self.exit_file)
        if code is not None or not process_alive(self.launcher_pid):
            return WaitOutcome("failed", exit_code=code)
        return None

    def event(self, checked: WaitOutcome) -> WaitOutcome:
        return dataclasses.replace(checked, carry=self.carry)


class StreamingJobStoppedTrigger(WaitingTrigger):
    """Fires when no driver holds the job's lease any more and the signalled driver's process (``pid`` on
    ``host``, when this is that host) has exited (``stopped``), or on timeout."""

    def __init__(
        self,
        application_id: str,
        status_dir: str,
        timeout_s: float,
        poll_s: float = 0.5,
        fires_after: float = 0.0,
        pid: int | None = None,
        host: str | None = None,
    ) -> None:
        super().__init__(fires_after)
        self.application_id = application_id
        self.status_dir = status_dir
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.pid, self.host = pid, host

    def check(self) -> WaitOutcome | None:
        if JobLease(self.status_dir, self.application_id).holder() is not None:
            return None
        if self.pid is not None and self.host == socket.gethostname() and process_alive(self.pid):
            return None  # the lease let go, the interpreter still exiting
        status = read_status(self.status_dir, self.application_id)
        return WaitOutcome("stopped", final_state=status.state.value if status else None)


class StreamingJobCaughtUpTrigger(WaitingTrigger):
    """Fires when job ``job`` version ``version`` has consumed its inputs up to ``targets`` (topic -> partition
    -> offset; :func:`spark_jobs.state.source_position.committed_source_offsets`: for a version that re-keys
    its source, re-keyed and applied by its stateful stage) (``caught_up``), when its driver is gone
    (``stopped``), or on timeout."""

    def __init__(
        self,
        job: str,
        version: int,
        status_dir: str,
        targets: dict,
        timeout_s: float,
        poll_s: float = 0.5,
        fires_after: float = 0.0,
    ) -> None:
        super().__init__(fires_after)
        self.job, self.version, self.status_dir = job, int(version), status_dir
        self.targets = {topic: {str(p): int(o) for p, o in by_p.items()} for topic, by_p in targets.items()}
        self.timeout_s, self.poll_s = timeout_s, poll_s

    def check(self) -> WaitOutcome | None:
        from runtime.settings import Settings
        from spark_jobs.layout import JobLayout
        from spark_jobs.registry import get_job
        from spark_jobs.state.source_position import committed_source_offsets, source_behind

        # names and paths from the registry and this process's settings (the object store's credentials
        # too), never from the trigger's row
        settings = Settings.from_env()
        spec = get_job(self.job, self.version)
        committed = committed_source_offsets(JobLayout.of(spec, settings), settings.kafka)
        behind = _json_offsets(source_behind(committed, self.targets))
        committed = _json_offsets(committed or {})
        if not behind:
            return WaitOutcome("caught_up", committed=committed)
        if JobLease(self.status_dir, spec.application_id).holder() is None:
            status = read_status(self.status_dir, spec.application_id)
            error = status.error if status else None
            return WaitOutcome("stopped", committed=committed, behind=behind, error=error)
        return None


def _json_offsets(offsets: dict) -> dict:
    """topic -> partition -> number, with the partitions as strings (an event is JSON)."""
    return {topic: {str(p): n for p, n in by_p.items()} for topic, by_p in offsets.items()}


class StreamingJobExitedTrigger(WaitingTrigger):
    """Fires when the driver holding lease ``epoch`` no longer holds it and no newer driver does (``exited``: it
    stopped, or died and the kernel dropped its flock), or when ``timeout_s`` has passed (``timeout``). A newer
    driver holding the lease (the job's spare driver took over, spark_jobs/driver/spare.py) is watched in its place:
    there is nothing to restart, and the task is not resumed (its worker would compete with the new driver's
    first batch for the machine)."""

    def __init__(
        self,
        application_id: str,
        status_dir: str,
        epoch: int,
        timeout_s: float,
        poll_s: float = 0.5,
        carry: dict | None = None,
        fires_after: float = 0.0,
    ) -> None:
        super().__init__(fires_after)
        self.application_id, self.status_dir, self.epoch = application_id, status_dir, epoch
        self.timeout_s, self.poll_s = timeout_s, poll_s
        #: echoed in the event (see StreamingJobStartedTrigger.carry)
        self.carry = carry

    def check(self) -> WaitOutcome | None:
        holder = JobLease(self.status_dir, self.application_id).holder()
        if holder is not None and holder.epoch > self.epoch:
            self.log.info(
                "%s: lease epoch %s taken over by epoch %s (pid %s)",
                self.application_id,
                self.epoch,
                holder.epoch,
                holder.pid,
            )
            self.epoch = holder.epoch
        if holder is not None and holder.epoch == self.epoch:
            return None
        status = read_status(self.status_dir, self.application_id)
        return WaitOutcome(
            "exited",
            epoch=self.epoch,
            final_state=status.state.value if status else None,
            error=status.error if status else None,
        )

    def event(self, checked: WaitOutcome) -> WaitOutcome:
        return dataclasses.replace(checked, carry=self.carry)
