"""kill -9 of the Airflow task process (a worker dying with its task) at seeded random moments: during
the launch of a streaming job, during a reprocessing run, and during the promotion that ends one. Then
the task runs again (what Airflow's retry or the next run does) and the platform must end with exactly
one driver per job version, the job making progress, and results equal to the reference computation.

Real stack, no mocks: a Kafka broker of the module's own, ``airflow dags test`` runs (forked by
``tests/dag_test_server.py``; each run is its own session and process group, and runs its tasks in
that process: the whole group is killed), spark-submit drivers, Delta tables read back with delta-rs.

What the design says outlives the kill (``plugins/streamstate/hooks/streaming_job.py``,
``spark_jobs/driver/lease.py``): a launched driver runs detached in its own session; the rerun must adopt it
(the lease holder, or the launch in flight in the supervision record) and never start a second one,
so the lease's epoch (incremented per acquisition) stays 1. The compare step of a reprocessing run is
a client-mode spark-submit in the task's process group: it dies with the task, and no report may be
published over incomplete diff rows. (A compare killed between its two writes leaves the killed run's
diff rows without a report; a re-run has a new run id, so they stay, unreferenced: printed with -s.)

A promotion killed after it moved the version pointer used to leave the job half-promoted (the re-run
compared the requested version with the moved pointer and found "nothing to do": the old version kept
running unsupervised and was never retired); the re-run now finishes it (``unfinished_promotion``).

Each kill is a moment the run reaches, observed from outside, plus a delay drawn from
``random.Random(FAULT_SEED)`` (default 0). Same seed, same moments; the test prints what each kill hit
(``-s``)::

    FAULT_SEED=7 .venv/bin/python -m pytest tests/faults/test_airflow_kills.py -s

Not covered here (``airflow dags test`` has no scheduler): a real scheduler's zombie detection, which
would mark the killed task failed and run the ``all_done`` audit task of the killed reprocessing run;
here the killed run simply leaves no audit row, and the rerun is a new DAG run, not a new try of the
same task instance (the operators key nothing on the try, so the difference does not matter to them).
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import time
from decimal import Decimal

import pytest
from streamstate.hooks.streaming_job import StreamingJobHook
from streamstate.supervision import read_record

from runtime.kafka_broker import LocalKafkaBroker
from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import observe_driver, read_status
from spark_jobs.io.kafka_topics import ensure_topic, partition_offsets
from spark_jobs.layout import JobLayout
from spark_jobs.operations.reprocess.audit import audit_rows
from spark_jobs.operations.reprocess.compare import diffs_table, reports_table
from spark_jobs.reference.generators.purchases import produce
from spark_jobs.registry import get_job
from spark_jobs.state.checkpoint_offsets import committed_input_offsets
from spark_jobs.state.source_position import committed_source_offsets
from spark_jobs.versions import JobVersions, current_output_path, read_rows
from tests.conftest import stack_settings
from tests.fixtures.reprocess_jobs import gift_card_input
from tests.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]

SEED = int(os.environ.get("FAULT_SEED", "0"))
_rng = random.Random(SEED)
# Each kill: a moment the run reaches (observed from outside: the supervision record, the lease, the
# processes), then a seeded delay shorter than what follows it takes even on an idle machine, so the
# kill lands while the run still works; a busy machine only stretches the phases. Measured on an idle
# 2-core machine, and on one shared with other test runs (in brackets):
#: the launch (start_streaming_job): recorded ~1 s after the run's process starts, the driver takes the
#: lease ~2 s later, restores ~5 s after that, and the task returns ~1 s later [about 1.5x slower]
LAUNCH_KILL = _rng.choice([("run started", 0.0, 0.6), ("launch recorded", 0.0, 1.5), ("lease taken", 0.0, 4.0)])
LAUNCH_KILL_S = _rng.uniform(*LAUNCH_KILL[1:])
#: a reprocessing run (reprocess_job side_by_side): the new version's driver takes its lease ~2.5 s after
#: its launch is recorded, catches up ~16 s later [~32 s], then the compare application (a client-mode
#: spark-submit) runs for ~17 s [~39 s]
REPROCESS_KILL = _rng.choice(
    [("new version launch recorded", 0.0, 2.0), ("new version lease taken", 0.0, 8.0), ("compare started", 0.0, 10.0)]
)
REPROCESS_KILL_S = _rng.uniform(*REPROCESS_KILL[1:])
#: the promotion (promote_job_version): after the pointer moved, start_new waits ~6 s for the new
#: version's driver before stop_old runs
PROMOTE_KILL_S = _rng.uniform(0.0, 2.0)

JOB_MODULES = "tests.fixtures.reprocess_jobs"
JOB = "gift_card_counts"  # v1 counts gift cards twice, v2 is the fix (tests/fixtures/reprocess_jobs.py)


# ----- the stack ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Settings and a broker of the module's own: the drivers run under the fixture jobs' real
    application ids, whose status files, checkpoints and topics must not meet other tests'."""
    own = stack_settings(tmp_path_factory.mktemp("airflow-kills"))
    broker = LocalKafkaBroker(own)
    broker.start()
    yield own
    broker.stop()


