"""MaintainDeltaTablesOperator: compact and vacuum every Delta table of the platform (thin over
``spark_jobs.maintenance``; delta-rs, no Spark session)."""

from __future__ import annotations

from airflow.sdk import BaseOperator

from runtime.settings import Settings


class MaintainDeltaTablesOperator(BaseOperator):
    """Scheduled runs apply; a manual run follows its ``dry_run`` param (the form's default: true)."""

    def execute(self, context):
        from spark_jobs.maintenance import maintain

        manual = context["dag_run"].run_type == "manual"
        dry_run = bool(context["params"].get("dry_run", True)) if manual else False
        self.log.info("%s", "DRY RUN - nothing is compacted or deleted" if dry_run else "compacting and vacuuming")
        results = maintain(Settings.from_env(), dry_run=dry_run)
        for r in results:
            self.log.info("%s (%s): %d files, %d small%s; vacuum %s %d files, %d bytes (retention %d h)", r.path,
                          r.kind, r.files, r.small_files, ", compact" if r.compact else "",
                          "would delete" if dry_run else "deleted", r.vacuum_files, r.vacuum_bytes, r.retention_hours)  # fmt: skip
        return {"dry_run": dry_run, "tables": len(results),
                "compacted": sum(1 for r in results if r.compact),
                "vacuum_files": sum(r.vacuum_files for r in results),
                "vacuum_bytes": sum(r.vacuum_bytes for r in results),
                "per_table": [r.to_dict() for r in results]}  # fmt: skip
