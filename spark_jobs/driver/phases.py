"""Where a driver's time goes, per phase of its micro-batches (state, dead letters, outputs, changelog, snapshot):
summed over the run for its report, and per micro-batch for the progress it publishes."""

from __future__ import annotations

import dataclasses
import time


class PhaseClock:
    """Adds the seconds since the previous lap to ``totals[phase]`` (and, in milliseconds, to ``batch[phase]``)."""

    def __init__(self, totals: dict, batch: dict | None = None) -> None:
        self.totals, self.batch, self.last = totals, batch, time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.totals[phase] = round(self.totals.get(phase, 0.0) + now - self.last, 3)
        if self.batch is not None:
            self.batch[phase] = self.batch.get(phase, 0) + round((now - self.last) * 1000)
        self.last = now


@dataclasses.dataclass
class BatchPhases:
    """A driver's phase times: summed over the run (its report), and per micro-batch until the batch's progress is
    published (a listener's thread pops them)."""

    #: seconds per phase of the state-change batches (state, dead letters, outputs, changelog, snapshot), summed
    #: over the run: the run report's answer to "where does a batch's time go"
    seconds: dict = dataclasses.field(default_factory=dict)
    #: micro-batch id -> its own milliseconds per phase, until its progress is published (:meth:`pop`)
    by_batch: dict = dataclasses.field(default_factory=dict)

    def clock(self, batch_id: int | None = None) -> PhaseClock:
        """A clock of the run's phases, and of batch ``batch_id``'s (new: a replayed batch's count again); the
        oldest batches' go when their progress was never asked for (a query stopped before Spark reported it)."""
        if batch_id is None:
            return PhaseClock(self.seconds)
        for old in list(self.by_batch):  # a copy: the progress listener's thread pops from it
            if old < batch_id - 10:
                self.by_batch.pop(old, None)
        self.by_batch[batch_id] = {}
        return PhaseClock(self.seconds, self.by_batch[batch_id])

    def pop(self, batch_id: int | None) -> dict[str, int]:
        """The milliseconds per phase the batch sink spent on micro-batch ``batch_id`` (empty: it did not run
        it), forgotten once asked for (the progress listener publishes them with the batch's progress)."""
        return self.by_batch.pop(batch_id, {})
