"""Policy for every DAG file, as tests: it imports cleanly, every DAG is tagged and sets retries.

Test ids are the DAG file paths, so a failure names the file to open.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.settings import PROJECT_ROOT
from spark_jobs.registry import get_job
from spark_jobs.state.changelog import changelog_topic_name

PURCHASE_CHANGELOG = changelog_topic_name(get_job("purchase_counts").application_id, "counts")

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
        tasks = {t.task_id for t in dag.topological_sort()}
        assert tasks == {"check", "should_start", "launch", "watch", "spare"} | ({"standby"} if spec.stores else set())
        assert dag.task_dict["launch"].upstream_task_ids == {"should_start"}
        # the watch runs after a launch, or when none was needed (skipped); not after a failed one
        watch = dag.task_dict["watch"]
        assert watch.upstream_task_ids == {"launch"} and watch.trigger_rule == "none_failed"
        assert dag.task_dict["should_start"].ignore_downstream_trigger_rules is False
        assert not dag.task_dict["standby"].upstream_task_ids  # the standby is kept whatever the job's check says
        assert not dag.task_dict["spare"].upstream_task_ids  # the spare too
        launch = dag.task_dict["launch"]
        assert launch.job == name and launch.conn_id == "spark_default"
    for control in ("start_streaming_job", "stop_streaming_job"):
        assert bag.dags[control].params.get_param("job").schema["enum"] == sorted(latest_jobs())


def test_reprocess_job_runs_each_mode_through_its_own_first_step_then_the_shared_launch(dagbag_for):
    """The branch picks one of prepare / stop / migrate_state; the launch that follows both prepare and
    migrate_state must run after whichever of them ran (the other one is skipped)."""
    dag = dagbag_for(PROJECT_ROOT / "dags" / "reprocess_jobs.py").dags["reprocess_job"]
    assert dag.params.get_param("mode").schema["enum"] == ["side_by_side", "reset", "migrate"]
    assert set(dag.task_dict["choose"].downstream_task_ids) == {"prepare", "stop", "migrate_state", "audit"}
    launch = dag.task_dict["launch_new_version"]
    assert launch.upstream_task_ids == {"prepare", "migrate_state"}
    assert launch.trigger_rule == "none_failed_min_one_success"
    assert dag.task_dict["migrate_state"].downstream_task_ids == {"launch_new_version"}


@pytest.mark.parametrize(
    ("conf", "param"),
    [
        ({"mode": "rewind"}, "mode"),
        ({"job": "no_such_job"}, "job"),
        ({"start_from": "yesterday"}, "start_from"),
        ({"start_duration": "six hours"}, "start_duration"),
        ({"start_datetime": "last tuesday"}, "start_datetime"),
        ({"start_offsets": {"0": -5}}, "start_offsets"),
        ({"start_offsets": {"first": 3}}, "start_offsets"),
        ({"start_offsets": {"orders": {"0": -1}}}, "start_offsets"),
        ({"start_offsets": {"orders": {"first": 1}}}, "start_offsets"),
        ({"catch_up_timeout_min": 0}, "catch_up_timeout_min"),
    ],
)
def test_reprocess_form_rejects_bad_input_at_trigger_time(dagbag_for, conf, param):
    """What the trigger form and the REST API do before a run exists (the DAG's params merged with the
    conf, then validated against each Param's JSON schema)."""
    import copy

    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag_for(PROJECT_ROOT / "dags" / "reprocess_jobs.py").dags["reprocess_job"]

    def validate(conf: dict) -> dict:
        params = copy.deepcopy(dag.params)
        params.update(conf)
        return params.validate()

    assert validate({})["dry_run"] is True  # the defaults are a valid, dry-run request
    validate({"start_from": "offsets", "start_offsets": {"orders": {"0": 12}, "payments": {"1": 0}}})  # a join's
    validate(
        {
            "start_from": "offsets",
            "start_offsets": {"0": 12, "1": 0},
            "start_duration": "PT6H",
            "start_datetime": "2026-11-22T09:30:00.123+00:00",
        }
    )
    with pytest.raises(ParamValidationError, match=param):
        validate(conf)


@pytest.mark.parametrize(
    ("conf", "param"),
    [
        ({"mode": "aggressive"}, "mode"),
        ({"topics": ["not-a-changelog"]}, "topics"),
        ({"topics": PURCHASE_CHANGELOG}, "topics"),
    ],
)
def test_tuning_form_rejects_bad_input_at_trigger_time(dagbag_for, conf, param):
    import copy

    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag_for(PROJECT_ROOT / "dags" / "tune_changelogs.py").dags["tune_changelog_compaction"]

    def validate(conf: dict) -> dict:
        params = copy.deepcopy(dag.params)
        params.update(conf)
        return params.validate()

    assert validate({})["mode"] == "dry_run"  # a manual run without choices changes nothing
    validate({"mode": "rollback", "topics": [PURCHASE_CHANGELOG], "rollback_run_id": "manual__x"})
    with pytest.raises(ParamValidationError, match=param):
        validate(conf)
