"""Where a driver's time goes, per phase of its micro-batches (state, dead letters, outputs, changelog, snapshot):
summed over the run for its report, and per micro-batch for the progress it publishes."""

from __future__ import annotations

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
