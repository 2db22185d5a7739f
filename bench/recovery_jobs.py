"""The three jobs of bench/recovery.py (``STREAMSTATE_JOB_MODULES=bench.recovery_jobs``): the reference
purchase counts, with a spare driver (the default), with the supervise DAG's watch only and with scheduled
checks only. ``BENCH_RECOVERY_CHECK_EVERY_S`` sets the DAGs' schedule (default 120 s, the platform's default)."""

from __future__ import annotations

import os

from spark_jobs.registry import JobSpec, StoreSpec, SupervisionPolicy

CHECK_EVERY_S = int(os.environ.get("BENCH_RECOVERY_CHECK_EVERY_S", "120"))


def _spec(name: str, watch: bool, spare: bool, what: str) -> JobSpec:
    return JobSpec(
        name=name,
        version=1,
        source_topic=f"bench-{name}",
        key_field="user_id",
        output_table=name,
        entrypoint="spark_jobs.reference.jobs.purchase_counts:build",
        stores=(StoreSpec("counts"),),
        trigger_interval="1 second",
        snapshot_every_batches=20,
        supervision=SupervisionPolicy(check_every_s=CHECK_EVERY_S, watch=watch, spare_driver=spare),
        description=f"recovery benchmark job ({what})",
    )


JOBS = (
    _spec("recovery_spare", True, True, "a spare driver takes over"),
    _spec("recovery_watched", True, False, "watched, no spare"),
    _spec("recovery_scheduled", False, False, "scheduled checks only, no spare"),
)
