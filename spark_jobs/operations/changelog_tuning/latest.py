"""The newest measurement of every changelog topic, kept for the jobs page (the Delta tables of
:mod:`.history` hold every measurement; this small file holds the last one, read without Spark)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from runtime.files import write_json_atomically
from runtime.settings import Settings
from spark_jobs.documents import from_json, to_json


@dataclasses.dataclass(frozen=True)
class LatestMeasurement:
    """One changelog topic as the tuning DAG last measured it."""

    application_id: str
    store: str
    records: int
    live_keys: int
    #: records a restore replays per live key
    replay_ratio: float
    #: the replay ratio above the one tombstones and updates cannot avoid (what compaction could remove)
    excess_replay_ratio: float
    bytes: int
    measured_at: str
    #: the deployment's target (``STREAMSTATE_COMPACTION_TARGET_REPLAY_RATIO``)
    target: float

    @property
    def above_target(self) -> bool:
        return self.excess_replay_ratio > self.target


def latest_file(settings: Settings) -> Path:
    return settings.status_dir / "changelog_tuning" / "latest.json"


def write_latest(settings: Settings, measurements: dict[str, LatestMeasurement]) -> None:
    """Replace the file with ``topic -> measurement`` (atomically: the jobs page reads it meanwhile)."""
    write_json_atomically(latest_file(settings), {topic: to_json(m) for topic, m in measurements.items()})


def read_latest(settings: Settings) -> dict[str, LatestMeasurement]:
    """``topic -> measurement``; empty before the tuning DAG's first run."""
    try:
        data = json.loads(latest_file(settings).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {topic: from_json(LatestMeasurement, m) for topic, m in data.items()}
