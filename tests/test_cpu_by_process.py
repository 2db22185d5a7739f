"""The suite's CPU report (tests/cpu_by_process.py): which kind each process is, the sums, and the sampler over a
``/proc`` made here."""

from __future__ import annotations

import os

import pytest

from tests.cpu_by_process import Sampler, Seen, kind_of, report_lines, tally

JARS = "-cp /repo/.venv/lib/python3.11/site-packages/pyspark/jars/spark-core_2.13-4.0.1.jar"


@pytest.mark.parametrize(
    ("command_line", "kind"),
    [
        (f"/usr/lib/jvm/java-17/bin/java {JARS} org.apache.spark.deploy.SparkSubmit pyspark-shell", "in-process"),
        (
            f"/usr/lib/jvm/java-17/bin/java {JARS} org.apache.spark.deploy.SparkSubmit --py-files x.zip "
            "/repo/spark_jobs/driver/run.py purchase_counts --version 3",
            "spark-submit drivers",
        ),
        ("bash /repo/.venv/bin/spark-class org.apache.spark.deploy.SparkSubmit /repo/spark_jobs/x.py", "spark-submit"),
        (f"java {JARS} org.apache.spark.deploy.worker.Worker spark://127.0.0.1:7077", "standalone"),
        (f"java {JARS} org.apache.spark.executor.CoarseGrainedExecutorBackend --executor-id 0", "standalone"),
        ("java -Xmx768m -cp /repo/.jvm/kafka-broker/kafka.jar kafka.Kafka /tmp/server.properties", "Kafka brokers"),
        ("java -cp /repo/bench/kafka_streams/target/twin.jar BenchApp", "Kafka Streams peers"),
        ("/usr/lib/chromium/chromium --type=renderer --headless=new", "Chromium"),
        ("/repo/.venv/bin/python /repo/.venv/bin/airflow scheduler", "Airflow: services"),
        ("airflow api_server -- host:127.0.0.1 port:29969", "Airflow: services"),
        ("/repo/.venv/bin/python /repo/spark_jobs/driver/run.py purchase_counts --version 3", "drivers'"),
        ("/repo/.venv/bin/python -m spark_jobs.operations.standby purchase_counts --version 1", "drivers'"),
        ("[pytest-xdist running] tests/plugins/test_supervise_dags.py::test_x", "pytest workers"),
        ("postgres: 127.0.0.1 airflow idle", "PostgreSQL"),
        ("", "other"),
    ],
)
def test_each_process_is_named_by_its_first_matching_rule(command_line, kind):
    assert kind in kind_of(command_line)


def test_the_tally_sums_by_kind_most_cpu_first_and_the_report_says_what_it_saw():
    totals = tally(
        [Seen("java kafka.Kafka a", 10.0), Seen("chromium", 1.5), Seen("java kafka.Kafka b", 5.0), Seen("", 0.5)]
    )
    assert totals == {"Kafka brokers": (15.0, 2), "Chromium": (1.5, 1), "other": (0.5, 1)}
    lines = report_lines(totals, machine_busy_s=20.0)
    assert lines[0].split() == ["15", "88%", "Kafka", "brokers", "(2)"]
    assert lines[-1].split()[0] == "17" and "of the machine's 20 busy" in lines[-1]


def _process(proc, pid: int, command: bytes, utime: int, stime: int, start: int = 7) -> None:
    """A ``/proc/<pid>`` whose stat has a command name with a space and a parenthesis, as the kernel allows."""
    (proc / str(pid)).mkdir(exist_ok=True)
    rest = ["S", "1"] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 6 + [str(start), "0"]
    (proc / str(pid) / "stat").write_text(f"{pid} (a (weird) name) " + " ".join(rest) + "\n")
    (proc / str(pid) / "cmdline").write_bytes(command)


def test_the_sampler_keeps_each_process_at_its_last_sample_and_its_last_command(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")
    _process(tmp_path, 10, b"bash\0spark-class\0org.apache.spark.deploy.SparkSubmit\0", utime=ticks, stime=0)
    _process(tmp_path, 11, b"chromium\0--headless=new\0", utime=ticks, stime=ticks)
    (tmp_path / "self").mkdir()  # not a pid: skipped
    sampler = Sampler(proc=tmp_path)
    sampler._sample()
    # pid 10 execs java and works on; pid 11 exits (its cmdline reads empty); pid 12 is new; pid 10's number is
    # reused by a process started later: another process
    _process(tmp_path, 10, b"java\0org.apache.spark.deploy.SparkSubmit\0/r/spark_jobs/driver/run.py\0", 4 * ticks, 0)
    _process(tmp_path, 11, b"", utime=2 * ticks, stime=ticks)
    _process(tmp_path, 12, b"java\0kafka.Kafka\0", utime=ticks, stime=0, start=9)
    sampler._sample()
    _process(tmp_path, 10, b"postgres: idle\0", utime=ticks, stime=0, start=99)
    seen = sorted((s.command_line, s.cpu_s) for s in sampler.stop())
    assert seen == [
        ("chromium --headless=new", 3.0),
        ("java kafka.Kafka", 1.0),
        ("java org.apache.spark.deploy.SparkSubmit /r/spark_jobs/driver/run.py", 4.0),
        ("postgres: idle", 1.0),
    ]


def test_the_sampler_reads_this_machine(tmp_path):
    """On Linux: this process is among those it sees, with the CPU it used so far."""
    if not os.path.exists("/proc/self/stat"):
        pytest.skip("no /proc here")
    seen = Sampler().stop()
    assert any("pytest" in s.command_line and s.cpu_s > 0 for s in seen)
