"""The platform's job of bench/latency.py (``STREAMSTATE_JOB_MODULES=bench.latency_jobs``): purchase_counts
with an upsert output topic (``JobSpec.output_topic``), so that both its sinks are measured, at the trigger
interval of the measurement. Each measurement is a job of its own, ``latency_<run>``
(``BENCH_LATENCY_RUN``, trigger ``BENCH_LATENCY_TRIGGER_S`` seconds): its topics, changelog and checkpoint are
new, so no state carries over from the previous measurement on the same broker."""

from __future__ import annotations

import os

from spark_jobs.registry import JobSpec, StoreSpec


def spec(run: str, trigger_s: float) -> JobSpec:
    name = f"latency_{run}"
    return JobSpec(
        name=name,
        version=1,
        source_topic=f"bench-{name}",
        key_field="user_id",
        output_table=name,
        entrypoint="spark_jobs.reference.jobs.purchase_counts:build",
        stores=(StoreSpec("counts"),),
        trigger_interval=f"{trigger_s:g} seconds",
        output_topic=f"bench-{name}-out",
        description=f"latency benchmark job (purchase_counts, trigger {trigger_s:g} s, output topic)",
    )


JOBS = (
    (spec(os.environ["BENCH_LATENCY_RUN"], float(os.environ.get("BENCH_LATENCY_TRIGGER_S", "1"))),)
    if os.environ.get("BENCH_LATENCY_RUN")
    else ()
)
