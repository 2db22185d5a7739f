"""Session fixtures that start and stop the real services the tests need.

Every test session gets its own data directory and free ports, so it never touches the user's
``.local`` stack (or a stack someone left running). Services start lazily: a test run that only
needs Spark never starts Airflow.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

# In-process Airflow (the DagBag test) must never touch ~/airflow or the user's stack.
_OWN_AIRFLOW_HOME = None if "AIRFLOW_HOME" in os.environ else tempfile.mkdtemp(prefix="streamstate-tests-airflow-")
os.environ.setdefault("AIRFLOW_HOME", _OWN_AIRFLOW_HOME or "")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

from bench import kafka_streams_peer  # noqa: E402
from runtime.airflow_standalone import AirflowApi, LocalAirflow  # noqa: E402
from runtime.kafka_broker import LocalKafkaBroker  # noqa: E402
from runtime.postgres import LocalPostgres  # noqa: E402
from runtime.process import PORT_SLICE_ENV, free_port, free_service_ports  # noqa: E402
from runtime.settings import PROJECT_ROOT, Settings  # noqa: E402
from tests.cpu_by_process import Sampler, report_lines, tally  # noqa: E402

# `make test` runs the suite on several workers (pytest-xdist): each has a session stack of its own (broker,
# Spark session, Airflow) and chooses free ports in a slice of the range no other worker chooses from.
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ[PORT_SLICE_ENV] = f"{worker.removeprefix('gw')}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"

#: the modules whose tests run Airflow's processes: the session's (the ``airflow`` fixture) or, the last one, a
#: standalone of their own (``make run``'s). One worker takes them as one unit, the "Airflow lane" (:func:`pytest_xdist_make_scheduler`)
AIRFLOW_LANE = (
    "tests/plugins/test_jobs_page_browser.py",
    "tests/plugins/test_on_call_in_browser.py",
    "tests/plugins/test_supervise_dags.py",
    "tests/runtime/test_airflow_standalone.py",
    "tests/runtime/test_main_job_command.py",
)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def _uses_airflow(item: pytest.Item | None) -> bool:
    """Whether ``item`` runs on the session's Airflow (the ``airflow`` fixture)."""
    return "airflow" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config, items):
    """The order the tests run in, and the units of work the workers take (one module each, except the lane).

    A running Airflow (scheduler, DAG processor, triggerer, API server) keeps both cores busy while it
    is up, so the tests that run one come first, one after another in one lane, and the session's Airflow
    stops after the lane's last test that uses it (:func:`pytest_runtest_teardown`). The other modules
    follow, the integration modules before the unit tests, which fill the gaps at the end.

    A test marked ``variation(of=...)`` is skipped unless ``TEST_VARIATIONS=1``: a slower variation of a story
    another test tells (the one named), kept for the changes that touch what it varies."""
    if os.environ.get("TEST_VARIATIONS") != "1":
        for item in items:
            if (variation := item.get_closest_marker("variation")) is not None:
                told_by = variation.kwargs["of"]
                item.add_marker(pytest.mark.skip(reason=f"a variation of {told_by}; TEST_VARIATIONS=1 runs it"))
    if strays := sorted({_module(i) for i in items if _uses_airflow(i)} - set(AIRFLOW_LANE)):
        raise pytest.UsageError(f"{', '.join(strays)}: uses the airflow fixture, so it belongs in AIRFLOW_LANE")
    items.sort(
        key=lambda item: (
            _module(item) not in AIRFLOW_LANE,
            not _uses_airflow(item),
            item.get_closest_marker("integration") is None,
        )
    )


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the Airflow lane's modules as one unit: only one worker starts Airflow."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModulesAndAirflowLane(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return "airflow lane" if module in AIRFLOW_LANE else module

    return ModulesAndAirflowLane(config, log)


_session_airflow: list[LocalAirflow] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop the session's Airflow once no test after this one needs it (its fixture's own
    teardown, at the session's end, then finds it stopped)."""
    result = yield
    if _uses_airflow(item) and not _uses_airflow(nextitem):
        while _session_airflow:
            _session_airflow.pop().stop()
    return result


fresh_ports = free_service_ports

