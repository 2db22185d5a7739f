"""Unit tests of jar-name parsing, which decides what set-up keeps beside pyspark's own jars."""

import pytest

from runtime.jvm import JvmDependencyError, artifact_name


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
        ("zstd-jni-1.5.7-3.jar", "zstd-jni"),
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("spark-token-provider-kafka-0-10_2.13-4.0.0.jar", "spark-token-provider-kafka-0-10_2.13"),
        ("delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_4.2_2.13"),
        ("kafka_2.13-4.3.1.jar", "kafka_2.13"),
        ("commons-pool2-2.13.1.jar", "commons-pool2"),
        ("jsr305-3.0.0.jar", "jsr305"),
        ("jackson-annotations-2.21.jar", "jackson-annotations"),
    ],
)
def test_artifact_name(jar, artifact):
    assert artifact_name(jar) == artifact


def test_unversioned_jar_is_an_error():
    with pytest.raises(JvmDependencyError, match="cannot tell the artifact"):
        artifact_name("something.jar")


def test_extra_jars_join_every_spark_application(tmp_path):
    from runtime.jvm import spark_jars
    from runtime.settings import PROJECT_ROOT, Settings

    team_jar = tmp_path / "team-udfs-1.0.jar"
    team_jar.write_bytes(b"PK")  # the platform checks that it exists; Spark reads it
    settings = Settings(data_dir=tmp_path, jvm_dir=PROJECT_ROOT / ".jvm", extra_jars=f" {team_jar} ")
    assert spark_jars(settings)[-1] == team_jar and len(spark_jars(settings)) > 1
    with pytest.raises(JvmDependencyError, match="STREAMSTATE_EXTRA_JARS names jars that do not exist: /no/such.jar"):
        spark_jars(settings.replace(extra_jars=f"{team_jar},/no/such.jar"))
