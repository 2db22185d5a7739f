"""Unit tests of the typed settings (pure logic, no services)."""

from pathlib import Path

import pytest

from runtime.settings import Settings, SettingsError


def test_defaults_are_the_embedded_stack():
    s = Settings.from_env({})
    assert s.kafka_bootstrap_servers == "127.0.0.1:9092"
    assert s.spark_master == "local[*]"
    assert s.airflow_url == "http://127.0.0.1:8080"


def test_environment_overrides_and_round_trip(tmp_path):
    s = Settings.from_env(
        {
            "STREAMSTATE_KAFKA_PORT": "19092",
            "STREAMSTATE_DATA_DIR": str(tmp_path),
            "STREAMSTATE_SPARK_MASTER": "spark://10.0.0.5:7077",
            "HOME": "/ignored",
            "STREAMSTATE_MAX_OFFSETS_PER_TRIGGER": "50000",
        }
    )
    assert s.kafka_bootstrap_servers == "127.0.0.1:19092"
    assert s.max_offsets_per_trigger == 50_000  # an optional int arrives as an int, not a string
    assert s.data_dir == tmp_path and isinstance(s.data_dir, Path)
    assert s.lake.path == tmp_path / "lake"
    assert Settings.from_env(s.to_env()) == s


def test_a_micro_batch_is_bounded_unless_the_limit_is_turned_off():
    """A restart after an outage works its backlog off in bounded batches by default; 0 turns the limit off, and
    says so to a driver started from these settings."""
    from runtime.settings import DEFAULT_MAX_OFFSETS_PER_TRIGGER

    assert Settings().max_offsets_per_trigger == DEFAULT_MAX_OFFSETS_PER_TRIGGER == 200_000
    unlimited = Settings.from_env({"STREAMSTATE_MAX_OFFSETS_PER_TRIGGER": "0"})
    assert unlimited.max_offsets_per_trigger == 0 and Settings.from_env(unlimited.to_env()) == unlimited


def test_external_bootstrap_wins():
    s = Settings.from_env({"STREAMSTATE_KAFKA_EXTERNAL_BOOTSTRAP": "kafka-1:9092,kafka-2:9092"})
    assert s.kafka_bootstrap_servers == "kafka-1:9092,kafka-2:9092"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STREAMSTATE_KAFKA_PORTT": "1"}, "unknown setting STREAMSTATE_KAFKA_PORTT"),
        ({"STREAMSTATE_KAFKA_PORT": "nine"}, "STREAMSTATE_KAFKA_PORT='nine'"),
        ({"STREAMSTATE_AIRFLOW_PORT": "70000"}, "is not a TCP port"),
        ({"STREAMSTATE_AIRFLOW_PORT": "9092"}, "distinct ports"),
        ({"STREAMSTATE_SPARK_MASTER": "local-ish"}, "expected local[*]"),
        ({"STREAMSTATE_MAX_OFFSETS_PER_TRIGGER": "-1"}, "MAX_OFFSETS_PER_TRIGGER must be >= 0 (0: no limit)"),
        ({"STREAMSTATE_MAX_OFFSETS_PER_TRIGGER": "lots"}, "STREAMSTATE_MAX_OFFSETS_PER_TRIGGER='lots'"),
        ({"STREAMSTATE_RESTORE_IN_SPARK_MIN_RECORDS": "-1"}, "RESTORE_IN_SPARK_MIN_RECORDS must be >= 0"),
    ],
)
def test_bad_settings_are_refused_with_the_variable_named(env, message):
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert message in str(err.value)
