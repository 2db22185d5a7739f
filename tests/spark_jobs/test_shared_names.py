"""The names Python and the platform's Java processors both use (columns, row kinds) are the same on both
sides: each pair is listed here once and checked against the Java source, so a rename on one side fails
here instead of in a job's first micro-batch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spark_jobs.io import dead_letter
from spark_jobs.primitives import event_time, keyed_aggregate, pipeline

JAVA = Path(__file__).resolve().parents[2] / "jvm" / "state-processors" / "src" / "streamstate"
#: (Java class file under streamstate/, its constant) -> the Python value that must equal it
SHARED = {
    ("jobs/DeadLetters.java", "COLUMN"): dead_letter.LETTER_COLUMN,
    ("primitives/Rows.java", "DELETE_COLUMN"): pipeline.DELETE_COLUMN,
    ("primitives/KeyedAggregate.java", "INPUT_PREFIX"): keyed_aggregate.INPUT_PREFIX,
    ("primitives/ExpiringAggregate.java", "CHANGE"): keyed_aggregate.CHANGE,
    ("primitives/ExpiringAggregate.java", "LATE"): keyed_aggregate.LATE,
    ("primitives/WindowedAggregate.java", "CHANGE"): event_time.CHANGE,
    ("primitives/WindowedAggregate.java", "LATE"): event_time.LATE,
}


def java_constant(source: str, name: str) -> str:
    found = re.findall(rf'static final String {name} = "([^"]*)";', (JAVA / source).read_text())
    assert len(found) == 1, f"{source} declares {name} {len(found)} times"
    return found[0]


@pytest.mark.parametrize(("source", "name"), sorted(SHARED), ids=lambda v: str(v))
def test_python_and_java_name_it_alike(source, name):
    assert java_constant(source, name) == SHARED[(source, name)]
