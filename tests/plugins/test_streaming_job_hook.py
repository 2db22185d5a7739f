"""StreamingJobHook owns the Spark connection: it resolves it as the Spark provider does, builds the driver's
spark-submit from it, and refuses what a streamstate driver cannot do. No Spark runs: connections come from
``AIRFLOW_CONN_<ID>`` variables, and the provider's own command is captured where it would start spark-submit."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from streamstate.hooks.spare import SpareDriverHook
from streamstate.hooks.standby import StandbyHook
from streamstate.hooks.streaming_job import SparkConnection, StreamingJobHook, UnsupportedSparkConnection

from runtime.settings import Settings
from spark_jobs.driver.submit import spark_submit_binary
from spark_jobs.registry import get_job

CONN = "spark_streamstate_test"


def use_connection(monkeypatch, connection: dict | str, conn_id: str = CONN) -> None:
    """``conn_id`` as Airflow reads it from the environment (JSON, or a URI)."""
    value = connection if isinstance(connection, str) else json.dumps(connection)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", value)


@pytest.fixture
def hook(tmp_path) -> StreamingJobHook:
    return StreamingJobHook(get_job("purchase_counts"), Settings(data_dir=tmp_path), conn_id=CONN)


def option(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def provider_command(submit, conn_id: str, monkeypatch) -> list[str]:
    """The spark-submit the provider's hook (what ``SparkSubmitOperator`` runs) starts for ``submit`` on
    ``conn_id``, through its public ``submit()``; ``subprocess.Popen`` is replaced, so nothing starts."""
    started = []

    class NotStarted:
        def __init__(self, command, **kwargs):
            started.append(command)
            self.stdout = []

        def wait(self):
            return 0

    provider = SparkSubmitHook(
        conn_id=conn_id,
        conf=submit.conf,
        jars=submit.jars,
        py_files=submit.py_files,
        name=submit.name,
        application_args=list(submit.application_args),
    )
    with monkeypatch.context() as patch:
        patch.setattr(subprocess, "Popen", NotStarted)
        provider.submit(submit.application)
    return started[0]


def test_it_is_an_airflow_hook_of_the_spark_connection_read_only_when_a_launch_needs_it(tmp_path):
    assert issubclass(StreamingJobHook, BaseHook)
    assert (StreamingJobHook.conn_name_attr, StreamingJobHook.default_conn_name) == ("conn_id", "spark_default")
    assert StreamingJobHook.conn_type == SparkSubmitHook.conn_type == "spark"
    jobs = StreamingJobHook(get_job("purchase_counts"), Settings(data_dir=tmp_path), conn_id="no_such_connection")
    assert jobs.running_instance() is None and jobs.conn_id == "no_such_connection"  # no connection needed
    with pytest.raises(AirflowNotFoundException):  # not the provider's fallback to yarn
        jobs.get_conn()


CONNECTIONS = {
    "standalone, master in the host (the compose file's)": (
        {"conn_type": "spark", "host": "spark://spark-master:7077", "extra": {"deploy-mode": "client"}},
        SparkConnection(CONN, "spark://spark-master:7077", "client", None, "spark-submit", None),
    ),
    "standalone, a URI connection (host and port apart)": (
        "spark://spark-master:7077?deploy-mode=client&spark-binary=spark3-submit",
        SparkConnection(CONN, "spark://spark-master:7077", "client", None, "spark3-submit", None),
    ),
    "local, deploy mode unset": (
        {"conn_type": "spark", "host": "local[*]"},
        SparkConnection(CONN, "local[*]", None, None, "spark-submit", None),
    ),
    "yarn with a queue": (
        {"conn_type": "spark", "host": "yarn", "extra": {"queue": "streaming", "spark-binary": "spark2-submit"}},
        SparkConnection(CONN, "yarn", None, "streaming", "spark2-submit", None),
    ),
}


@pytest.mark.parametrize("connection, resolved", CONNECTIONS.values(), ids=CONNECTIONS)
def test_the_connection_resolves_to_what_the_provider_runs(hook, monkeypatch, connection, resolved):
    """Master, deploy mode, queue and binary as the provider's SparkSubmitHook puts them on its command line."""
    use_connection(monkeypatch, connection)
    assert hook.get_conn() == resolved
    submit = hook.submit_spec()
    ours, theirs = hook.submit_command(submit), provider_command(submit, CONN, monkeypatch)
    assert option(ours, "--master") == option(theirs, "--master") == resolved.master
    assert option(ours, "--queue") == option(theirs, "--queue") == resolved.queue
    assert option(theirs, "--deploy-mode") == resolved.deploy_mode and option(ours, "--deploy-mode") == "client"
    assert theirs[0] == resolved.spark_binary
    assert ours[0] == (spark_submit_binary() if resolved.spark_binary == "spark-submit" else resolved.spark_binary)
    tail = [submit.application, *submit.application_args]
    assert ours[-len(tail) :] == theirs[-len(tail) :] == tail


