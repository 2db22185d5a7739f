"""Purging a retired version once its retention has passed: the end of a side-by-side reprocessing.

Promotion retires the old version and records until when its data stays (``retain_until``, the
``retain_days`` the engineer confirmed). After that, ``purge_retired_versions`` deletes everything the
version's application id owns (its :class:`~spark_jobs.layout.JobLayout`: checkpoint, changelog and
dead-letter topics, snapshots, output tables, status files, logs, its standby's files) under the
version's leases, and never the current version or one whose driver or standby runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from runtime.object_store import Location
from runtime.settings import Settings
from spark_jobs.driver.lease import JobAlreadyRunning, JobLease, holding_version
from spark_jobs.io.kafka_topics import delete_topics, existing_topics
from spark_jobs.layout import JobLayout
from spark_jobs.operations.reprocess.plan import human_bytes
from spark_jobs.registry import JobSpecError, get_job
from spark_jobs.versions import JobVersions


@dataclasses.dataclass
class PurgeCandidate:
    job: str
    version: int
    retain_until: dt.datetime
    #: what would be deleted (paths and topics that exist now)
    targets: list[str]
    #: why it is not purged now (None: due)
    blocked: str | None = None

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "retain_until": self.retain_until.isoformat()}


def owned_targets(settings: Settings, layout: JobLayout) -> list[str]:
    """What of the version exists now, with sizes: everything purging would delete."""
    places = [Location.of(a.location, settings.object_store) for a in layout.artifacts() if a.system != "kafka"]
    topics = existing_topics(settings.kafka, list(layout.topics))
    return [f"{p} ({human_bytes(p.size_bytes())})" for p in places if p.exists()] + [
        f"topic {t}" for t in sorted(topics)
    ]


def purge_candidates(settings: Settings, now: dt.datetime | None = None) -> list[PurgeCandidate]:
    """Every retired, not yet purged version, with what it owns and whether it is due."""
    now = now or dt.datetime.now(dt.timezone.utc)
    versions = JobVersions(settings)
    candidates = []
    for event in versions.retired():
        try:
            spec = get_job(event.job, event.version)
        except JobSpecError:
            # unregistered code: its artifacts are still named by the application id convention
            candidates.append(
                PurgeCandidate(event.job, event.version, event.retain_until, [], "no longer registered: purge by hand")
            )
            continue
        layout = JobLayout.of(spec, settings)
        blocked = None
        if event.retain_until > now:
            blocked = f"kept until {event.retain_until.isoformat(timespec='seconds')}"
        elif versions.current(event.job) == event.version:
            blocked = "it is the current version again"
        elif JobLease(settings.status_dir, layout.driver.name).holder() is not None:
            blocked = "its driver is running"
        elif JobLease(settings.status_dir, layout.standby.name).holder() is not None:
            blocked = "its warm standby is running"
        elif JobLease(settings.status_dir, layout.spare.name).holder() is not None:
            blocked = "its spare driver is running"
        candidates.append(
            PurgeCandidate(event.job, event.version, event.retain_until, owned_targets(settings, layout), blocked)
        )
    return candidates


def purge_version(settings: Settings, job: str, version: int, *, by: str, run_id: str | None = None) -> list[str]:
    """Delete everything ``job`` ``version`` owns, holding its lease; returns what was deleted."""
    spec = get_job(job, version)
    versions = JobVersions(settings)
    if versions.current(job) == version:
        raise ValueError(f"{spec.application_id} is the current version; it is never purged")
    layout = JobLayout.of(spec, settings)
    try:
        with holding_version(layout):
            deleted = _delete_everything(settings, layout)
            versions.mark_purged(job, version, by=by, run_id=run_id)
    except JobAlreadyRunning as err:
        raise RuntimeError(f"{err.holder.application_id} runs (pid {err.holder.pid}); stop it before purging") from None
    # The lease files go last, once released: while held they kept the version from starting.
    for status_files in (layout.driver, layout.spare, layout.standby):
        status_files.lease.unlink(missing_ok=True)
    return deleted


def _delete_everything(settings: Settings, layout: JobLayout) -> list[str]:
    """Every artifact of the version's layout except its lease files; returns what was deleted."""
    leases = {str(files.lease) for files in (layout.driver, layout.spare, layout.standby)}
    deleted = []
    for artifact in layout.artifacts():
        if artifact.system == "kafka" or artifact.location in leases:
            continue
        place = Location.of(artifact.location, settings.object_store)  # local files, or tables in an object store
        if place.remove():
            deleted.append(str(place))
    deleted += [f"topic {t}" for t in delete_topics(settings.kafka, list(layout.topics))]
    return deleted
