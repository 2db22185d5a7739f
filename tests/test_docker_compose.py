"""docker-compose.yml cannot run here (no container engine), so it is kept honest by checking it
against the pinned versions and against the configuration the code actually reads."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from runtime.airflow_standalone import alert_webhook_connection, spark_default_connection
from runtime.settings import ENV_PREFIX, PROJECT_ROOT, Settings

PINS = tomllib.loads((PROJECT_ROOT / "versions.toml").read_text())
COMPOSE = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
KAFKA = sorted(name for name in SERVICES if name.startswith("kafka-"))
AIRFLOW = sorted(name for name in SERVICES if name.startswith("airflow-"))


def env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in SERVICES[service].get("environment", {}).items()}


def airflow_settings() -> Settings:
    streamstate = {k: v for k, v in env("airflow-scheduler").items() if k.startswith(ENV_PREFIX)}
    return Settings.from_env(streamstate)  # raises on any unknown or malformed STREAMSTATE_ variable


def test_every_service_the_platform_expects_exists():
    expected = {
        "kafka-1",
        "kafka-2",
        "kafka-3",
        "spark-master",
        "spark-worker-1",
        "spark-worker-2",
        "postgres",
        "airflow-init",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "s3",
        "prometheus",
    }
    assert expected <= set(SERVICES)


def test_images_match_the_pins():
    images = PINS["images"]
    for name in KAFKA:
        assert SERVICES[name]["image"] == images["kafka"]
    for name in ("spark-master", "spark-worker-1", "spark-worker-2"):
        assert SERVICES[name]["image"] == images["spark"]
    assert SERVICES["postgres"]["image"] == images["postgres"]
    for name in AIRFLOW:
        assert SERVICES[name]["build"]["dockerfile"] == "docker/airflow.Dockerfile"
        assert SERVICES[name]["image"].endswith(":" + PINS["airflow"]["version"])


def test_three_kraft_brokers_with_replication_3_and_min_isr_2():
    voters = {env(name)["KAFKA_CONTROLLER_QUORUM_VOTERS"] for name in KAFKA}
    assert voters == {"1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"}
    assert sorted(env(name)["KAFKA_NODE_ID"] for name in KAFKA) == ["1", "2", "3"]
    for name in KAFKA:
        e = env(name)
        assert e["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert e["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert e["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert e["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert e["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert len({env(name)["CLUSTER_ID"] for name in KAFKA}) == 1


def test_clients_bootstrap_from_exactly_the_brokers():
    settings = airflow_settings()
    advertised = {env(name)["KAFKA_ADVERTISED_LISTENERS"].removeprefix("PLAINTEXT://") for name in KAFKA}
    assert set(settings.kafka_bootstrap_servers.split(",")) == advertised
    assert settings.kafka_replication_factor == 3


def test_spark_master_url_agrees_everywhere():
    settings = airflow_settings()
    master_cmd = SERVICES["spark-master"]["command"]
    url = f"spark://{master_cmd[master_cmd.index('--host') + 1]}:{master_cmd[master_cmd.index('--port') + 1]}"
    assert settings.spark_master == url
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert url in SERVICES[worker]["command"]
    # The spark_default connection the DAGs use is the code's own connection for these settings.
    conn = json.loads(env("airflow-scheduler")["AIRFLOW_CONN_SPARK_DEFAULT"])
    ours = spark_default_connection(settings)
    assert conn["conn_type"] == ours["conn_type"] and conn["host"] == ours["host"] == url
    assert conn["extra"] == json.loads(ours["extra"])


@pytest.mark.parametrize("service", AIRFLOW)
def test_airflow_services_mount_the_repo_and_share_the_data_volume(service):
    spec = SERVICES[service]
    assert ".:/opt/streamstate" in spec["volumes"]
    assert "streamstate-data:/data" in spec["volumes"]
    e = env(service)
    assert e["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/streamstate/dags"
    assert e["AIRFLOW__CORE__PLUGINS_FOLDER"] == "/opt/streamstate/plugins"
    assert e["STREAMSTATE_DATA_DIR"] == "/data"


def test_spark_workers_see_the_same_data_paths_as_the_driver():
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert "streamstate-data:/data" in SERVICES[worker]["volumes"]
        # spark_conf() points executors at files under the repository (log4j2.properties).
        assert ".:/opt/streamstate:ro" in SERVICES[worker]["volumes"]


def test_airflow_runs_every_component():
    commands = {tuple(SERVICES[name]["command"]) for name in AIRFLOW}
    for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
        assert (component,) in commands


def test_alerts_default_to_the_api_servers_inbox():
    api = SERVICES["airflow-apiserver"]
    port = api["ports"][0].split(":")[-1]
    for service in AIRFLOW:
        conn = json.loads(env(service)["AIRFLOW_CONN_STREAMSTATE_WEBHOOK"])
        assert conn == alert_webhook_connection(f"http://{api['hostname']}:{port}")


#: broker settings of the local cluster (runtime/kafka_cluster.py) the compose brokers set otherwise, and why
LOCAL_CLUSTER_ONLY = {
    # where a node listens and keeps its data: a host's own (the compose brokers' are in their environment)
    "node.id": "each node's own",
    "controller.quorum.voters": "the hosts' names here, 127.0.0.1 ports locally",
    "listeners": "the hosts' names here",
    "advertised.listeners": "the hosts' names here",
    "log.dirs": "the image's own data directory",
    # tuned for one machine starting many short-lived drivers, where Kafka's defaults cost seconds each
    "transaction.state.log.num.partitions": "5 partitions start in a second on one machine; a cluster keeps 50",
    "log.cleaner.dedupe.buffer.size": "32 MiB on one machine; a cluster keeps Kafka's 128 MiB",
    "log.cleaner.backoff.ms": "a test's changelog compacts within a second; a cluster keeps 15 s",
    "share.coordinator.state.topic.replication.factor": "share groups are not used by the platform",
    "share.coordinator.state.topic.min.isr": "share groups are not used by the platform",
}


def test_the_compose_brokers_run_the_local_clusters_configuration(tmp_path):
    """What the production-shape tests ran (three KRaft nodes, tests/production) is what compose deploys."""
    from runtime.kafka_cluster import LocalKafkaCluster

    cluster = LocalKafkaCluster(Settings(data_dir=tmp_path), [(19092, 19093), (19192, 19193), (19292, 19293)])
    tested = cluster.nodes[1].server_properties()
    for name in KAFKA:
        deployed = {key.removeprefix("KAFKA_").lower().replace("_", "."): value for key, value in env(name).items()}
        differ = {
            key: (value, deployed.get(key))
            for key, value in tested.items()
            if key not in LOCAL_CLUSTER_ONLY and deployed.get(key) != value
        }
        assert not differ, f"{name}: (tested, deployed) {differ}"
    assert cluster.client_settings().kafka_replication_factor == airflow_settings().kafka_replication_factor


def test_prometheus_scrapes_what_the_platform_lists_with_the_shipped_rules():
    from runtime.prometheus import ALERT_RULES_FILE, render_alert_rules, scrape_config

    service = SERVICES["prometheus"]
    assert service["image"] == PINS["images"]["prometheus"]
    assert "streamstate-data:/data:ro" in service["volumes"]
    assert "./monitoring/alerts.yml:/etc/prometheus/alerts.yml:ro" in service["volumes"]
    config = yaml.safe_load((PROJECT_ROOT / "docker" / "prometheus.yml").read_text())
    assert config == scrape_config(airflow_settings(), [Path("/etc/prometheus/alerts.yml")])
    assert ALERT_RULES_FILE.read_text() == render_alert_rules(airflow_settings())


def test_the_master_keeps_what_it_knows_as_the_local_cluster_does():
    from runtime.spark_standalone import master_recovery_options

    master = SERVICES["spark-master"]
    recovery = master["volumes"][0].split(":")[1]
    assert master["environment"]["SPARK_MASTER_OPTS"] == master_recovery_options(recovery)


def test_tables_and_checkpoints_are_in_the_compose_object_store_as_the_code_configures_it():
    from urllib.parse import urlparse

    from runtime.s3_server import ACCESS_KEY_ID, s3proxy_properties

    settings = airflow_settings()
    service = SERVICES["s3"]
    script = service["entrypoint"][-1]
    words = shlex.split(script)
    options = dict(option.removeprefix("-D").split("=", 1) for option in words if option.startswith("-D"))
    basedir = options["jclouds.filesystem.basedir"]
    secret = f"/run/secrets/{service['secrets'][0]}"
    # the code's server configuration, bound to every interface, the secret read from the compose secret
    expected = s3proxy_properties(options["s3proxy.endpoint"], basedir, f"$$(cat {secret})")
    assert options == expected
    assert f"{basedir}:ro" not in service["volumes"] and any(v.endswith(f":{basedir}") for v in service["volumes"])
    assert f"s3proxy-{PINS['s3proxy']['version']}-jar-with-dependencies.jar" in script

    # the platform reaches it by the service's name and port, signs with its identity and the same secret
    endpoint = urlparse(settings.s3_endpoint)
    assert (endpoint.hostname, endpoint.port) == (service["hostname"], urlparse(options["s3proxy.endpoint"]).port)
    assert settings.s3_access_key_id == ACCESS_KEY_ID
    assert str(settings.s3_secret_access_key_file) == secret
    for name in AIRFLOW:
        assert SERVICES[name]["secrets"] == service["secrets"]
    assert COMPOSE["secrets"][service["secrets"][0]] == {"environment": "STREAMSTATE_S3_SECRET"}
    # in the bucket the server makes at its start
    buckets = {urlparse(uri).netloc for uri in (settings.lake_uri, settings.checkpoint_uri)}
    assert buckets == {"lake"} and f"mkdir -p {basedir}/lake" in script
