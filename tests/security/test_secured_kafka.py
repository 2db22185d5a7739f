"""The platform against a secured Kafka: a SASL_SSL broker with ACLs (no anonymous access anywhere),
the reference job drained through its Airflow DAG with SASL/SCRAM, the admin DAGs (changelog tuning,
state audit) and the state query API against it, SASL/PLAIN clients, and clients without (valid)
credentials refused. Then every output of the run is searched for the passwords.

The platform's user is a SCRAM user created at run time, so its password exists only in its 0600
file: it must appear in no log, status file, report, Delta table, checkpoint, Airflow database or
log, alert payload, DAG output or UI page.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from fastapi.testclient import TestClient

from runtime.alert_inbox import AlertInbox
from runtime.kafka_broker import LocalKafkaBroker
from runtime.kafka_connection import KafkaConnection, client_config
from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.driver.lifecycle import read_standby_status
from spark_jobs.io import kafka_topics
from spark_jobs.operations.standby.follower import SnapshotFollower
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.snapshots import SnapshotStore, snapshot_path
from tests.conftest import stack_settings
from tests.helpers import delta_purchase_counts
from tests.secured_kafka import (
    OUTSIDER_USER,
    PLAIN_USER,
    PLATFORM_USER,
    SecuredCluster,
    new_password,
    write_secret,
)

pytestmark = [pytest.mark.integration, pytest.mark.security]

JOB = get_job("purchase_counts")
CHANGELOG = changelog_topic_name(JOB.application_id, "counts")
#: four micro-batches of 300 (``max_offsets_per_trigger``): each live key's changelog holds ~4 records
EVENTS, USERS = 1200, 60
#: the state API's bearer token: a secret too, searched for like the passwords
STATE_API_TOKEN = "tok-" + new_password()
#: a tight tuning policy: the job's small batches leave ~4 records per live key, which alerts on the first
#: run, so an alert payload is among the outputs searched
POLICY = {"STREAMSTATE_COMPACTION_TARGET_REPLAY_RATIO": "1.5", "STREAMSTATE_COMPACTION_ALERT_AFTER_RUNS": "1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> SecuredCluster:
    return SecuredCluster(tmp_path_factory.mktemp("secured-kafka"), "127.0.0.1")


@pytest.fixture(scope="module")
def secured(cluster: SecuredCluster, tmp_path_factory) -> Settings:
    """Settings of a deployment whose Kafka is secured: SASL_SSL, SCRAM-SHA-512, the test CA."""
    own = stack_settings(
        tmp_path_factory.mktemp("secured-stack"),
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username=PLATFORM_USER,
        kafka_sasl_password_file=cluster.password_files[PLATFORM_USER],
        kafka_ssl_ca_file=cluster.ca_pem,
        max_offsets_per_trigger=300,
        state_api_token=STATE_API_TOKEN,
        standby_commit_interval_s=1.0,
    )
    broker = LocalKafkaBroker(own, cluster.security)
    broker.start()
    cluster.provision(own.kafka_bootstrap_servers)
    yield own
    broker.stop()


def _refusal(connection: KafkaConnection | str, topic: str, timeout_s: float = 8) -> KafkaError:
    """The error a client gets when it asks for ``topic``'s metadata. A client whose refusal may be a
    timeout waits ``timeout_s`` for it (on loopback an accepted client answers in milliseconds)."""
    consumer = Consumer(client_config(connection, {"group.id": "refused", "log_level": 0}))
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s)
    except KafkaException as err:
        return err.args[0]
    finally:
        consumer.close()
    return meta.topics[topic].error


def test_clients_without_valid_credentials_or_acls_are_refused(secured, cluster, tmp_path):
    bootstrap = secured.kafka_bootstrap_servers
    kafka_topics.ensure_topic(secured.kafka, "guarded", 1)
    # The platform's own connection works (metadata, no error).
    assert _refusal(secured.kafka, "guarded") is None
    # No credentials: plaintext to the SASL_SSL listener never gets as far as a request.
    assert _refusal(bootstrap, "guarded", timeout_s=3).code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT)
    # TLS alone (no SASL) is not enough either.
    tls_only = KafkaConnection(bootstrap, "SSL", ssl_ca_file=cluster.ca_pem)
    assert _refusal(tls_only, "guarded", timeout_s=3).code() in (
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
    )
    # A wrong password fails authentication.
    wrong = cluster.connection(bootstrap, PLATFORM_USER, password_file=write_secret(tmp_path / "wrong", "not-it"))
    assert _refusal(wrong, "guarded", timeout_s=3).code() in (
        KafkaError._AUTHENTICATION,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    )
    # Authenticated but without ACLs: the topic is not authorized.
    assert (
        _refusal(cluster.connection(bootstrap, OUTSIDER_USER), "guarded").code()
        == KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    # A certificate the client does not trust (no CA file: the system store) fails the TLS handshake.
    untrusted = KafkaConnection(
        bootstrap, "SASL_SSL", "SCRAM-SHA-512", PLATFORM_USER, cluster.password_files[PLATFORM_USER]
    )
    assert _refusal(untrusted, "guarded", timeout_s=3).code() in (
        KafkaError._SSL,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    )


def test_sasl_plain_clients_and_spark(secured, cluster, spark):
    """SASL/PLAIN through the same KafkaConnection: the platform's topic helpers, a producer, a consumer
    and Spark's Kafka source (the Java client with the JAAS option the connection builds)."""
    plain = cluster.connection(secured.kafka_bootstrap_servers, PLAIN_USER, mechanism="PLAIN")
    kafka_topics.ensure_topic(plain, "plain-purchases", 2)
    events = list(purchases.generate(200, users=20, seed=5))
    assert purchases.produce(plain, "plain-purchases", events) == 200
    assert len(kafka_topics.read_json_records(plain, "plain-purchases")) == 200
    read = spark.read.format("kafka").options(**plain.spark_options()).option("subscribe", "plain-purchases").load()
    assert read.count() == 200
    # The JAAS option carries the password: Spark's plans (shown in its UI and logs) redact it.
    stream = (
        spark.readStream.format("kafka").options(**plain.spark_options()).option("subscribe", "plain-purchases").load()
    )
    plan = stream._jdf.queryExecution().toString()
    assert "kafka.sasl.jaas.config=*********(redacted)" in plan and cluster.passwords[PLAIN_USER] not in plan


