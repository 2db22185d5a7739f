"""The maintenance DAG, run as Airflow runs it (``airflow dags test``): a manual dry run changes
nothing, a run with dry_run off compacts an output table full of small files (data unchanged)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from runtime.settings import PROJECT_ROOT
from spark_jobs.io.table_maintenance import MIN_FILES_TO_COMPACT
from spark_jobs.layout import JobLayout
from spark_jobs.registry import get_job

pytestmark = pytest.mark.integration


def test_a_dry_run_changes_nothing_then_a_real_run_compacts(settings, dag_runner):
    table = JobLayout.of(get_job("vote_counts"), settings).output_tables[-1]
    for i in range(MIN_FILES_TO_COMPACT + 1):
        write_deltalake(str(table), pa.table({"candidate": [f"c{i}"], "votes": [i]}), mode="append")
    version, rows = DeltaTable(str(table)).version(), DeltaTable(str(table)).to_pyarrow_table().num_rows

    def run(dry_run: bool):
        result = dag_runner.dags_test(
            "maintain_delta_tables", {"dry_run": dry_run}, dag_file=PROJECT_ROOT / "dags" / "maintain_tables.py"
        )
        assert result.returncode == 0, f"DAG run failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
        return result.stdout + result.stderr

    log = run(dry_run=True)
    assert "DRY RUN" in log and f"{table} (output): {MIN_FILES_TO_COMPACT + 1} files" in log
    assert DeltaTable(str(table)).version() == version
    run(dry_run=False)
    after = DeltaTable(str(table))
    assert after.version() == version + 1 and len(after.file_uris()) == 1 and after.to_pyarrow_table().num_rows == rows
