"""The changelog tail releases each batch once its markers reached every partition, as it happens
(real broker): what the warm standby and the state API's live view follow."""

from __future__ import annotations

import pytest

from spark_jobs.state.batch_records import BatchMarker
from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter
from spark_jobs.state.changelog_reader import ChangelogMissing, ChangelogTail, read_changelog
from tests.spark_jobs.state.test_changelog_reader import _produce

pytestmark = pytest.mark.integration


def _poll_until(tail: ChangelogTail, batch_id: int, attempts: int = 20):
    for _ in range(attempts):
        complete = tail.poll(0.5)
        if complete is not None:
            return complete
    raise AssertionError(f"batch {batch_id} never released; positions {tail.position}")


def test_tail_releases_batches_as_they_complete(kafka_broker, settings, unique):
    bootstrap = settings.kafka_bootstrap_servers
    with pytest.raises(ChangelogMissing):
        ChangelogTail(bootstrap, f"tail-{unique}-missing")
    topic = ChangelogTopic(f"tail-{unique}", "store", partitions=2)
    topic.ensure(bootstrap)
    writer = ChangelogWriter(topic, bootstrap)
    tail = ChangelogTail(bootstrap, topic.name)
    try:
        assert tail.poll(0.5) is None  # empty topic
        end = tail.end_offsets()
        assert tail.has_read(end) and tail.lag_records(end) == 0

        _produce(settings, topic.name, 0, [(b"a", b"1")], batch_id=0)
        _produce(settings, topic.name, 1, [(b"b", b"1")], batch_id=0)
        writer._write_markers(BatchMarker(0, {"in": {0: 1, 1: 1}}, 2))
        first = _poll_until(tail, 0)
        assert (first.batch_id, sorted(first.changes)) == (0, [(b"a", b"1"), (b"b", b"1")])
        assert first.marker.input_offsets == {"in": {0: 1, 1: 1}} and first.marker_time_ms > 0

        # Batch 1's data read, not complete yet; then a new consumer (what the tail does after a broker restart
        # left its client without the partition): the batch is still released whole, nothing read twice.
        _produce(settings, topic.name, 0, [(b"a", b"2"), (b"b", None)], batch_id=1)
        for _ in range(20):
            assert tail.poll(0.5) is None
            if tail.has_read(tail.end_offsets()):
                break
        tail.reopen()
        writer._write_markers(BatchMarker(1, {"in": {0: 3, 1: 1}}, 2))
        second = _poll_until(tail, 1)
        assert second.batch_id == 1 and second.changes == [(b"a", b"2"), (b"b", None)]

        for batch in (2, 3):  # later batches keep coming, one release each (or both at once)
            _produce(settings, topic.name, batch % 2, [(b"c", str(batch).encode())], batch_id=batch)
            writer._write_markers(BatchMarker(batch, {"in": {0: 3 + batch, 1: 1}}, 1))
        released = [_poll_until(tail, 2)]
        while released[-1].batch_id < 3:
            released.append(_poll_until(tail, 3))
        assert [k for r in released for k in r.changes][-1] == (b"c", b"3")
        assert tail.has_read(tail.end_offsets())
        resume = {}
        for r in (first, second, *released):
            resume.update(r.resume_offsets)
        assert resume == read_changelog(bootstrap, topic.name).resume_offsets  # where a later reader starts
    finally:
        tail.close()
        writer.close()
