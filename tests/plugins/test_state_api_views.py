"""The live view follows a changelog batch by batch; scans page in key order (real broker)."""

from __future__ import annotations

import pytest
from streamstate.state_api.views import LiveView, StateTable

from spark_jobs.state.batch_records import BatchMarker
from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter
from spark_jobs.state.snapshots import SnapshotStore
from tests.helpers import wait_for
from tests.spark_jobs.state.test_changelog_reader import _produce

pytestmark = pytest.mark.integration


def test_state_table_scans_in_key_order_with_paging():
    table = StateTable({f"k{i:03d}": str(i) for i in range(25)} | {"other": "x"})
    page, last = table.scan(start=None, end=None, prefix="k", after=None, limit=10)
    assert [k for k, _ in page] == [f"k{i:03d}" for i in range(10)] and last == "k009"
    page, last = table.scan(start=None, end=None, prefix="k", after=last, limit=10)
    assert page[0][0] == "k010"
    page, last = table.scan(start=None, end=None, prefix="k", after="k019", limit=10)
    assert [k for k, _ in page] == [f"k{i:03d}" for i in range(20, 25)] and last is None
    assert table.scan(start="k005", end="k008", prefix=None, after=None, limit=10)[0] == [
        ("k005", "5"),
        ("k006", "6"),
        ("k007", "7"),
    ]
    table.state["k100"] = "100"
    table.changed()
    assert table.scan(start="k1", end=None, prefix=None, after=None, limit=10)[0][-1] == ("other", "x")
    assert ("k100", "100") in table.scan(start="k1", end=None, prefix=None, after=None, limit=10)[0]


def test_live_view_applies_each_complete_batch(kafka_broker, settings, unique, tmp_path):
    bootstrap = settings.kafka_bootstrap_servers
    topic = ChangelogTopic(f"view-{unique}", "store", partitions=2)
    topic.ensure(bootstrap)
    writer = ChangelogWriter(topic, bootstrap)
    _produce(settings, topic.name, 0, [(b"a", b'{"n": 1}')], batch_id=0)
    _produce(settings, topic.name, 1, [(b"b", b'{"n": 1}')], batch_id=0)
    writer._write_markers(BatchMarker(0, {"in": {0: 1, 1: 1}}, 2))
    view = LiveView(SnapshotStore(tmp_path / "no-snapshot-yet", "app", "store"), bootstrap, topic.name, poll_s=0.1)
    try:
        assert view.wait_ready(30)
        wait_for(lambda: view.batch_id == 0, 30, "batch 0 in the view")
        assert view.table.get("a") == '{"n": 1}' and len(view.table) == 2 and view.as_of_ms > 0
        assert [k for k, _ in view.table.scan(start=None, end=None, prefix=None, after=None, limit=5)[0]] == ["a", "b"]

        _produce(settings, topic.name, 0, [(b"a", b'{"n": 2}'), (b"c", b'{"n": 1}')], batch_id=1)
        _produce(settings, topic.name, 1, [(b"b", None)], batch_id=1)
        writer._write_markers(BatchMarker(1, {"in": {0: 3, 1: 2}}, 3))
        wait_for(lambda: view.batch_id == 1, 30, "batch 1 in the view")
        assert view.table.state == {"a": '{"n": 2}', "c": '{"n": 1}'}
        assert [k for k, _ in view.table.scan(start=None, end=None, prefix=None, after=None, limit=5)[0]] == ["a", "c"]
    finally:
        view.stop()
        writer.close()