@pytest.fixture(scope="module")
def secured_run(secured, cluster, dag_runner, airflow_db, tmp_path_factory):
    """Input produced, the job drained by its Airflow DAG, the tuning DAG (apply) and the audit DAG run,
    all against the secured broker; returns what the search needs."""
    webhook = AlertInbox()
    kafka_topics.ensure_topic(secured.kafka, JOB.source_topic, JOB.source_partitions)
    events = list(purchases.generate(EVENTS, users=USERS, seed=11))
    purchases.produce(secured.kafka, JOB.source_topic, events)
    env = {**secured.to_env(), **POLICY, "AIRFLOW_CONN_STREAMSTATE_WEBHOOK": webhook.connection}
    results = {}
    for dag_id, dag_file, conf in (
        (f"drain__{JOB.name}", "drain_jobs.py", None),
        ("tune_changelog_compaction", "tune_changelogs.py", {"mode": "apply"}),
        ("audit_state_size", "audit_state_size.py", None),
    ):
        result = dag_runner.dags_test(dag_id, conf, env=env, dag_file=PROJECT_ROOT / "dags" / dag_file)
        assert result.returncode == 0, (
            f"{dag_id} failed on the secured broker:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
        )
        results[dag_id] = result
    yield {
        "events": events,
        "results": results,
        "webhook": webhook,
        "dag_outputs": dag_runner._outputs,
        "airflow_home": airflow_db.home,
    }
    webhook.close()


def test_job_and_admin_dags_run_on_secured_kafka(secured, secured_run, spark):
    # The drained job's output equals the reference computation.
    output = str(secured.lake / JOB.output_table_dir)
    assert delta_purchase_counts(spark, output) == purchases.expected_counts(secured_run["events"])
    # Its changelog and (empty) dead-letter topic were created on the secured broker, by the platform user.
    assert kafka_topics.existing_topics(secured.kafka, [CHANGELOG]) == {CHANGELOG}
    # The tuning DAG measured it (and, with the tight policy, alerted on it); the audit DAG reported.
    alerts = [(a["application_id"], a["condition"], a["status"]) for a in secured_run["webhook"].received]
    assert (JOB.application_id, "changelog_replay_counts", "firing") in alerts, alerts
    assert (secured.status_dir / "state_audit" / f"{JOB.application_id}.counts.png").exists()


