"""Jobs that read a job's outputs, and what reprocessing that job means for them: the chain, from the
registries alone (no I/O).

Two kinds of readers:

* a **batch job** (:mod:`spark_jobs.batch`) names the job in its ``inputs``: it reads the serving
  version's Delta output, so after a promotion its next runs read the new version, and the intervals it
  already wrote keep the old version's answers until they are backfilled; a reset rewrites the table it
  reads, so the intervals the reset recomputes need a backfill once the job has caught up;
* a **streaming job** whose ``source_topic`` is one of the job's upsert topics (``<output_topic>-v<N>``,
  :attr:`spark_jobs.layout.JobLayout.output_topic`): a new version writes a new topic, which the reader
  does not read until a version of the reader names it (and is reprocessed from it); a reset with
  ``truncate_outputs`` empties the topic the reader reads, and the job writes it again from its start
  position.

:func:`readers_of` finds them; :func:`chain_notes` says, for a plan, what happens to each.
"""

from __future__ import annotations

import dataclasses

from spark_jobs.layout import batch_dag_id, output_topic_name, output_topic_version
from spark_jobs.registry import JobSpec, latest_jobs


@dataclasses.dataclass(frozen=True)
class Readers:
    """The jobs reading ``job``'s outputs."""

    job: str
    #: batch jobs whose inputs name the job
    batch_jobs: tuple[str, ...] = ()
    #: (streaming job, the upsert topic it reads)
    streaming_jobs: tuple[tuple[str, str], ...] = ()


def readers_of(spec: JobSpec) -> Readers:
    """Who reads ``spec``'s job's outputs (any version's upsert topic)."""
    from spark_jobs.batch.spec import batch_jobs

    batch = tuple(name for name, job in batch_jobs().items() if spec.name in job.inputs)
    streaming = ()
    if spec.output_topic:
        streaming = tuple(
            (reader.name, reader.source_topic)
            for reader in latest_jobs().values()
            if output_topic_version(spec.output_topic, reader.source_topic) is not None
        )
    return Readers(spec.name, batch, streaming)


def chain_notes(readers: Readers, mode: str, current: JobSpec, target: JobSpec, truncate_outputs: bool) -> list[str]:
    """What the plan of a ``mode`` run (``side_by_side``, ``migrate`` or ``reset``) from ``current`` to
    ``target`` means for each reader: one note each, with the step the operator takes."""
    notes = []
    beside = mode != "reset"
    for name in readers.batch_jobs:
        if beside:
            notes.append(
                f"batch job {name} reads {readers.job}'s serving version: once v{target.version} is promoted its "
                f"next runs read it; intervals already written keep v{current.version}'s answers until you "
                f"backfill them (airflow backfill create --dag-id {batch_dag_id(name)} --from-date ... --to-date ...)"
            )
        else:
            notes.append(
                f"batch job {name} reads {readers.job}'s outputs, which the reset rewrites: once "
                f"{readers.job} has caught up, backfill the intervals it recomputed (airflow backfill create "
                f"--dag-id {batch_dag_id(name)} --from-date ... --to-date ...)"
            )
    for name, topic in readers.streaming_jobs:
        if beside:
            notes.append(
                f"streaming job {name} reads {topic}; v{target.version} writes "
                f"{output_topic_name(target.output_topic, target.version)}, which {name} does not read until one of its versions "
                f"names it as source_topic: register that version and reprocess {name} side by side from it "
                "(plan it with dry_run first)"
            )
        elif truncate_outputs and topic == output_topic_name(current.output_topic, current.version):
            notes.append(
                f"streaming job {name} reads {topic}, which the reset empties and rewrites from the start "
                f"position: {name} sees the rewritten records as new upserts (reset {name} as well to "
                "recompute it from scratch)"
            )
    return notes
