"""What a Spark driver's start costs with and without set-up's class archive (runtime/class_archive.py).

Each round starts two fresh drivers one after the other, one mapping the archive and one not (the order
alternates), each building the platform's SparkSession (spark_conf: Delta, Kafka and the processors on
``spark.jars``) and running one small aggregation. Two phases are timed: the session (JVM start, gateway,
SparkContext) and the first query (its planning and code generation load most of Spark SQL's classes).

    .venv/bin/python bench/driver_start.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.private_stack import append_section  # noqa: E402
from runtime import class_archive  # noqa: E402
from runtime.settings import PROJECT_ROOT, Settings  # noqa: E402

_DRIVER = """
import json, sys, time
started = time.monotonic()
from runtime import class_archive
from runtime.settings import Settings
from spark_jobs.driver import session
if sys.argv[1] == "without":
    class_archive.driver_java_options = lambda settings: []
spark = session.build_spark_session(Settings.from_env().replace(spark_master="local[2]"), "driver-start")
ready = time.monotonic()
from pyspark.sql import functions as F
spark.range(100_000).groupBy((F.col("id") % 7).alias("k")).count().collect()
print(json.dumps({"session_s": ready - started, "first_query_s": time.monotonic() - ready}))
spark.stop()
"""


def _start(mode: str) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, mode], cwd=PROJECT_ROOT, check=True, capture_output=True, text=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    console = Console()
    settings = Settings.from_env()
    archive = class_archive.build(settings, log=console.print)
    if archive is None:
        raise SystemExit("no class archive could be built (see above)")
    runs: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
    for round_no in range(args.rounds):
        for mode in ("with", "without") if round_no % 2 == 0 else ("without", "with"):
            runs[mode].append(_start(mode))
            console.print(f"round {round_no + 1} {mode} the archive: {runs[mode][-1]}")

    def median(mode: str, phase: str) -> float:
        return statistics.median(r[phase] for r in runs[mode])

    rows = []
    for phase, label in (("session_s", "session"), ("first_query_s", "first query")):
        rows.append(f"| {label} | {median('without', phase):.2f} | {median('with', phase):.2f} |")
    total = {mode: median(mode, "session_s") + median(mode, "first_query_s") for mode in runs}
    append_section(
        [
            f"## A Spark driver's start with and without the class archive ({dt.date.today().isoformat()})",
            "",
            (
                f"`.venv/bin/python bench/driver_start.py --rounds {args.rounds}` on {platform.node()} "
                f"({args.rounds} drivers each, alternating; medians in seconds; archive {archive.stat().st_size >> 20} MB)."
            ),
            "",
            "| phase | without | with |",
            "|---|---|---|",
            *rows,
            f"| **both** | **{total['without']:.2f}** | **{total['with']:.2f}** ({total['without'] - total['with']:.2f} s saved) |",
            "",
        ],
        console,
    )


if __name__ == "__main__":
    main()
