"""Purging a retired version once its retention has passed: the end of a side-by-side reprocessing.

Promotion retires the old version and records until when its data stays (``retain_until``, the
``retain_days`` the engineer confirmed). After that, ``purge_retired_versions`` deletes everything the
version's application id owns - checkpoint, changelog and dead-letter topics, snapshots, output
tables - under the version's lease, and never the current version or one with a live driver.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil

from runtime.settings import Settings
from spark_jobs.kafka_topics import delete_topics, existing_topics
from spark_jobs.lease import JobAlreadyRunning, JobLease
from spark_jobs.registry import JobSpecError, get_job
from spark_jobs.reprocess.plan import Artifacts, dir_size, human_bytes
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


def owned_targets(settings: Settings, art: Artifacts) -> list[str]:
    paths = [p for p in (art.checkpoint, *art.quarantined_checkpoints, *art.snapshot_tables, *art.output_tables) if p.exists()]
    topics = existing_topics(settings.kafka, [*art.changelog_topics, art.dead_letter_topic])
    return [f"{p} ({human_bytes(dir_size(p))})" for p in paths] + [f"topic {t}" for t in sorted(topics)]


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
            candidates.append(PurgeCandidate(event.job, event.version, event.retain_until, [],
                                             "no longer registered: purge by hand"))  # fmt: skip
            continue
        blocked = None
        if event.retain_until > now:
            blocked = f"kept until {event.retain_until.isoformat(timespec='seconds')}"
        elif versions.current(event.job) == event.version:
            blocked = "it is the current version again"
        elif JobLease(settings.status_dir, spec.application_id).holder() is not None:
            blocked = "its driver is running"
        candidates.append(PurgeCandidate(event.job, event.version, event.retain_until,
                                         owned_targets(settings, Artifacts.of(spec, settings)), blocked))  # fmt: skip
    return candidates


def purge_version(settings: Settings, job: str, version: int, *, by: str, run_id: str | None = None) -> list[str]:
    """Delete everything ``job`` ``version`` owns, holding its lease; returns what was deleted."""
    spec = get_job(job, version)
    versions = JobVersions(settings)
    if versions.current(job) == version:
        raise ValueError(f"{spec.application_id} is the current version; it is never purged")
    lease = JobLease(settings.status_dir, spec.application_id)
    try:
        lease.acquire()
    except JobAlreadyRunning as err:
        raise RuntimeError(f"{spec.application_id} runs (pid {err.holder.get('pid')}); stop it before purging") from None
    try:
        art = Artifacts.of(spec, settings)
        deleted = []
        for path in (art.checkpoint, *art.quarantined_checkpoints, *art.snapshot_tables, *art.output_tables):
            if path.exists():
                shutil.rmtree(path)
                deleted.append(str(path))
        deleted += [f"topic {t}" for t in delete_topics(settings.kafka,
                                                          [*art.changelog_topics, art.dead_letter_topic])]  # fmt: skip
        for suffix in (".status.json", ".last-run.json", ".supervision.json"):
            (settings.status_dir / f"{spec.application_id}{suffix}").unlink(missing_ok=True)
        versions.mark_purged(job, version, by=by, run_id=run_id)
        return deleted
    finally:
        lease.release()