def _ui_pages(secured: Settings, expected: dict, monkeypatch) -> list[str]:
    """The state API's answers and the jobs UI's pages, for a deployment with ``secured``'s settings."""
    from streamstate.state_api.app import create_app

    user = sorted(expected)[0]
    with TestClient(create_app(secured), headers={"Authorization": f"Bearer {STATE_API_TOKEN}"}) as client:
        answer = client.get(f"/jobs/{JOB.name}/stores/counts/keys/{user}").json()
        pages = [
            json.dumps(answer),
            client.get(f"/jobs/{JOB.name}/stores/counts").text,
            client.get("/openapi.json").text,
        ]
    for key, value in secured.to_env().items():
        monkeypatch.setenv(key, value)
    from streamstate.ui.jobs_page import app as jobs_page

    with TestClient(jobs_page) as client:
        for path in ("/", "/api/jobs", "/api/alerts", "/state-audit/"):
            page = client.get(path)
            assert page.status_code == 200, (path, page.text[:500])
            pages.append(page.text)
    return pages


def test_standby_live_view_and_state_api_on_secured_kafka(secured, secured_run, monkeypatch):
    """The warm standby and a live view follow the changelog over SASL_SSL; the state API answers from
    the standby like the reference computation."""
    from streamstate.state_api.views import LiveView

    expected = purchases.expected_counts(secured_run["events"])
    follower = SnapshotFollower(JOB, secured)
    follower.run(max_seconds=3 * secured.standby_commit_interval_s)
    status = read_standby_status(secured.status_dir, JOB.application_id)
    assert status.error is None and status.transient_kafka_errors == 0, status
    view = LiveView(
        SnapshotStore(snapshot_path(secured.lake, JOB.application_id, "counts"), JOB.application_id, "counts"),
        secured.kafka,
        CHANGELOG,
    )
    try:
        assert view.wait_ready(60) and view.error is None
        live = {user: json.loads(value)["purchases"] for user, value in view.table.state.items()}
        assert live == {user: count for user, (count, _) in expected.items()}
    finally:
        view.stop(5)
    pages = _ui_pages(secured, expected, monkeypatch)
    answer = json.loads(pages[0])
    user = sorted(expected)[0]
    assert (answer["source"], answer["found"], answer["value"]["purchases"]) == ("standby", True, expected[user][0]), (
        answer
    )
    assert JOB.name in pages[-3] and "counts" in pages[1]


def _files_containing(secret: bytes, roots: list[Path]) -> list[str]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            try:
                if path.is_file() and secret in path.read_bytes():
                    found.append(str(path))
            except OSError:  # a file removed while walking (Spark temp files)
                continue
    return found


def test_no_secret_in_any_output(secured, cluster, secured_run, monkeypatch):
    """Search every output of the secured run for the passwords: files under the deployment's data
    directory (driver logs, status files, reports, checkpoints, Delta tables, DAG outputs, the broker's
    log), Airflow's home (task logs, the metadata database with DAG run confs and XComs), the DAG runs'
    console output, the alert payloads and the UI pages. Only the broker's own configuration may hold
    the passwords of the PLAIN users it authenticates (Kafka's built-in PLAIN store)."""
    pages = _ui_pages(secured, purchases.expected_counts(secured_run["events"]), monkeypatch)
    broker_config = secured.kafka_dir / "server.properties"
    texts = {
        "alert payloads": json.dumps(secured_run["webhook"].received),
        "UI pages": "\n".join(pages),
        **{f"`airflow dags test {d}` output": r.stdout + r.stderr for d, r in secured_run["results"].items()},
        "settings repr": repr(secured) + json.dumps(secured.to_env()) + json.dumps(secured.kafka.describe()),
    }
    roots = [secured.data_dir, secured_run["airflow_home"], secured_run["dag_outputs"], cluster.dir / "tls"]
    for user, secret in [*cluster.passwords.items(), ("the state API token", STATE_API_TOKEN)]:
        in_files = [f for f in _files_containing(secret.encode(), roots) if Path(f) != broker_config]
        in_texts = [
            name
            for name, text in texts.items()
            if secret in text and not (name == "settings repr" and secret == STATE_API_TOKEN)
        ]  # to_env() carries the token by design
        assert (in_files, in_texts) == ([], []), f"{user}'s secret found in {in_files} {in_texts}"
    # The search can find what it looks for: the platform's SCRAM password is nowhere, but the broker's
    # configuration does hold the PLAIN user's password.
    assert _files_containing(cluster.passwords[PLAIN_USER].encode(), [secured.kafka_dir]) == [str(broker_config)]
    assert cluster.passwords[PLATFORM_USER].encode() not in broker_config.read_bytes()
