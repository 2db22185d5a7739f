"""Policy for every DAG file, as tests: it imports cleanly, every DAG is tagged and sets retries.

Test ids are the DAG file paths, so a failure names the file to open.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.settings import PROJECT_ROOT

DAG_FILES = sorted((PROJECT_ROOT / "dags").glob("*.py"))


@pytest.fixture
def dagbag_for(monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    # DAG files read deployment settings at parse time; keep their side effects in a temp dir.
    monkeypatch.setenv("STREAMSTATE_DATA_DIR", str(tmp_path))

    def load(path: Path) -> DagBag:
        return DagBag(dag_folder=str(path))

    return load


def test_there_are_dag_files():
    assert DAG_FILES, "dags/ holds no DAG files"


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=[str(p.relative_to(PROJECT_ROOT)) for p in DAG_FILES])
def test_dag_file_imports_and_follows_policy(dagbag_for, dag_file):
    bag = dagbag_for(dag_file)
    assert bag.import_errors == {}, f"{dag_file.name} failed to import: {bag.import_errors}"
    assert bag.dags, f"{dag_file.name} defines no DAG"
    for dag_id, dag in bag.dags.items():
        assert dag.tags, f"DAG {dag_id} in {dag_file.name} has no tags"
        assert "retries" in dag.default_args, f"DAG {dag_id} in {dag_file.name} does not set retries"


def test_every_registered_job_has_a_drain_dag(dagbag_for):
    from spark_jobs.registry import latest_jobs

    bag = dagbag_for(PROJECT_ROOT / "dags")
    assert {f"drain__{name}" for name in latest_jobs()} <= set(bag.dag_ids)


def test_every_registered_job_is_supervised_and_controllable(dagbag_for):
    from spark_jobs.registry import latest_jobs

    bag = dagbag_for(PROJECT_ROOT / "dags")
    for name, spec in latest_jobs().items():
        dag = bag.dags[f"supervise__{name}"]
        assert dag.max_active_runs == 1
        assert [t.task_id for t in dag.topological_sort()] == ["check", "should_start", "launch"]
        launch = dag.task_dict["launch"]
        assert launch.job == name and launch._conn_id == "spark_default"
    for control in ("start_streaming_job", "stop_streaming_job"):
        assert bag.dags[control].params.get_param("job").schema["enum"] == sorted(latest_jobs())
