"""Patient monitor events for the heart-rate job: one ``pulse`` per heartbeat, and check-outs.

Events are JSON objects keyed by ``patient_id``; devices buffer, so events arrive a little out of
order (up to ``disorder_ms``)::

    {"event_id": "h-3-0000042", "type": "pulse", "patient_id": "p007", "event_time": "2026-11-01T09:00:04.120Z"}
    {"event_id": "h-3-0000043", "type": "checked_out", "patient_id": "p007", "event_time": "..."}

:func:`expected` is the job's answer in plain Python (Kafka Streams' window semantics, stream time per
partition advancing record by record): the reference the tests compare the job with.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Iterable, Iterator

from runtime.kafka_connection import KafkaTarget
from spark_jobs.reference.generators import windows
from spark_jobs.reference.generators.producer import produce_keyed

START = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.timezone.utc)
PULSE, CHECKED_OUT = "pulse", "checked_out"


def _iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def generate(
    patients: int = 10,
    seconds: int = 300,
    seed: int = 3,
    start: dt.datetime = START,
    checkout_rate: float = 0.001,
    disorder_ms: int = 3000,
) -> Iterator[dict]:
    """``seconds`` of heartbeats (55-110 bpm) from ``patients`` patients, in arrival order."""
    rng = random.Random(seed)
    events = []
    for p in range(patients):
        bpm = rng.uniform(55, 110)
        t = start + dt.timedelta(milliseconds=rng.randint(0, 1000))
        while t < start + dt.timedelta(seconds=seconds):
            kind = CHECKED_OUT if rng.random() < checkout_rate else PULSE
            arrival = t + dt.timedelta(milliseconds=rng.randint(0, disorder_ms))
            events.append((arrival, {"type": kind, "patient_id": f"p{p:03d}", "event_time": _iso(t)}))
            t += dt.timedelta(milliseconds=int(60_000 / bpm * rng.uniform(0.9, 1.1)))
    events.sort(key=lambda e: e[0])
    for n, (_, event) in enumerate(events):
        yield {"event_id": f"h-{seed}-{n:07d}", **event}


def adversarial(count: int, patients: int = 6, seed: int = 5, start: dt.datetime = START) -> Iterator[dict]:
    """Events built to catch batch-dependent window results: pulses out of order by up to a minute
    (so some land exactly at, before and past the grace boundary), windows closed by other patients'
    pulses, check-outs right after a window closed, duplicates, and gaps longer than a 6 h retention."""
    rng = random.Random(seed)
    t = start
    for n in range(count):
        roll = rng.random()
        t += dt.timedelta(hours=7) if roll < 0.01 else dt.timedelta(milliseconds=rng.choice([0, 500, 2500, 9000]))
        at = t - dt.timedelta(milliseconds=rng.choice([0, 0, 0, 4999, 5000, 5001, 30_000, 65_000]))
        kind = CHECKED_OUT if roll > 0.95 else PULSE
        yield {
            "event_id": f"x-{seed}-{n}",
            "type": kind,
            "patient_id": f"p{rng.randrange(patients):03d}",
            "event_time": _iso(at),
        }


def produce(kafka: KafkaTarget, topic: str, events: list[dict]) -> int:
    return produce_keyed(kafka, topic, events, "patient_id")


@dataclasses.dataclass
class Expected:
    """What the heart-rate job must have produced after a sequence of rounds."""

    #: (patient, window start ms) -> (beats, closed) still in the store
    state: dict[tuple[str, int], tuple[int, bool]]
    #: (patient, window start ms) -> beats, every window emitted (closed) so far
    emitted: dict[tuple[str, int], int]
    #: event ids rejected as late (their window had closed)
    late: set[str]
    #: source partition -> its stream time (ms)
    stream_times: dict[int, int] = dataclasses.field(default_factory=dict)


def expected(
    rounds: Iterable[list[dict]], window_ms: int, grace_ms: int, retention_ms: int, partitions: int = 2
) -> Expected:
    """Kafka Streams' answer for ``rounds`` of events (in the order produced), in plain Python
    (:func:`spark_jobs.reference.generators.windows.expected` counting pulses, check-outs deleting). How the rounds
    are cut into micro-batches does not matter: the rounds are only concatenated."""
    got = windows.expected(
        (e for events in rounds for e in events),
        key="patient_id",
        aggregate=lambda beats, _: ((beats or (0,))[0] + 1,),
        applies=lambda e: e["type"] == PULSE,
        deletes=lambda e: e["type"] == CHECKED_OUT,
        window_ms=window_ms,
        grace_ms=grace_ms,
        retention_ms=retention_ms,
        partitions=partitions,
    )
    return Expected(
        {w: (values[0], closed) for w, (values, closed) in got.state.items()},
        {w: values[0] for w, values in got.emitted.items()},
        set(got.late),
        got.stream_times,
    )