@pytest.fixture(scope="module")
def fixture_jobs():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STREAMSTATE_JOB_MODULES", JOB_MODULES)
        yield


def _proc_table() -> dict[int, tuple[int, list[bytes], list[bytes]]]:
    """pid -> (parent pid, command line, environment) of every live process (zombies have no environment)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        table[int(entry)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmd, env)
    return table


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


class Stack:
    """The processes the module's DAG runs started on its stack, found by their environment."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._marker = f"STREAMSTATE_DATA_DIR={settings.data_dir}".encode()

    def processes(self) -> dict[int, list[bytes]]:
        return {pid: cmd for pid, (_, cmd, env) in _proc_table().items() if self._marker in env}

    def drivers(self, spec) -> set[int]:
        """Python drivers of ``spec`` (the processes that take the lease)."""
        tail = [spec.name.encode(), b"--version", str(spec.version).encode()]
        return {
            pid
            for pid, cmd in self.processes().items()
            if b"java" not in cmd[0]
            and any(
                part.endswith(b"spark_jobs/driver/run.py") and cmd[i + 1 : i + 4] == tail for i, part in enumerate(cmd)
            )
        }

    def submits(self, spec) -> set[int]:
        """spark-submit JVMs of ``spec`` (one per launched driver, however far it got)."""
        tail = [spec.name.encode(), b"--version", str(spec.version).encode()]
        return {
            pid
            for pid, cmd in self.processes().items()
            if cmd[0].endswith(b"java")
            and b"org.apache.spark.deploy.SparkSubmit" in cmd
            and any(cmd[i : i + 3] == tail for i in range(len(cmd)))
        }

    def launched(self, spec) -> set[int]:
        """Every process of a launch of ``spec``, however far it got (shell wrapper, spark-submit script,
        JVM, Python driver)."""
        args = f"{spec.name} --version {spec.version}".encode()
        return {pid for pid, cmd in self.processes().items() if args in b" ".join(cmd)}

    def compares(self) -> set[int]:
        """Processes of the reprocessing's compare application (spark-submit JVM and its Python)."""
        return {
            pid for pid, cmd in self.processes().items() if any(part.endswith(b"reprocess/compare.py") for part in cmd)
        }


class DagRuns:
    """``airflow dags test`` runs against the module's stack, one at a time; one can be killed."""

    def __init__(self, runner, settings: Settings) -> None:
        self.runner = runner
        self.env = {**settings.to_env(), "STREAMSTATE_JOB_MODULES": JOB_MODULES, "PYTHONPATH": str(PROJECT_ROOT)}

    def run(self, dag_id: str, conf: dict):
        control = dag_id.endswith("_streaming_job")
        dag_file = PROJECT_ROOT / "dags" / ("control_jobs.py" if control else "reprocess_jobs.py")
        return self.runner.dags_test(dag_id, conf, env=self.env, dag_file=dag_file, timeout_s=600)

    def _run_process(self) -> int | None:
        """The forked ``airflow dags test`` of the run in flight: the server's grandchild that made
        itself a session (and process group) leader. In ``dags test`` it runs the tasks in process,
        and the client-mode spark-submits of its tasks are in its process group. (The runner's server
        pid is private to tests/dag_runner.py; nothing else tells which process is the run.)"""
        table = _proc_table()
        server = self.runner._server.pid
        forks = [pid for pid, (ppid, _, _) in table.items() if ppid == server]
        runs = [pid for pid, (ppid, _, _) in table.items() if ppid in forks and _session(pid) == pid]
        assert len(runs) <= 1, f"more than one DAG run in flight: {runs}"
        return runs[0] if runs else None

    def run_and_kill(self, dag_id: str, conf: dict, *, start, delay_s: float, observe) -> str:
        """Run the DAG; once ``start()`` holds, wait ``delay_s`` and kill -9 the run's whole process
        group (the task process and what it started in its group). Returns ``observe()``'s view of the
        moment of the kill (taken just before it)."""
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(self.run, dag_id, conf)
            pid = wait_for(lambda: future.done() or self._run_process(), 60, f"the {dag_id} run's process")
            give_up = time.monotonic() + 300
            while not future.done() and not start():
                assert time.monotonic() < give_up, f"{dag_id}: the kill's moment never came"
                time.sleep(0.1)
            deadline = time.monotonic() + delay_s
            while time.monotonic() < deadline and not future.done():
                time.sleep(0.05)
            assert not future.done(), (
                f"{dag_id} ended before the kill (exit {future.result().returncode}): {future.result().stdout[-3000:]}"
            )
            seen = observe()
            os.killpg(pid, signal.SIGKILL)
            result = future.result()
        assert result.returncode == -signal.SIGKILL, f"the run was not killed: exit {result.returncode}"
        return seen


