"""A snapshot write killed half-way (kill -9 while its Parquet files are being written): the table
still shows the last complete snapshot, the next restore uses it plus the changelog tail and equals
the reference, and the next snapshot commits over the debris (real Kafka, real Delta, no Spark).

Delta's commit is the atomic step: data files land first, then one ``_delta_log`` entry. A write that
dies before that entry leaves only unreferenced files, which readers never see and VACUUM removes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter
from spark_jobs.state.restore import SilentRestoreListener, restore_from_snapshot
from spark_jobs.state.snapshots import SnapshotStore
from spark_jobs.state.snapshotting import take_snapshot
from tests.helpers import write_changelog_batch

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# A child that writes a big snapshot for batch 99: 3 million keys in files of 256 KiB, so that the
# data files land one after another over a second or more before the commit.
BIG_WRITE = """
import sys
from spark_jobs.state.snapshots import SnapshotStore
store = SnapshotStore(sys.argv[1], "app", "store", file_size_bytes=256 * 1024)
state = {b"k%08d" % i: b"v" for i in range(3_000_000)}
print("writing", flush=True)
store.write(state, 99, {"in": {0: 99}}, {0: 10**6, 1: 10**6})
print("committed", flush=True)
"""


def _data_files(path: Path) -> set[str]:
    return {p.name for p in path.glob("*.parquet")}


def test_a_snapshot_write_killed_half_way_is_never_restored(kafka_broker, settings, unique, tmp_path):
    bootstrap = settings.kafka_bootstrap_servers
    topic = ChangelogTopic(f"interrupted-{unique}", "store", partitions=2)
    topic.ensure(bootstrap)
    writer = ChangelogWriter(topic, bootstrap)
    path = tmp_path / "snapshot"
    snapshots = SnapshotStore(path, "app", "store")
    reference: dict[bytes, bytes] = {}

    def batch(batch_id: int, changes: dict[bytes, bytes | None]) -> None:
        write_changelog_batch(writer, batch_id, changes)
        for key, value in changes.items():
            reference.pop(key) if value is None else reference.__setitem__(key, value)

    try:
        batch(0, {b"k%03d" % i: b"0" for i in range(200)})
        complete = take_snapshot(snapshots, bootstrap, topic.name)
        assert complete.batch_id == 0 and complete.delta_version == 0
        batch(1, {b"k000": b"1", b"k001": None, b"new": b"1"})
        batch(2, {b"k002": b"2", b"new": None})

        # Kill the writer once its first data file is on disk, before its commit.
        before = _data_files(path)
        child = subprocess.Popen(
            [sys.executable, "-c", BIG_WRITE, str(path)], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while not (_data_files(path) - before) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
        assert "committed" not in child.stdout.read(), "the write committed before it could be interrupted"
        assert _data_files(path) - before, "no data file was written before the kill"

        # The debris is invisible: the table's newest version is still the complete snapshot.
        assert DeltaTable(str(path)).version() == 0 and snapshots.latest() == complete
        restored = restore_from_snapshot(snapshots, bootstrap, topic.name, SilentRestoreListener())
        assert restored.snapshot == complete and restored.batch_id == 2
        assert restored.state == reference and restored.snapshot_rows == 200

        # The next snapshot commits over the debris and reads back exactly.
        newer = take_snapshot(snapshots, bootstrap, topic.name)
        assert (newer.batch_id, newer.delta_version) == (2, 1)
        assert snapshots.read(newer) == reference
    finally:
        writer.close()
