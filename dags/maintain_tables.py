"""Delta table maintenance: compact small files and vacuum what is past the time-travel window.

``maintain_delta_tables`` (daily): every registered, not purged, version's snapshot and output tables
and the platform's own tables (``_streamstate``). Compaction rewrites small files (the per-batch MERGEs
of outputs, the standby's snapshot MERGEs) without changing data or history; vacuum deletes files no
version of the last 7 days (``TIME_TRAVEL_DAYS``, or the table's own longer declared retention)
references, so the time travel the documentation promises always holds.

**Scheduled runs apply** (compaction and vacuum, always within that retention). A table whose writer
runs (the job version's driver, or for a snapshot table its standby) is vacuumed but not compacted:
a compaction committing during a MERGE fails that writer's commit. A **manual run is a dry run**
unless ``dry_run`` is switched off, and logs per table the files it would compact and the files and
bytes a vacuum would delete; ``compact_running`` (manual runs) compacts running writers' tables too.

Each run's summary and the totals freed so far: ``<status>/state_audit/table_maintenance.json``
(shown in the state-size report). Logic: spark_jobs/operations/maintenance.py.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Param, dag
from streamstate.operators.maintenance import MaintainDeltaTablesOperator


@dag(
    dag_id="maintain_delta_tables",
    schedule="@daily",
    # the platform's own housekeeping: scheduled from its first parse, nobody has to unpause it
    is_paused_upon_creation=False,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,
    tags=["streamstate", "delta"],
    default_args={"retries": 0},  # the next day's run is the retry
    params={
        "dry_run": Param(
            True,
            type="boolean",
            title="Dry run (manual runs)",
            description="Log what would be compacted and vacuumed; change nothing. Scheduled runs always apply.",
        ),
        "compact_running": Param(
            False,
            type="boolean",
            title="Compact tables whose writer runs (manual runs)",
            description="Also compact tables a running driver or standby writes: its next commit may fail and "
            "restart it. Scheduled runs never do.",
        ),
    },
    doc_md=__doc__,
)
def maintain_delta_tables() -> None:
    MaintainDeltaTablesOperator(task_id="maintain")


maintain_delta_tables()