@pytest.fixture(scope="module")
def dags(dag_runner, stack, fixture_jobs):
    """DAG runs on the module's stack. Afterwards kills whatever drivers are left (they are detached:
    nothing else would), by pid: only the processes of this module's stack."""
    yield DagRuns(dag_runner, stack)
    for pid, cmd in Stack(stack).processes().items():
        if b"spark" not in b" ".join(cmd).lower():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def procs(stack) -> Stack:
    return Stack(stack)


def _ok(result) -> None:
    assert result.returncode == 0, f"DAG run failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"


def _counts(path: str) -> dict[str, tuple[int, Decimal]]:
    return {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in read_rows(path)}


def _end(settings: Settings, topic: str) -> dict[int, int]:
    return {p: high for p, (_low, high) in partition_offsets(settings.kafka, topic).items()}


def _caught_up(settings: Settings, spec) -> None:
    end = _end(settings, spec.source_topic)
    wait_for(
        lambda: committed_input_offsets(settings.checkpoints / spec.application_id, spec.source_topic) == end,
        240,
        f"{spec.application_id} to commit {end}",
    )


@pytest.fixture(scope="module")
def gift_cards(stack, fixture_jobs):
    """The input (some gift-card purchases, which v1 counts twice) and the reference counts; v1 is the
    current version, as after its deployment."""
    v1 = get_job(JOB, 1)
    events, correct, buggy, changed = gift_card_input(300, users=25, seed=41, every=7)
    ensure_topic(stack.kafka, v1.source_topic, v1.source_partitions)
    produce(stack.kafka, v1.source_topic, events)
    JobVersions(stack).promote(JOB, 1, by="test: v1 was deployed first")
    return {"correct": correct, "buggy": buggy, "changed": changed}


# ----- 1. the launch --------------------------------------------------------------------------------
def _launch_phase(settings: Settings, procs: Stack, spec, launches_before: int) -> str:
    """What the killed launch task had done, from the supervision record, the processes and the lease."""
    record = read_record(settings.status_dir, spec.application_id)
    recorded = len(record.launches) > launches_before
    started = procs.launched(spec)
    holder = JobLease(settings.status_dir, spec.application_id).holder()
    if not recorded:
        return "spark-submit started, launch not recorded yet" if started else "before the launch (nothing started)"
    if holder is None:
        return "launch recorded, driver starting (before the lease)"
    driver = observe_driver(settings.status_dir, spec.application_id)
    if not driver.alive:
        return "driver holds the lease, no status yet"
    return f"driver holds the lease, {driver.state.lower()} (task waiting for RUNNING)"


