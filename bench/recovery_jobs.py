"""The two jobs of bench/recovery.py (``STREAMSTATE_JOB_MODULES=bench.recovery_jobs``): the reference
purchase counts, once with the supervise DAG's watch (the default) and once with scheduled checks only.
``BENCH_RECOVERY_CHECK_EVERY_S`` sets both DAGs' schedule (default 120 s, the platform's default)."""

from __future__ import annotations

import os

from spark_jobs.registry import JobSpec, StoreSpec, SupervisionPolicy

CHECK_EVERY_S = int(os.environ.get("BENCH_RECOVERY_CHECK_EVERY_S", "120"))


def _spec(name: str, watch: bool) -> JobSpec:
    return JobSpec(
        name=name,
        version=1,
        source_topic=f"bench-{name}",
        key_field="user_id",
        output_table=name,
        entrypoint="spark_jobs.jobs.purchase_counts:build",
        stores=(StoreSpec("counts"),),
        trigger_interval="1 second",
        snapshot_every_batches=20,
        supervision=SupervisionPolicy(check_every_s=CHECK_EVERY_S, watch=watch),
        description=f"recovery benchmark job ({'watched' if watch else 'scheduled checks only'})",
    )


JOBS = (_spec("recovery_watched", True), _spec("recovery_scheduled", False))
