"""The Spark drivers' class archive (runtime/class_archive.py): set-up builds it, every driver maps it,
and without one (or when building it fails) drivers start as before."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runtime import class_archive, jvm
from runtime.settings import PROJECT_ROOT, Settings
from streamstate_cli.class_archive_training import COMMAND as TRAINING

# A driver started the way every platform driver is (spark_conf), logging where each class came from.
_DRIVER = """
import sys
from runtime.settings import Settings
from spark_jobs.driver.session import build_spark_session, spark_conf

settings = Settings.from_env()
options = spark_conf(settings)["spark.driver.extraJavaOptions"] + " -Xlog:class+load:file=" + sys.argv[1]
spark = build_spark_session(settings, "class-archive-check", {"spark.driver.extraJavaOptions": options})
spark.range(10).groupBy().count().collect()
for name in sys.argv[2:]:  # classes a restore loads later (its Kafka batch read)
    spark._jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader().loadClass(name)
print("java.home", spark._jvm.java.lang.System.getProperty("java.home"))
print("gc", "|".join(sorted(b.getName() for b in spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans())))
spark.stop()
"""
# the classes of a restore's Kafka batch read, which the training program's restore-shaped read archives
_RESTORE_CLASSES = (
    "org.apache.spark.sql.kafka010.KafkaSourceProvider",
    "org.apache.kafka.clients.consumer.KafkaConsumer",
)


@pytest.mark.integration
def test_a_driver_loads_spark_from_the_archive_set_up_built(settings, tmp_path):
    archive = class_archive.archive_path(settings)
    assert archive is not None and archive.is_file(), f"set-up (make setup) built no class archive at {archive}"
    from spark_jobs.driver.submit import application_submit_spec

    submitted = application_submit_spec(settings, "check", PROJECT_ROOT / "spark_jobs" / "driver" / "run.py", ())
    assert f"-XX:SharedArchiveFile={archive}" in submitted.conf["spark.driver.extraJavaOptions"]  # spark-submit too

    loads = tmp_path / "class-load.log"
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(loads), *_RESTORE_CLASSES],
        check=False,
        # a deployment's own driver options (a collector) come after the platform's and keep the archive mapped
        env={
            **settings.replace(spark_driver_java_options="-XX:+UseParallelGC").to_env(),
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # on the platform's JDK (runtime/jvm.py), which set-up trained the archive on, whatever PATH's java is
    platform_jdk = jvm.java_home(settings)
    if platform_jdk is not None:
        assert f"java.home {platform_jdk.resolve()}" in proc.stdout.splitlines()
    assert "gc PS MarkSweep|PS Scavenge" in proc.stdout.splitlines(), proc.stdout
    sources = {
        line.split()[1]: line.split(" source: ", 1)[1].strip()
        for line in loads.read_text().splitlines()
        if " source: " in line
    }
    # A class path or JVM that no longer matches the archive would silently load everything from jars.
    for cls in (
        "org.apache.spark.SparkContext",
        "org.apache.spark.sql.SparkSession",
        "py4j.GatewayServer",
        *_RESTORE_CLASSES,
    ):
        assert sources.get(cls) == "shared objects file (top)", f"{cls} loaded from {sources.get(cls)}"


def test_without_an_archive_drivers_get_no_sharing_options(tmp_path):
    settings = Settings(data_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    assert class_archive.driver_java_options(settings) == []


def test_set_up_builds_the_archive_once_and_survives_a_failed_build(tmp_path):
    settings = Settings(data_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    said: list[str] = []
    # no jars in this jvm_dir: the training driver cannot start; set-up says so and goes on
    assert class_archive.build(settings, TRAINING, log=said.append) is None
    assert "no class archive (drivers start without it)" in said[-1]
    assert class_archive.driver_java_options(settings) == []

    archive = class_archive.archive_path(settings)
    archive.write_bytes(b"archived classes")
    said.clear()
    assert class_archive.build(settings, TRAINING, log=said.append) == archive and said == []  # idempotent
    assert class_archive.driver_java_options(settings)[0] == f"-XX:SharedArchiveFile={archive}"
