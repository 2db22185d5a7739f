"""Is a query checkpoint usable? Checked before a job starts, so a damaged one leads to a restore.

Spark resumes a query from ``metadata`` (the query id), the offset and commit logs, and the state
store files of the last committed batch. A checkpoint with a torn or garbled log file, or with logs
but no state, cannot resume: Spark would fail at start (or, worse, start a stateful query on empty
state). :func:`checkpoint_problem` names the first such problem; :func:`quarantine` moves the
checkpoint aside (never deletes it: someone may want to look) so the job restores from snapshot +
changelog instead.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from runtime.object_store import Location
from spark_jobs import layout


def _log_entries(directory: Location) -> dict[int, Location]:
    return {int(c.name): c for c in directory.children() if c.name.isdigit()}


def _check_log_file(path: Location, min_lines: int) -> str | None:
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        return f"{path} unreadable: {err}"
    if len(lines) < min_lines or not lines[0].startswith("v"):
        return f"{path} is not a Spark log entry ({len(lines)} lines)"
    for line in lines[1:]:
        if line.strip() and line.strip() != "-":
            try:
                json.loads(line)
            except ValueError:
                return f"{path} holds a line that is not JSON"
    return None


#: written by the job when it starts from a restored state (``JobLayout.restore_record``)
RESTORE_RECORD = layout.RESTORE_RECORD

#: what Spark requires empty or absent when it starts a query whose offset log has no entry
#: (``MicroBatchExecution.verifyNewCheckpointDirectory``: STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY)
NEW_QUERY_DIRS = ("offsets", "state", "commits")


def checkpoint_problem(checkpoint: Location | Path | str, stateful: bool = True) -> str | None:
    """Why ``checkpoint`` cannot be resumed from, or None when it can (or has nothing to resume)."""
    checkpoint = Location.of(checkpoint)
    offsets, commits = _log_entries(checkpoint / "offsets"), _log_entries(checkpoint / "commits")
    if not offsets:
        # nothing to resume: a fresh start, unless a start was killed while writing its first log entry
        # (a temporary file left in offsets/): Spark refuses to start a new query over any file there
        leftovers = [d for d in NEW_QUERY_DIRS if (checkpoint / d).children()]
        if leftovers:
            return (
                f"{checkpoint} has no offset log entry but files in {', '.join(leftovers)} (a start killed mid-write)"
            )
        return None
    metadata = checkpoint / "metadata"
    try:
        if "id" not in json.loads(metadata.read_text().splitlines()[0]):
            return f"{metadata} has no query id"
    except (OSError, IndexError, ValueError) as err:
        return f"{metadata} unreadable: {err}"
    latest = max(offsets)
    for batch in (latest, latest - 1):
        if batch in offsets and (problem := _check_log_file(offsets[batch], 3)):
            return problem
    if not commits and (checkpoint / RESTORE_RECORD).exists():
        # Started from a restored state, died before its first batch committed: Spark would re-plan that
        # batch without the restored state (``initialState`` is only passed when restoring) and lose it.
        return f"{checkpoint} began from a restore whose first batch never committed; restore again"
    if commits:
        last_commit = max(commits)
        if problem := _check_log_file(commits[last_commit], 2):
            return problem
        if last_commit not in offsets:
            return f"commit {last_commit} has no offset log entry"
        if stateful and not any(name.count("/") >= 2 for name, _ in (checkpoint / "state").files()):
            return f"{checkpoint} has committed batches but no state store files"
    return None


def quarantine(checkpoint: Location | Path | str, entries: tuple[str, ...] | None = None) -> Location:
    """Move ``checkpoint`` (or only its ``entries``) to ``<checkpoint>.corrupt-<UTC time>``; returns the new
    location."""
    checkpoint = Location.of(checkpoint)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = checkpoint.parent / f"{checkpoint.name}{layout.QUARANTINE_SUFFIX}{stamp}"
    if entries is None:
        checkpoint.move_to(target)
    for name in entries or ():
        if (checkpoint / name).exists():
            (checkpoint / name).move_to(target / name)
    return target


def new_query_leftovers(checkpoint: Location | Path | str) -> list[str]:
    """What Spark would refuse to start a new query over (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``):
    anything, an empty directory or an object store's directory marker included, in the offset, state or
    commit directories of a checkpoint whose offset log has no entry. Empty when the query can start."""
    checkpoint = Location.of(checkpoint)
    if _log_entries(checkpoint / "offsets"):
        return []
    return [f"{name}/{child.name}" for name in NEW_QUERY_DIRS for child in (checkpoint / name).children()]
