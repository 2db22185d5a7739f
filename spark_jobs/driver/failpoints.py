"""Named places in a driver where a fault test can stop it: the "failpoint" pattern (FoundationDB's
and TiKV's ``fail`` crate), so a test kills a driver at a *phase of the job*, not after a wall-clock
delay that a slow machine shifts into another phase.

Off unless ``STREAMSTATE_FAILPOINTS`` is set in the driver's environment, e.g.::

    STREAMSTATE_FAILPOINTS=between_outputs_and_markers:2,restoring

``name`` stops the driver the first time it reaches that place; ``name:N`` the N-th time (1-based,
counted in this process); a name may be armed for several times (``before_outputs:1:pause,before_outputs:3:pause``).
Stopping means: write ``<status_dir>/<application_id>.failpoint.json`` (which point, which time, the pid) and
block that thread forever. The test waits for the file and then kills the driver (kill -9), so the kill is real
and lands exactly there.

``name:N:pause`` pauses instead: after writing the file the driver sends SIGSTOP to its own process
group (the driver's JVM with it, when it was started in a session of its own) and goes on where it
was once the test sends SIGCONT: a driver frozen by a long GC or a partition, that wakes up later.

``name:N:hold:S`` holds only that thread for S seconds, then goes on: the rest of the driver (its status, its
``/metrics``) carries on, as when a restore or a batch is slow rather than the process stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Literal

from spark_jobs.layout import StatusFiles

ENV = "STREAMSTATE_FAILPOINTS"

Failpoint = Literal[
    # a store is being rebuilt from its snapshot + changelog (status RESTORING), nothing read yet
    "restoring",
    # a micro-batch's state changes are computed; nothing of the batch is written yet
    "before_outputs",
    # the batch's outputs are written (their Delta commit done); its changelog and markers are not
    "between_outputs_and_markers",
    # the batch's changelog, markers and output records are committed; its outputs are not written (a job
    # whose outputs are its store's view and that has an output topic: JobContext.state_change_sink)
    "between_markers_and_outputs",
    # the batch's changelog and markers are written; a due snapshot is not taken yet
    "before_snapshot",
    # a re-keying batch is read and its dead letters written; its transaction is not begun
    "before_repartition_write",
    # a re-keying batch's transaction is committed; Spark's commit log is not written
    "after_repartition_write",
]
FAILPOINTS: tuple[str, ...] = Failpoint.__args__

_reached: Counter = Counter()
_lock = threading.Lock()


Action = Literal["stop", "pause", "hold"]


@dataclasses.dataclass(frozen=True)
class Armed:
    """What a failpoint does the time it is armed for (``hold_s``: how long a ``hold`` holds)."""

    action: Action = "stop"
    hold_s: float = 0.0


def armed() -> dict[str, dict[int, Armed]]:
    """The failpoints set in the environment: name -> {the time it acts (1-based): what it does}."""
    armed_points: dict[str, dict[int, Armed]] = {}
    for entry in filter(None, (e.strip() for e in os.environ.get(ENV, "").split(","))):
        name, _, rest = entry.partition(":")
        nth, _, rest = rest.partition(":")
        action, _, seconds = rest.partition(":")
        if name not in FAILPOINTS:
            raise ValueError(f"{ENV}: unknown failpoint {name!r} (known: {', '.join(FAILPOINTS)})")
        if action not in ("", *Action.__args__):
            raise ValueError(f"{ENV}: unknown action {action!r} of failpoint {name!r} (known: stop, pause, hold)")
        if (action == "hold") != bool(seconds):
            raise ValueError(f"{ENV}: {entry!r}: hold takes its seconds (hold:S), and only hold does")
        armed_points.setdefault(name, {})[int(nth or 1)] = Armed(action or "stop", float(seconds or 0))
    return armed_points


def marker_path(status_dir: Path, application_id: str) -> Path:
    return StatusFiles(status_dir, application_id).failpoint


def reached(name: Failpoint, status_dir: Path, application_id: str) -> None:
    """Called by the driver at ``name``: returns at once unless a test armed this point for this time."""
    if not os.environ.get(ENV):
        return
    times = armed().get(name)
    if not times:
        return
    with _lock:
        _reached[name] += 1
        count = _reached[name]
    if (act := times.get(count)) is None:
        return
    path = marker_path(status_dir, application_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"failpoint": name, "time": count, "pid": os.getpid(), "action": act.action}))
    if act.action == "pause":
        os.killpg(os.getpgrp(), signal.SIGSTOP)  # returns once the test sends SIGCONT
        return
    if act.action == "hold":
        time.sleep(act.hold_s)
        return
    while True:  # held here until the test kills the driver
        time.sleep(3600)


def read_marker(status_dir: Path, application_id: str) -> dict | None:
    """What a stopped driver wrote at its failpoint, or None when it has not stopped at one."""
    path = marker_path(status_dir, application_id)
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
