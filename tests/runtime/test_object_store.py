"""Locations and object store settings (pure logic; the object store itself: tests/spark_jobs/test_object_storage.py)."""

from __future__ import annotations

import pytest

from runtime.object_store import Location, ObjectStoreConnection, ObjectStoreError
from runtime.settings import Settings, SettingsError
from spark_jobs.driver.session import spark_conf
from spark_jobs.layout import snapshot_table_path


def test_an_object_store_location_keeps_its_scheme_through_joins():
    lake = Location.of("s3://lake/prod/")
    assert str(lake) == "s3a://lake/prod"  # one spelling, Spark's
    table = lake / "_state" / "job-v1" / "counts"
    assert str(table) == "s3a://lake/prod/_state/job-v1/counts" and not table.is_local
    assert (table.name, str(table.parent), str(Location.of("s3a://lake").parent)) == (
        "counts",
        str(lake / "_state" / "job-v1"),
        "s3a://lake",
    )
    assert str(snapshot_table_path("s3a://lake/prod", "job-v1", "counts")) == str(table)
    with pytest.raises(ObjectStoreError, match="not on the local disk"):
        _ = table.path
    with pytest.raises(ObjectStoreError, match="no object store is configured"):
        table.storage_options()


def test_a_local_location_is_a_path(tmp_path):
    lake = Location.of(tmp_path / "lake")
    assert lake.is_local and lake.path == tmp_path / "lake" and lake.storage_options() is None
    assert not lake.exists() and lake.size_bytes() == 0 and lake.children() == []
    (lake / "t" / "a.txt").write_text("hello")
    assert (lake / "t" / "a.txt").read_text() == "hello" and lake.size_bytes() == 5
    assert [c.name for c in lake.children()] == ["t"] and (lake / "t").files() == [("a.txt", 5)]
    assert (lake / "t").remove() and not (lake / "t").exists() and not (lake / "t").remove()


def test_bad_locations_and_store_settings_are_refused_naming_the_setting():
    with pytest.raises(ObjectStoreError, match="only local paths and s3a://"):
        Location.of("gs://bucket/lake")
    with pytest.raises(ObjectStoreError, match="needs a bucket"):
        Location.of("s3a:///lake")
    with pytest.raises(SettingsError, match="STREAMSTATE_LAKE_URI"):
        Settings.from_env({"STREAMSTATE_LAKE_URI": "hdfs://nn/lake"})
    with pytest.raises(SettingsError, match="go together"):
        Settings.from_env({"STREAMSTATE_LAKE_URI": "s3a://lake/x", "STREAMSTATE_S3_ACCESS_KEY_ID": "id"})
    with pytest.raises(SettingsError, match="expected http"):
        Settings.from_env({"STREAMSTATE_S3_ENDPOINT": "minio:9000"})


def test_the_secret_key_is_read_from_its_file_and_shown_nowhere(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t\n")
    env = {
        "STREAMSTATE_LAKE_URI": "s3a://lake/prod",
        "STREAMSTATE_S3_ENDPOINT": "http://127.0.0.1:9000",
        "STREAMSTATE_S3_ACCESS_KEY_ID": "id",
        "STREAMSTATE_S3_SECRET_ACCESS_KEY_FILE": str(secret),
        "STREAMSTATE_DATA_DIR": str(tmp_path),
    }
    settings = Settings.from_env(env)
    store = settings.object_store
    assert store.storage_options() == {
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_FORCE_PATH_STYLE": "true",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
    }
    conf = spark_conf(settings)
    assert (
        conf["spark.hadoop.fs.s3a.secret.key"] == "s3cr3t" and conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    )
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert "s3cr3t" not in repr(settings) + repr(store) + str(store) + str(store.describe())
    assert Settings.from_env(settings.to_env()) == settings  # a child process gets the same store
    # a local lake gives Spark no S3A settings (and reads no secret)
    assert not any("s3a" in key for key in spark_conf(settings.replace(lake_uri=None)))


def test_an_aws_store_needs_no_endpoint():
    store = ObjectStoreConnection(region="eu-west-1")
    assert store.uses_tls and store.storage_options() == {"AWS_REGION": "eu-west-1"}
    assert (
        store.hadoop_conf()["fs.s3a.connection.ssl.enabled"] == "true" and "fs.s3a.endpoint" not in store.hadoop_conf()
    )
