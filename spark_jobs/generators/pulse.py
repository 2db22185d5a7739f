"""Patient monitor events for the heart-rate job: one ``pulse`` per heartbeat, and check-outs.

Events are JSON objects keyed by ``patient_id``; devices buffer, so events arrive a little out of
order (up to ``disorder_ms``)::

    {"event_id": "h-3-0000042", "type": "pulse", "patient_id": "p007", "event_time": "2026-11-01T09:00:04.120Z"}
    {"event_id": "h-3-0000043", "type": "checked_out", "patient_id": "p007", "event_time": "..."}

:func:`expected` is the job's answer in plain Python (Kafka Streams' window semantics, stream time
advancing once per produced round): the reference the tests compare the job with.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Iterable, Iterator

from runtime.kafka_connection import KafkaTarget
from spark_jobs.generators.producer import produce_keyed

START = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.timezone.utc)
PULSE, CHECKED_OUT = "pulse", "checked_out"


def _iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def millis(iso: str) -> int:
    return int(dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def generate(patients: int = 10, seconds: int = 300, seed: int = 3, start: dt.datetime = START,
             checkout_rate: float = 0.001, disorder_ms: int = 3000) -> Iterator[dict]:  # fmt: skip
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


def expected(rounds: Iterable[list[dict]], window_ms: int, grace_ms: int, retention_ms: int) -> Expected:
    """Replay ``rounds`` (each produced, then fully processed, before the next) in plain Python.

    Stream time is the largest event time seen in earlier rounds; a window closes (and is emitted,
    once) when stream time reaches its end + grace; a pulse for a closed window is late; a window
    leaves the store when stream time reaches its start + retention; a check-out deletes every
    window of the patient (open ones are never emitted).
    """
    state: dict[tuple[str, int], list] = {}
    emitted: dict[tuple[str, int], int] = {}
    late: set[str] = set()
    stream_time = None
    for events in rounds:
        for e in events:  # one patient's events keep their order: arrival order
            t = millis(e["event_time"])
            if e["type"] == CHECKED_OUT:
                for key in [k for k in state if k[0] == e["patient_id"]]:
                    del state[key]
                continue
            start = t - t % window_ms
            if stream_time is not None and start + window_ms + grace_ms <= stream_time:
                late.add(e["event_id"])
                continue
            state.setdefault((e["patient_id"], start), [0, False])[0] += 1
        newest = max((millis(e["event_time"]) for e in events), default=None)
        if newest is not None:
            stream_time = newest if stream_time is None else max(stream_time, newest)
        for key, value in list(state.items()):
            if key[1] + retention_ms <= stream_time:
                if not value[1]:
                    emitted[key] = value[0]
                del state[key]
            elif key[1] + window_ms + grace_ms <= stream_time and not value[1]:
                value[1] = True
                emitted[key] = value[0]
    return Expected({k: (v[0], v[1]) for k, v in state.items()}, emitted, late)