def test_the_command_is_the_platforms_submit_on_the_connections_master(hook, monkeypatch):
    """The jars, conf, Python files and application are the platform's (``SubmitSpec``), the master the
    connection's, the binary this environment's spark-submit."""
    use_connection(monkeypatch, {"conn_type": "spark", "host": "local[2]", "extra": {"spark-binary": "spark-submit"}})
    submit = hook.submit_spec()
    assert hook.submit_command(submit) == dataclasses.replace(submit, master="local[2]").command()


def test_a_kubernetes_namespace_is_the_drivers_namespace_conf(hook):
    """(The provider refuses a k8s:// master without its Kubernetes dependencies, not installed here, so the
    resolved connection is given.)"""
    hook.spark = SparkConnection(CONN, "k8s://https://api:6443", "client", None, "spark-submit", "streaming")
    command = hook.submit_command(hook.submit_spec())
    assert "spark.kubernetes.namespace=streaming" in command
    hook.spark = SparkConnection(CONN, "spark://m:7077", "client", None, "spark-submit", "streaming")
    assert not any(arg.startswith("spark.kubernetes.namespace") for arg in hook.submit_command(hook.submit_spec()))


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"deploy-mode": "cluster"}, "'deploy-mode' is 'cluster'"),
        ({"principal": "streamstate@EXAMPLE.COM"}, "extra 'principal'"),
        ({"keytab": "c2VjcmV0"}, "extra 'keytab'"),
    ],
)
def test_an_extra_a_driver_cannot_honour_is_refused_naming_the_connection_and_nothing_starts(
    hook, monkeypatch, tmp_path, extra, named
):
    use_connection(monkeypatch, {"conn_type": "spark", "host": "spark://m:7077", "extra": extra})
    with pytest.raises(UnsupportedSparkConnection) as refused:
        hook.launch_driver("test")
    assert f"Spark connection {CONN!r}" in str(refused.value) and named in str(refused.value)
    assert not list(Path(hook.settings.logs_dir).rglob("*.log")), "nothing was launched"


def test_the_providers_own_refusals_stand(hook, monkeypatch):
    use_connection(monkeypatch, {"conn_type": "spark", "host": "yarn", "extra": {"spark-binary": "/tmp/my-submit"}})
    with pytest.raises(ValueError, match="spark-binary"):
        hook.get_conn()
    other = StreamingJobHook(hook.spec, hook.settings, conn_id="spark_k8s_test")
    use_connection(monkeypatch, {"conn_type": "spark", "host": "k8s://https://api:6443"}, "spark_k8s_test")
    # the provider fails a k8s:// master without its Kubernetes dependencies (not installed here; the provider
    # means a RuntimeError, 6.3.4 raises a NameError on the way): so does the launch
    with pytest.raises((RuntimeError, NameError), match="kube"):
        other.get_conn()


def test_spark_default_is_read_from_its_environment_variable(tmp_path, monkeypatch):
    use_connection(monkeypatch, {"conn_type": "spark", "host": "spark://default:7077"}, "spark_default")
    jobs = StreamingJobHook(get_job("purchase_counts"), Settings(data_dir=tmp_path))
    assert jobs.get_conn().master == "spark://default:7077"


def test_the_spare_launches_its_own_driver_on_the_same_connection_and_the_standby_none(tmp_path, monkeypatch):
    use_connection(monkeypatch, {"conn_type": "spark", "host": "spark://m:7077"})
    settings = Settings(data_dir=tmp_path)
    spare = SpareDriverHook(get_job("purchase_counts"), settings, conn_id=CONN)
    command = spare.submit_command(spare.submit_spec())
    assert command[-1] == "--spare" and option(command, "--master") == "spark://m:7077"
    with pytest.raises(TypeError, match="launch_follower"):
        StandbyHook(get_job("purchase_counts"), settings).launch_driver("test")


def test_operators_hand_their_conn_id_to_the_hook():
    from streamstate.operators.spare import SuperviseSpareOperator
    from streamstate.operators.streaming_job import LaunchStreamingJobOperator, WatchStreamingJobOperator

    assert LaunchStreamingJobOperator(task_id="launch", job="purchase_counts").conn_id == "spark_default"
    assert WatchStreamingJobOperator(task_id="watch", job="purchase_counts", conn_id=CONN).conn_id == CONN
    spare = SuperviseSpareOperator(task_id="spare", job="purchase_counts", conn_id=CONN)
    assert spare.hook(get_job("purchase_counts")).conn_id == CONN