#: The JVM options of the suite's Spark drivers (its in-process sessions, spark-submit drivers and what they launch,
#: through ``Settings.to_env``): C1 only. A test's driver lives seconds to minutes, too short for C2's optimised
#: code to repay its compilation, and with both cores busy that compilation is taken from the tests: three modules
#: of spark-submit drivers took 255 and 262 s this way against 293 and 286 s with the default tiers (side by side,
#: 2026-11-29). And the serial collector: G1's concurrent threads and write barriers buy short pauses on large
#: heaps, which a test's small, short-lived heap does not need, and on two busy cores they too are taken from the
#: tests: test_purchase_counts.py and test_crash_recovery.py took 201-203 s on 115-118 CPU-s against 213-223 s on
#: 124-129 CPU-s with G1 (two rounds each, alternating, 2026-11-30). Benchmarks and ``make run`` keep the default.
TEST_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: The JVM options of a test's own broker (``private_stack``), C1 only for the same reason: a broker that lives a
#: test long (format, start, topics, 20 transactions, read back, stop) took 4.7-5.2 CPU-s against 7.0-7.7 s with the
#: default tiers, its storage format 1.0 s against 1.5 s (three lives each, alternating, 2026-11-30: issue 48's
#: notes). The session's brokers, busy for the whole run, keep the default.
PRIVATE_BROKER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
#: The tests' Kafka Streams peers too: a test-sized order_enrichment twin caught up in 3.0-3.2 s on 2.5-2.6 CPU-s
#: against 3.8-4.0 s on 4.5-4.7 CPU-s with the default tiers (alternating, 2026-11-30).
kafka_streams_peer.DEFAULT_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1",)


def stack_settings(data_dir: Path, **fields) -> Settings:
    """Settings of a test stack: ``data_dir``, free ports of this worker's slice, the suite's driver options."""
    return Settings(
        data_dir=data_dir, **{"spark_driver_java_options": TEST_DRIVER_JAVA_OPTIONS, **fresh_ports(), **fields}
    )


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    data_dir = tmp_path_factory.mktemp("stack")
    # No spare drivers under the shared stack's supervision DAGs: each would be a second Spark driver per job
    # on a 2-core machine, and the tests of restarts after kill -9 mean the restart. The spare's own tests
    # turn it on (tests/spark_jobs/test_spare_driver.py, tests/plugins/test_supervise_dags.py).
    return stack_settings(Path(data_dir), spare_drivers=False)


@pytest.fixture(scope="session")
def kafka_broker(settings: Settings):
    broker = LocalKafkaBroker(settings)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def spark(settings: Settings):
    from spark_jobs.driver.session import build_spark_session
    from spark_jobs.testing import close_spark_kafka_producers

    session = build_spark_session(settings, "streamstate-tests")
    yield session
    close_spark_kafka_producers(session)  # else they retry the stopped broker, a warning per attempt
    session.stop()