def test_launch_killed_mid_way_the_rerun_adopts_the_driver_never_a_second(stack, dags, procs, gift_cards):
    spec = get_job(JOB, 1)
    app = spec.application_id
    lease = JobLease(stack.status_dir, app)
    assert lease.last_epoch() == 0 and not procs.launched(spec)  # nothing ran before: the epochs count from here
    before = len(read_record(stack.status_dir, app).launches)

    started = time.monotonic()
    moment = {
        "run started": lambda: True,
        "launch recorded": lambda: len(read_record(stack.status_dir, app).launches) > before,
        "lease taken": lambda: lease.holder() is not None,
    }[LAUNCH_KILL[0]]
    phase = dags.run_and_kill(
        "start_streaming_job",
        {"job": JOB},
        start=moment,
        delay_s=LAUNCH_KILL_S,
        observe=lambda: _launch_phase(stack, procs, spec, before),
    )
    print(f"\nseed {SEED}: launch task killed {LAUNCH_KILL_S:.1f} s after '{LAUNCH_KILL[0]}': {phase}")

    # Airflow's retry of the task (a new try of start_streaming_job).
    rerun = dags.run("start_streaming_job", {"job": JOB})
    _ok(rerun)
    log = rerun.stdout + rerun.stderr
    adopted = "already runs" in log or "is in flight" in log  # found its driver, or waited for its launch
    print(
        "  the rerun "
        + (
            "found the killed task's driver running"
            if "already runs" in log
            else "waited for the killed task's launch in flight"
            if adopted
            else "launched a driver"
        )
    )
    if phase.startswith(("launch recorded", "driver holds the lease")):  # the detached driver outlived the task
        assert adopted, f"the rerun started another driver beside the killed task's:\n{log[-4000:]}"

    # Whatever the moment: one driver, started once. A straggler (a spark-submit the killed task started
    # before it recorded the launch) finds the lease taken and exits with code 3.
    wait_for(
        lambda: len(procs.drivers(spec)) == 1 and len(procs.submits(spec)) == 1,
        120,
        "exactly one driver and one spark-submit of the job",
        lambda: f"drivers {procs.drivers(spec)}, spark-submits {procs.submits(spec)}",
    )
    holder = lease.holder()
    assert holder is not None and procs.drivers(spec) == {holder.pid}
    assert holder.epoch == 1, f"the lease was acquired {holder.epoch} times: a second driver ran"

    _caught_up(stack, spec)  # progress: batches committed up to the input end ...
    status = wait_for(
        lambda: (s := read_status(stack.status_dir, app)) and s.batch_id is not None and s,
        60,
        "the driver to publish its batch",
    )  # ... and published by the driver
    assert status.state == "RUNNING" and status.lease_epoch == 1
    assert _counts(current_output_path(stack, JOB)) == gift_cards["buggy"]  # v1's counts, nothing counted twice
    assert lease.holder().epoch == 1 and procs.drivers(spec) == {holder.pid}  # still that one driver

    # The record: no failed start; one started driver at most; a start that found the lease taken (exit 3)
    # only when the killed task's spark-submit was not recorded yet (the rerun could not know about it).
    launches = read_record(stack.status_dir, app).launches[before:]
    allowed = {None, "running"} | ({"already_running"} if phase.startswith("spark-submit started") else set())
    assert launches and all(launch.outcome in allowed for launch in launches), launches
    assert sum(launch.outcome == "running" for launch in launches) <= 1, launches
    assert all(launch.epoch in (None, 1) for launch in launches), launches

    # The adopted driver is under control: the stop DAG stops it cleanly, and nothing is left running.
    _ok(dags.run("stop_streaming_job", {"job": JOB, "reason": "test: airflow kills"}))
    assert lease.holder() is None
    assert read_status(stack.status_dir, app).state == "NOT_RUNNING"  # a clean stop, not a kill
    wait_for(
        lambda: not procs.drivers(spec) and not procs.submits(spec),
        60,
        "the driver's processes to exit",
        lambda: f"drivers {procs.drivers(spec)}, spark-submits {procs.submits(spec)}",
    )
    print(f"  {time.monotonic() - started:.0f} s from the killed launch to the clean stop")


# ----- 2. a reprocessing run --------------------------------------------------------------------------
def _v1_has_processed_everything(stack, dags, procs) -> None:
    """(When run on its own:) v1 runs over the whole input once and stops, as the launch test leaves it."""
    v1 = get_job(JOB, 1)
    checkpoint = stack.checkpoints / v1.application_id
    if committed_input_offsets(checkpoint, v1.source_topic) != _end(stack, v1.source_topic):
        _ok(dags.run("start_streaming_job", {"job": JOB}))
        _caught_up(stack, v1)
    if JobLease(stack.status_dir, v1.application_id).holder() is not None:
        _ok(dags.run("stop_streaming_job", {"job": JOB, "reason": "test: v1 done"}))
    wait_for(lambda: not procs.drivers(v1) and not procs.submits(v1), 60, "v1's processes to exit")


def _reprocess_phase(settings: Settings, procs: Stack, v2) -> str:
    if procs.compares():
        return "compare application running"
    holder = JobLease(settings.status_dir, v2.application_id).holder()
    if holder is None:
        return "new version's driver starting (before the lease)"
    committed = (committed_source_offsets(JobLayout.of(v2, settings), settings.kafka) or {}).get(v2.source_topic)
    if committed != _end(settings, v2.source_topic):
        return f"new version running, catching up (committed {committed})"
    return "new version caught up, compare not started yet"


