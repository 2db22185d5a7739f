"""What a job's ``build`` function gets: the session, its spec, the deployment and its artifacts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from runtime.settings import Settings
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.registry import JobSpec, store
from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter
from spark_jobs.state.restore import RestoredState
from spark_jobs.state.snapshots import SnapshotStore, snapshot_path


@dataclasses.dataclass(frozen=True)
class JobContext:
    spark: object  # pyspark.sql.SparkSession (not imported here: DAG files import this module)
    spec: JobSpec
    settings: Settings
    #: store -> state rebuilt from snapshot + changelog when the query starts without a checkpoint
    restored: dict[str, RestoredState] = dataclasses.field(default_factory=dict)
    #: further streaming writers the job needs started with it (e.g. its dead-letter query)
    companion_writers: list = dataclasses.field(default_factory=list)

    @property
    def starting_offsets(self) -> str:
        """Kafka ``startingOffsets`` for a new query: right after the restored state, else earliest."""
        positions = {json.dumps(r.input_offsets, sort_keys=True) for r in self.restored.values() if r.input_offsets}
        if not positions:
            return "earliest"
        if len(positions) > 1:
            raise RuntimeError(f"{self.spec.application_id}: stores restored to different input positions {positions}")
        offsets = json.loads(positions.pop())
        return json.dumps({self.spec.source_topic: offsets.get(self.spec.source_topic, {})})

    def base_table(self, store_name: str) -> str:
        """Delta table holding a store's restored state for the current checkpoint. It lives inside
        the checkpoint directory, so losing the checkpoint can never leave a stale base behind."""
        return str(self.checkpoint / "streamstate" / "base" / store_name)

    def split_dead_letters(self, classified):
        """Valid records of ``classified`` (see spark_jobs.dead_letter.classify); the rest are sent to
        the job's dead-letter topic by a companion query started with the job."""
        from spark_jobs import dead_letter

        ensure_topic(self.settings.kafka_bootstrap_servers, dead_letter.dead_letter_topic(self.spec.application_id),
                     self.spec.source_partitions, self.settings.kafka_replication_factor)  # fmt: skip
        self.companion_writers.append(dead_letter.dead_letter_writer(
            classified, self.spec.application_id, self.settings.kafka_bootstrap_servers,
            str(self.checkpoint / "streamstate" / "dead-letter"),
        ))  # fmt: skip
        return dead_letter.valid(classified)

    def snapshot_if_due(self, store_name: str, changelog_batch_id: int):
        """Take a snapshot of ``store_name`` when the job's cadence says so; returns it, or None.

        Called after the batch's changelog write, so the snapshot includes that batch.
        """
        every = self.spec.snapshot_every_batches
        if every <= 0 or changelog_batch_id % every:
            return None
        from spark_jobs.state.restore import take_snapshot

        return take_snapshot(self.snapshot_store(store_name), self.settings.kafka_bootstrap_servers,
                             self.changelog_topic(store_name).name)  # fmt: skip

    def snapshot_store(self, store_name: str) -> SnapshotStore:
        s = store(self.spec, store_name)
        return SnapshotStore(self.spark, snapshot_path(self.settings.lake_dir, self.spec.application_id, s.name),
                             self.spec.application_id, s.name)  # fmt: skip

    @property
    def checkpoint(self) -> Path:
        """The query checkpoint of this job version (one per application id)."""
        return self.settings.checkpoint_dir / self.spec.application_id

    @property
    def output_path(self) -> str:
        return str(self.settings.lake_dir / self.spec.output_table)

    def changelog_topic(self, store_name: str) -> ChangelogTopic:
        s = store(self.spec, store_name)
        return ChangelogTopic(
            application_id=self.spec.application_id,
            store=s.name,
            partitions=self.spec.source_partitions,
            replication_factor=self.settings.kafka_replication_factor,
            kind=s.kind,
            retention_ms=s.retention_ms,
            overrides=s.changelog_configs,
        )

    @property
    def restore_record(self) -> Path:
        """``restore.json`` in the checkpoint: how this checkpoint's state was restored, if it was."""
        return self.checkpoint / "streamstate" / "restore.json"

    def changelog_writer(self, store_name: str) -> ChangelogWriter:
        """The store's changelog writer, continuing the changelog's batch ids after a restore."""
        restored = {}
        if self.restore_record.exists():
            restored = json.loads(self.restore_record.read_text()).get(store_name, {})
        return ChangelogWriter(
            self.changelog_topic(store_name), self.settings.kafka_bootstrap_servers,
            batch_base=restored.get("next_batch_id", 0), restored_batch=restored.get("batch_id"),
        )  # fmt: skip

    def ensure_changelog_topics(self) -> list[str]:
        """Create every store's changelog topic (idempotent); returns the topic names."""
        names = []
        for s in self.spec.stores:
            topic = self.changelog_topic(s.name)
            topic.ensure(self.settings.kafka_bootstrap_servers)
            names.append(topic.name)
        return names
