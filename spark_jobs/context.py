"""What a job's ``build`` function gets: the session, its spec, the deployment and its artifacts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from runtime.settings import Settings
from spark_jobs.registry import JobSpec, store
from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter


@dataclasses.dataclass(frozen=True)
class JobContext:
    spark: object  # pyspark.sql.SparkSession (not imported here: DAG files import this module)
    spec: JobSpec
    settings: Settings

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

    def changelog_writer(self, store_name: str) -> ChangelogWriter:
        return ChangelogWriter(self.changelog_topic(store_name), self.settings.kafka_bootstrap_servers)

    def ensure_changelog_topics(self) -> list[str]:
        """Create every store's changelog topic (idempotent); returns the topic names."""
        names = []
        for s in self.spec.stores:
            topic = self.changelog_topic(s.name)
            topic.ensure(self.settings.kafka_bootstrap_servers)
            names.append(topic.name)
        return names
