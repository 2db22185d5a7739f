"""The platform's housekeeping DAGs run on their schedules from the start: after the DAG files are parsed
into a fresh Airflow, the scheduler's own query of the DAGs due a scheduled run (``DagModel.
dags_needing_dagruns``, what each scheduler loop asks) names the state-size audit, the changelog tuning,
the table maintenance, the purge of retired versions and the batch jobs; nobody has to unpause them. A job's supervision
and the manual DAGs stay as they were (a supervise DAG is unpaused by starting its job)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runtime.airflow_standalone import LocalAirflow
from runtime.process import free_service_ports
from runtime.settings import Settings

pytestmark = pytest.mark.integration

SCHEDULED = {
    "audit_state_size",
    "tune_changelog_compaction",
    "maintain_delta_tables",
    "purge_retired_versions",
    "batch__daily_top_movers",
}

DUE = """
import json
from airflow.models.dag import DagModel
from airflow.utils.session import create_session

with create_session() as session:
    due = DagModel.dags_needing_dagruns(session)
    due = due[0] if isinstance(due, tuple) else due  # (dags, dataset-triggered info) in Airflow 3
    paused = {d.dag_id: d.is_paused for d in session.query(DagModel)}
    print(json.dumps({"due": sorted(d.dag_id for d in due), "paused": paused}))
"""


def test_the_housekeeping_schedules_are_due_in_a_fresh_airflow(tmp_path):
    local = LocalAirflow(Settings(data_dir=tmp_path, **free_service_ports()))
    local.prepare()
    local.reserialize_dags()
    answer = subprocess.run(
        [sys.executable, "-c", DUE], env=local.environment(), capture_output=True, text=True, check=True
    )
    found = json.loads(answer.stdout.strip().splitlines()[-1])
    assert set(found["due"]) == SCHEDULED, found
    assert found["paused"]["supervise__patient_heart_rate"] is True  # jobs start when someone starts them
    assert found["paused"]["reprocess_job"] is True
