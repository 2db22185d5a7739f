"""versions.toml is the record of pins; every other place that repeats a version must agree with it."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
import xml.etree.ElementTree as ET

import pytest

from runtime.settings import PROJECT_ROOT

PINS = tomllib.loads((PROJECT_ROOT / "versions.toml").read_text())
NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def pom_properties(name: str) -> dict[str, str]:
    root = ET.parse(PROJECT_ROOT / "jvm" / name / "pom.xml").getroot()
    return {child.tag.split("}")[1]: child.text for child in root.find("m:properties", NS)}


def requirement_pins(path: str) -> dict[str, str]:
    pins = {}
    for line in (PROJECT_ROOT / path).read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def test_maven_manifests_match():
    spark = pom_properties("spark-jars")
    assert spark["spark.version"] == PINS["spark"]["version"]
    assert spark["spark.minor"] == PINS["spark"]["minor"] == ".".join(PINS["spark"]["version"].split(".")[:2])
    assert spark["delta.version"] == PINS["delta"]["version"]
    assert spark["spark.kafka.token.provider.version"] == PINS["spark"]["kafka_token_provider"]["version"]
    assert spark["hadoop.version"] == PINS["hadoop_aws"]["version"]
    assert spark["awssdk.version"] == PINS["hadoop_aws"]["awssdk"]
    assert spark["analyticsaccelerator.version"] == PINS["hadoop_aws"]["analytics_accelerator"]
    assert pom_properties("s3-server")["s3proxy.version"] == PINS["s3proxy"]["version"]
    broker = pom_properties("kafka-broker")
    assert broker["kafka.version"] == PINS["kafka"]["version"]
    assert broker["log4j.version"] == PINS["log4j"]["version"]
    assert broker["slf4j.version"] == PINS["log4j"]["slf4j"]


@pytest.mark.parametrize("source", ["requirements.in", "requirements.lock"])
def test_python_pins_match(source):
    pins = requirement_pins(source)
    assert pins["pyspark"] == PINS["spark"]["version"]
    assert pins["delta-spark"] == PINS["delta"]["version"]
    assert pins["apache-airflow"] == PINS["airflow"]["version"]
    assert pins["apache-airflow-providers-apache-spark"] == PINS["airflow"]["spark_provider"]
    assert pins["confluent-kafka"] == PINS["confluent_kafka"]["version"]
    assert pins["deltalake"] == PINS["deltalake"]["version"]
    assert pins["ruff"] == PINS["ruff"]["version"]
    for provider, version in PINS["airflow"]["notifier_providers"].items():
        assert pins[f"apache-airflow-providers-{provider}"] == version, provider


def test_installed_environment_is_the_lock():
    lock = requirement_pins("requirements.lock")
    for name in (
        "pyspark",
        "delta-spark",
        "apache-airflow",
        "apache-airflow-providers-apache-spark",
        "confluent-kafka",
        "deltalake",
        "pandas",
        "pyarrow",
    ):
        assert importlib.metadata.version(name) == lock[name], name
    assert int(importlib.metadata.version("pandas").split(".")[0]) < 3


def test_resolved_jars_are_the_pinned_ones(settings):
    from runtime import jvm

    spark_jars = {p.name for p in jvm.spark_jars(settings)}
    assert f"spark-sql-kafka-0-10_2.13-{PINS['spark']['version']}.jar" in spark_jars
    assert f"delta-spark_{PINS['spark']['minor']}_2.13-{PINS['delta']['version']}.jar" in spark_jars
    assert f"delta-storage-{PINS['delta']['version']}.jar" in spark_jars
    assert f"hadoop-aws-{PINS['hadoop_aws']['version']}.jar" in spark_jars
    assert f"s3-{PINS['hadoop_aws']['awssdk']}.jar" in spark_jars
    # the SDK's bundle is excluded; Hadoop, Netty and httpclient are pyspark's own
    assert not any(
        name.startswith(("bundle-", "hadoop-client", "netty-codec", "netty-common", "httpclient-"))
        for name in spark_jars
    )
    assert [p.name for p in jvm.jars(settings, "s3-server")] == [
        f"s3proxy-{PINS['s3proxy']['version']}-jar-with-dependencies.jar"
    ]
    broker_jars = {p.name for p in jvm.jars(settings, "kafka-broker")}
    assert f"kafka_2.13-{PINS['kafka']['version']}.jar" in broker_jars
    assert f"log4j-slf4j2-impl-{PINS['log4j']['version']}.jar" in broker_jars
    assert f"slf4j-api-{PINS['log4j']['slf4j']}.jar" in broker_jars
    assert not any(name.startswith("slf4j-api-1.") for name in broker_jars)


def test_image_tags_follow_the_pins():
    images = PINS["images"]
    assert images["kafka"] == f"apache/kafka:{PINS['kafka']['version']}"
    assert images["spark"].startswith(f"apache/spark:{PINS['spark']['version']}-scala{PINS['spark']['scala']}-java17")
    assert images["airflow"] == f"apache/airflow:{PINS['airflow']['version']}-python{PINS['airflow']['python']}"
    dockerfile = (PROJECT_ROOT / "docker" / "airflow.Dockerfile").read_text()
    assert f"FROM {images['airflow']}" in dockerfile