def pytest_unconfigure(config):
    if _OWN_AIRFLOW_HOME and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(_OWN_AIRFLOW_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_database(settings: Settings):
    """Airflow's metadata database as Airflow is deployed: PostgreSQL (Debian's server, runtime/postgres.py) of the
    session's own. Every DAG test runs on it; the embedded default's SQLite is what ``make run``'s own test runs
    (tests/runtime/test_main_job_command.py)."""
    home = Path(tempfile.mkdtemp(prefix="streamstate-tests-postgres-"))
    home.chmod(0o755)  # under root the server runs as the postgres user, which must reach its directory
    postgres = LocalPostgres(settings, free_port(settings.host), home=home / "postgres")
    postgres.start()
    yield postgres.url
    postgres.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db(settings: Settings, airflow_database: str) -> LocalAirflow:
    """Airflow's metadata DB and connections, without the services: enough for ``airflow dags test``
    (tasks and triggers run in that process). Tests that only run DAGs use this, not Airflow's processes
    (which keep both cores busy while they are up)."""
    local = LocalAirflow(settings, database_url=airflow_database)
    local.prepare()
    return local


@pytest.fixture(scope="session")
def dag_runner(airflow_db: LocalAirflow):
    """``airflow dags test`` with Airflow imported once for the session (tests/dag_runner.py)."""
    from tests.dag_runner import DagTestRunner

    runner = DagTestRunner(airflow_db)
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def airflow(settings: Settings, kafka_broker, airflow_db, airflow_database: str) -> AirflowApi:
    """Airflow as deployed (its API server, scheduler, DAG processor and triggerer, each a process, with the
    LocalExecutor, and what they launch) on the session's metadata DB."""
    from tests.helpers import STACK_JOB_MODULES

    # Tests trigger every run they wait for: the scheduled runs of a DAG a form unpaused would only queue
    # ahead of them (max_active_runs=1) and compete for the two cores.
    # Its DAG files do not change during a run: parsed once at the start, not again every 30 s (seven
    # files, about a second of CPU each round, taken from the drivers under test).
    local = LocalAirflow(
        settings.replace(job_modules=STACK_JOB_MODULES),
        extra_env={
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
        },
        database_url=airflow_database,
    )
    with pytest.MonkeyPatch.context() as patch:  # the job modules are importable from this checkout
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")))))
        local.start_processes()
    _session_airflow.append(local)
    yield AirflowApi(settings.airflow_url)
    local.stop()


@pytest.fixture
def private_stack(tmp_path):
    """Settings and a broker of its own, for tests that run registry jobs under their real application
    ids through spark-submit: on a shared broker they would share changelog topics (and restore each
    other's state), exactly as two deployments with one application id would."""
    own = stack_settings(tmp_path / "stack", kafka_broker_java_options=PRIVATE_BROKER_JAVA_OPTIONS)
    broker = LocalKafkaBroker(own)
    broker.start()
    yield own
    broker.stop()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic, table and job names of one test."""
    return uuid.uuid4().hex[:8]


#: a test's ``record_property`` names starting with this are the time a job took to recover from a fault
RECOVERY_PROPERTY = "recovery: "
_recoveries: list[tuple[str, str, float]] = []


#: seconds each module's tests took (setup, call and teardown), to see where the suite's time goes
_module_seconds: dict[str, float] = {}


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, from /proc/stat (Linux)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


_cpu_at_start = _cpu_jiffies()

#: every process's CPU, sampled by the run's controller (not by each xdist worker) for the report at its end
_cpu_sampler: Sampler | None = None


def pytest_configure(config):
    global _cpu_sampler
    if not os.environ.get("PYTEST_XDIST_WORKER") and Path("/proc/stat").exists():
        _cpu_sampler = Sampler().start()


def pytest_runtest_logreport(report):
    """Collect the recovery times of the fault tests and each module's time (the controller sees every
    worker's reports)."""
    module = report.nodeid.split("::")[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration
    if report.when == "call":
        for name, seconds in report.user_properties:
            if name.startswith(RECOVERY_PROPERTY):
                _recoveries.append((report.nodeid, name.removeprefix(RECOVERY_PROPERTY), seconds))


def pytest_terminal_summary(terminalreporter):
    if len(_module_seconds) > 1:
        # Whether another worker could help: a suite whose cores are busy all along gains nothing from one.
        busy, total = (now - then for now, then in zip(_cpu_jiffies(), _cpu_at_start, strict=True))
        terminalreporter.section(f"the slowest modules (test-seconds); the machine's CPUs {busy / total:.0%} busy")
        slowest = sorted(_module_seconds.items(), key=lambda pair: -pair[1])
        for module, seconds in slowest[:25]:
            terminalreporter.write_line(f"{seconds:7.0f}  {module}")
        terminalreporter.write_line(f"{sum(_module_seconds.values()):7.0f}  all {len(_module_seconds)} modules")
        if _cpu_sampler is not None:
            terminalreporter.section("where the CPU went (CPU-seconds, by kind of process: tests/cpu_by_process.py)")
            ticks = os.sysconf("SC_CLK_TCK")
            for line in report_lines(tally(_cpu_sampler.stop()), machine_busy_s=busy / ticks):
                terminalreporter.write_line(line)
    if _recoveries:
        terminalreporter.section("time to recover from each fault (seconds)")
        for test, fault, seconds in _recoveries:
            terminalreporter.write_line(f"{seconds:7.1f}  {fault}  ({test.split('::')[-1]})")
