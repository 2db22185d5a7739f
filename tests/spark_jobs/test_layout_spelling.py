"""``JobLayout`` is the only speller of a job version's names: no module outside ``spark_jobs/layout.py``
formats an application id, a topic, a transactional id, an output name of a version or a job's DAG id by hand. (A name
formatted elsewhere is how a reset, a purge or an audit comes to miss what a version owns.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a name of a version's artifact spelled in an f-string: ``{...}-changelog``, ``{...}-dead-letter``, ``{job}-v{n}``;
#: a job's DAG id: ``supervise__{job}`` (``JobDags``, ``batch_dag_id``)
HAND_SPELLED = re.compile(
    r"\}-(changelog|dead-letter|generations|repartition|repartition-progress|repartitioner|driver|outputs)\b|\}-v\{"
    r"|\b(supervise|drain|batch)__\{"
)


def test_no_module_outside_the_layout_spells_a_versions_names():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    found = []
    for name in files.stdout.split():
        if name.startswith("tests/") or name == "spark_jobs/layout.py":
            continue
        for number, line in enumerate((ROOT / name).read_text().splitlines(), start=1):
            if HAND_SPELLED.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == [], "names spelled outside spark_jobs/layout.py (use JobLayout):\n" + "\n".join(found)