def test_reprocessing_killed_mid_run_the_rerun_resumes_to_the_reference(stack, dags, procs, gift_cards):
    v1, v2 = get_job(JOB, 1), get_job(JOB, 2)
    _v1_has_processed_everything(stack, dags, procs)
    assert _counts(current_output_path(stack, JOB)) == gift_cards["buggy"]
    v2_lease = JobLease(stack.status_dir, v2.application_id)
    assert v2_lease.last_epoch() == 0
    conf = {"job": JOB, "mode": "side_by_side", "dry_run": False}

    started = time.monotonic()
    killed_at = time.time()
    moment = {
        "new version launch recorded": lambda: read_record(stack.status_dir, v2.application_id).launches,
        "new version lease taken": lambda: v2_lease.holder() is not None,
        "compare started": lambda: procs.compares(),
    }[REPROCESS_KILL[0]]
    phase = dags.run_and_kill(
        "reprocess_job",
        conf,
        start=moment,
        delay_s=REPROCESS_KILL_S,
        observe=lambda: _reprocess_phase(stack, procs, v2),
    )
    print(f"\nseed {SEED}: reprocessing task killed {REPROCESS_KILL_S:.1f} s after '{REPROCESS_KILL[0]}': {phase}")
    # The compare application ran in the task's process group: it died with it (no orphan writing a report).
    wait_for(
        lambda: not procs.compares(),
        30,
        "the killed run's compare application to be gone",
        lambda: f"compare processes {procs.compares()}",
    )
    assert JobVersions(stack).current(JOB) == 1  # reprocessing never moves the readers

    rerun = dags.run("reprocess_job", conf)  # the re-run (the DAG has no retries: a re-run is the retry)
    _ok(rerun)

    # The result: a report equal to what an uninterrupted run gives, from v2 counting exactly the reference.
    correct, changed = gift_cards["correct"], gift_cards["changed"]
    assert _counts(str(stack.lake / v2.output_table_dir)) == correct
    assert _counts(current_output_path(stack, JOB)) == gift_cards["buggy"]  # v1's output untouched
    reports = sorted((r for r in read_rows(reports_table(stack)) if r["job"] == JOB), key=lambda r: r["created_at"])
    assert 1 <= len(reports) <= 2, reports  # the rerun's, and the killed run's if its compare had committed
    for report in reports:
        assert (report["old_version"], report["new_version"], report["aligned"]) == (1, 2, True), report
        assert (report["different"], report["only_old"], report["only_new"]) == (len(changed), 0, 0), report
        assert report["equal"] == len(correct) - len(changed), report
    final = reports[-1]
    diffs = read_rows(diffs_table(stack))
    assert {r["key"] for r in diffs if r["run_id"] == final["run_id"]} == {f'{{"user_id":"{u}"}}' for u in changed}
    for report in reports:  # a report is never published over incomplete diff rows
        rows = sum(r["run_id"] == report["run_id"] for r in diffs)
        assert rows == report["different"] + report["only_old"] + report["only_new"], report
    orphans = {r["run_id"] for r in diffs} - {r["run_id"] for r in reports}
    if orphans:  # the killed compare wrote its diff rows, not its report: unreferenced, kept (see the module doc)
        print(f"  diff rows without a report (the killed run's): {sorted(orphans)}")
    audit = [r for r in audit_rows(stack) if r["job"] == JOB and r["dag_id"] == "reprocess_job"]
    assert [r["outcome"] for r in audit if r["run_id"] == final["run_id"]] == ["succeeded"]

    # Never two instances, never half-promoted: one v2 driver, started once; v1 not restarted; readers on v1.
    holder = v2_lease.holder()
    assert holder is not None and holder.epoch == 1, f"v2's lease: {holder}"
    assert procs.drivers(v2) == {holder.pid} and len(procs.submits(v2)) == 1
    assert not procs.drivers(v1) and JobLease(stack.status_dir, v1.application_id).holder() is None
    assert JobVersions(stack).current(JOB) == 1
    launches = [item for item in read_record(stack.status_dir, v2.application_id).launches if item.at >= killed_at]
    assert sum(launch.outcome == "running" for launch in launches) <= 1, launches
    # no failed start, and no second spark-submit that found the lease taken (the rerun adopted the driver)
    assert all(launch.outcome in (None, "running") for launch in launches), launches

    # Stop v2 cleanly (the stop DAG stops the current version; this is the same SIGTERM it sends).
    assert StreamingJobHook(v2, stack).stop() is not None
    wait_for(lambda: v2_lease.holder() is None, 120, "v2 to stop")
    assert read_status(stack.status_dir, v2.application_id).state == "NOT_RUNNING"
    wait_for(lambda: not procs.drivers(v2) and not procs.submits(v2), 60, "v2's processes to exit")
    print(f"  {time.monotonic() - started:.0f} s from the killed run to the clean stop")


