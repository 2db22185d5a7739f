"""Reset in place: Kafka Streams' application reset tool for a job version, executed from a plan.

Runs while *holding the version's leases* (its driver's and its warm standby's): a driver or standby that
is still running makes it refuse before touching anything, and one started during the reset (a supervisor,
a person) exits at once with code 3.
Every step is idempotent (deleting what is gone is a no-op), so a failed reset can simply run again.
"""

from __future__ import annotations

import logging

from runtime.object_store import Location
from runtime.settings import Settings
from spark_jobs.driver.lease import JobAlreadyRunning, holding_version
from spark_jobs.io.kafka_topics import delete_topics, truncate_topic
from spark_jobs.layout import JobLayout
from spark_jobs.operations.reprocess.plan import ReprocessPlan, write_start_offsets

log = logging.getLogger("streamstate.reprocess")


class ResetRefused(RuntimeError):
    """Another instance holds the job's lease: nothing was touched."""


def reset_in_place(settings: Settings, plan: ReprocessPlan) -> dict:
    """Delete the version's checkpoint, changelog (and repartition) topics and snapshots, truncate its outputs when the
    plan says so, and leave the start position for the restart. Returns what was done.

    Raises:
        ResetRefused: the version's driver, its spare driver or its warm standby runs (nothing was touched).
    """
    spec = plan.spec()
    layout = JobLayout.of(spec, settings)
    try:
        with holding_version(layout):
            return _reset(settings, plan, layout)
    except JobAlreadyRunning as err:
        raise ResetRefused(
            f"{err.holder.application_id} is held by pid {err.holder.pid} on "
            f"{err.holder.host} (lease epoch {err.holder.epoch}); stop it first - "
            "nothing was touched"
        ) from None


def _reset(settings: Settings, plan: ReprocessPlan, layout: JobLayout) -> dict:
    bootstrap = settings.kafka
    done: dict = {"application_id": layout.application_id}
    # on the local disk or in an object store
    for place in (layout.checkpoint, *layout.quarantined_checkpoints(), *layout.snapshot_tables):
        if place.remove():
            done.setdefault("deleted_paths", []).append(str(place))
    # the repartition topic goes with the state it fed, and its progress with it: the re-keying stage
    # starts again at the start position, as the stateful stage does
    done["deleted_topics"] = delete_topics(bootstrap, [*layout.changelog_topics, *layout.repartition_topics])
    if plan.truncate_outputs:
        done["truncated_tables"] = {str(t): truncate_table(t) for t in layout.output_tables}
        done["dead_letters_deleted"] = truncate_topic(bootstrap, layout.dead_letter_topic)
        if layout.output_topic:  # the results jobs downstream read: recomputed from the start position
            done["output_topic_records_deleted"] = truncate_topic(bootstrap, layout.output_topic)
    done["start_offsets_file"] = str(write_start_offsets(layout, plan.start_offsets))
    log.info("reset %s: %s", layout.application_id, done)
    return done


def truncate_table(table: Location) -> int:
    """Delete every row of a Delta table (a new table version; older ones stay readable by time
    travel until vacuumed). Returns the rows deleted; 0 when the table does not exist."""
    from deltalake import DeltaTable

    options = table.storage_options()
    if not DeltaTable.is_deltatable(str(table), storage_options=options):
        return 0
    return int(DeltaTable(str(table), storage_options=options).delete().get("num_deleted_rows", 0))
