"""Unit tests of jar-name parsing, which decides what set-up keeps beside pyspark's own jars, and of the
choice of the JDK every JVM of the platform runs on."""

import shutil

import pytest

from runtime import jvm
from runtime.jvm import JvmDependencyError, artifact_name
from runtime.settings import Settings, SettingsError


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
    from runtime.settings import PROJECT_ROOT

    team_jar = tmp_path / "team-udfs-1.0.jar"
    team_jar.write_bytes(b"PK")  # the platform checks that it exists; Spark reads it
    settings = Settings(data_dir=tmp_path, jvm_dir=PROJECT_ROOT / ".jvm", extra_jars=f" {team_jar} ")
    assert spark_jars(settings)[-1] == team_jar and len(spark_jars(settings)) > 1
    with pytest.raises(JvmDependencyError, match="STREAMSTATE_EXTRA_JARS names jars that do not exist: /no/such.jar"):
        spark_jars(settings.replace(extra_jars=f"{team_jar},/no/such.jar"))


def _fake_jdk(root, name, version):
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\n")
    (home / "release").write_text(f'IMPLEMENTOR="test"\nJAVA_VERSION="{version}"\n')
    return home


@pytest.fixture
def jdks(tmp_path, monkeypatch):
    """A /usr/lib/jvm of fake JDKs, and no JAVA_HOME."""
    root = tmp_path / "jvm"
    monkeypatch.setattr(jvm, "JDK_DIRS", (root,))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    _fake_jdk(root, "java-11-openjdk", "11.0.20")
    _fake_jdk(root, "java-17-openjdk", "17.0.15")
    (root / "java-1.17.0-openjdk").symlink_to(root / "java-17-openjdk")  # Debian's alias
    (root / "openjdk-17").mkdir()  # Debian's directory of shared files: no JDK
    return root


def test_the_platform_runs_the_newest_jdk_spark_supports(jdks):
    settings = Settings(data_dir=jdks)
    assert jvm.java_home(settings) == jdks / "java-17-openjdk"
    _fake_jdk(jdks, "temurin-25-jdk", "25.0.2")  # Spark 4.2 supports 25 from 25.0.3
    _fake_jdk(jdks, "jdk-26", "26")  # nor any Java it does not list
    assert jvm.java_home(settings) == jdks / "java-17-openjdk"
    _fake_jdk(jdks, "java-21-openjdk", "21")
    assert jvm.java_home(settings) == jdks / "java-21-openjdk"
    _fake_jdk(jdks, "temurin-25-jdk-amd64", "25.0.3")
    assert jvm.java_home(settings) == jdks / "temurin-25-jdk-amd64"
    assert jvm.java_binary(settings) == str(jdks / "temurin-25-jdk-amd64" / "bin" / "java")
    assert jvm.java_env(settings) == {"JAVA_HOME": str(jdks / "temurin-25-jdk-amd64")}


def test_java_home_and_the_setting_choose_over_what_is_installed(jdks, monkeypatch):
    _fake_jdk(jdks, "temurin-25-jdk", "25.0.3")
    monkeypatch.setenv("JAVA_HOME", str(jdks / "java-17-openjdk"))  # as Spark's own launcher
    assert jvm.java_home(Settings(data_dir=jdks)) == jdks / "java-17-openjdk"
    chosen = Settings.from_env({"STREAMSTATE_JAVA_HOME": str(jdks / "java-11-openjdk")})
    assert jvm.java_home(chosen) == jdks / "java-11-openjdk"


def test_without_a_jdk_java_on_the_path_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(jvm, "JDK_DIRS", (tmp_path / "none",))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    settings = Settings(data_dir=tmp_path)
    assert jvm.java_home(settings) is None and jvm.java_env(settings) == {}
    assert jvm.java_binary(settings) == (shutil.which("java") or "java")


def test_a_java_home_setting_without_java_is_refused(tmp_path):
    with pytest.raises(SettingsError, match="STREAMSTATE_JAVA_HOME=.*no bin/java"):
        Settings.from_env({"STREAMSTATE_JAVA_HOME": str(tmp_path)})