# ----- 3. the promotion that ends a reprocessing ------------------------------------------------------
def _promote_phase(settings: Settings, procs: Stack, v1, v2) -> str:
    old = "v1 running" if JobLease(settings.status_dir, v1.application_id).holder() else "v1 stopped"
    new = (
        "v2 running"
        if JobLease(settings.status_dir, v2.application_id).holder()
        else ("v2 starting" if procs.submits(v2) else "v2 not started")
    )
    retired = [e.version for e in JobVersions(settings).retired(JOB)]
    return f"pointer on v2, {new}, {old}, retired {retired or 'none'}"


class HalfPromoted(AssertionError):
    """The promotion re-run left the old version running or not retired."""


def test_promotion_killed_after_the_switch_the_rerun_stops_and_retires_the_old_version(stack, dags, procs, gift_cards):
    v1, v2 = get_job(JOB, 1), get_job(JOB, 2)
    versions = JobVersions(stack)
    assert versions.current(JOB) == 1
    if committed_input_offsets(stack.checkpoints / v2.application_id, v2.source_topic) is None:  # (run on its own)
        _ok(dags.run("reprocess_job", {"job": JOB, "mode": "side_by_side", "dry_run": False}))
    v1_lease, v2_lease = JobLease(stack.status_dir, v1.application_id), JobLease(stack.status_dir, v2.application_id)
    if StreamingJobHook(v2, stack).stop() is not None:  # (run on its own) v2 stopped, as test 2 leaves it
        wait_for(lambda: v2_lease.holder() is None, 120, "v2 to stop")
    if v1_lease.holder() is None:
        _ok(dags.run("start_streaming_job", {"job": JOB}))  # the old version serves readers until the promotion
    v2_epoch = v2_lease.last_epoch()
    conf = {"job": JOB, "version": 2, "dry_run": False, "confirm": JOB, "retain_days": 7}
    try:
        phase = dags.run_and_kill(
            "promote_job_version",
            conf,
            start=lambda: versions.current(JOB) == 2,
            delay_s=PROMOTE_KILL_S,
            observe=lambda: _promote_phase(stack, procs, v1, v2),
        )
        print(f"\nseed {SEED}: promotion killed {PROMOTE_KILL_S:.1f} s after the pointer moved: {phase}")
        rerun = dags.run("promote_job_version", conf)  # the re-run (no retries: a re-run is the retry)
        _ok(rerun)

        assert versions.current(JOB) == 2
        wait_for(lambda: v2_lease.holder(), 120, "v2 to run")
        assert v2_lease.holder().epoch == v2_epoch + 1 and len(procs.drivers(v2)) == 1  # one v2, started once
        # The promotion is complete: the old version stopped (stop_old waits for that), kept stopped, and
        # retired (so it is purged after its retention).
        said = next(
            (
                line.split("[airflow", 1)[0].strip()
                for line in (rerun.stdout + rerun.stderr).splitlines()
                if "audit:" in line
            ),
            "?",
        )
        old = v1_lease.holder()
        desired = read_record(stack.status_dir, v1.application_id).desired
        retired = [event.version for event in versions.retired(JOB)]
        if old is not None or desired != "stopped" or retired != [1]:
            raise HalfPromoted(
                f"after the re-run ({said}): v1 {'runs, pid ' + str(old.pid) if old else 'stopped'}, "
                f"desired {desired!r}, retired versions {retired}"
            )
    finally:  # leave nothing running: the stop DAG stops the current version, the hook the old one
        if v2_lease.holder() is not None and versions.current(JOB) == 2:
            _ok(dags.run("stop_streaming_job", {"job": JOB, "reason": "test: airflow kills"}))
        for spec in (v1, v2):
            if StreamingJobHook(spec, stack).stop() is not None:
                wait_for(
                    lambda spec=spec: JobLease(stack.status_dir, spec.application_id).holder() is None,
                    120,
                    f"{spec.application_id} to stop",
                )
        wait_for(lambda: not procs.drivers(v1) and not procs.drivers(v2), 60, "the drivers' processes to exit")
