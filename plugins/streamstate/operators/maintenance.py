"""MaintainDeltaTablesOperator: compact and vacuum every Delta table of the platform (thin over
``spark_jobs.operations.maintenance``; delta-rs, no Spark session)."""

from __future__ import annotations

import dataclasses

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from runtime.settings import Settings

#: file names logged per table and action; the rest is counted
LOGGED_FILES = 20


class MaintainDeltaTablesOperator(BaseOperator):
    """Scheduled runs apply; a manual run follows its ``dry_run`` param (the form's default: true).
    ``compact_running`` (manual runs only) also compacts tables whose writer runs."""

    def execute(self, context):
        from spark_jobs.operations.maintenance import maintain, record_run, summarize

        params = context["params"]
        manual = context["dag_run"].run_type == "manual"
        dry_run = bool(params.get("dry_run", True)) if manual else False
        compact_running = bool(params.get("compact_running", False)) if manual else False
        settings = Settings.from_env()
        self.log.info("%s", "DRY RUN - nothing is compacted or deleted" if dry_run else "compacting and vacuuming")
        results = maintain(settings, dry_run=dry_run, compact_running=compact_running)
        for r in results:
            self._log_table(r, dry_run)
        run = summarize(results, dry_run=dry_run)
        record = record_run(settings, run)
        self.log.info(
            "%d tables: %d compacted (%d files rewritten), %d deferred; vacuum %s %d files, %d bytes; "
            "freed so far: %d files, %d bytes",
            run.tables,
            run.tables_compacted,
            run.files_compacted,
            run.tables_deferred,
            "would delete" if dry_run else "deleted",
            run.vacuumed.files,
            run.vacuumed.bytes,
            record.freed.files,
            record.freed.bytes,
        )
        if run.errors:
            raise AirflowFailException(f"maintenance failed on {len(run.errors)} tables: {run.errors}")
        return dataclasses.asdict(run)

    def _log_table(self, r, dry_run: bool) -> None:
        if r.error:
            self.log.error("%s (%s): FAILED: %s", r.path, r.kind, r.error)
            return
        compaction = (
            f"compact {len(r.small_files)} small files ({r.small_bytes} bytes)"
            if r.compact
            else f"not compacted ({r.compact_deferred})"
            if r.compact_deferred
            else "no compaction needed"
        )
        vacuum = (
            f"not vacuumed ({r.vacuum_skipped})"
            if r.vacuum_skipped
            else f"vacuum {'would delete' if dry_run else 'deleted'} {len(r.vacuum_files)} files, "
            f"{r.vacuum_bytes} bytes (retention {r.retention_hours} h)"
        )
        self.log.info(
            "%s (%s): %d files, %d small; %s; %s", r.path, r.kind, r.files, len(r.small_files), compaction, vacuum
        )
        if r.compact and r.small_files:
            self.log.info("  %s: %s", "would compact" if dry_run else "compacted", _names(r.small_files))
        if r.vacuum_files:
            self.log.info("  %s: %s", "would delete" if dry_run else "deleted", _names(r.vacuum_files))


def _names(files: list[str]) -> str:
    shown = ", ".join(files[:LOGGED_FILES])
    return shown if len(files) <= LOGGED_FILES else f"{shown} and {len(files) - LOGGED_FILES} more"
