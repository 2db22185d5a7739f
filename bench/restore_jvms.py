"""A cold Spark restore of a large store on the JVMs a driver can run on.

Variants, each restore in a fresh process, alternating over the rounds on one dataset:

- ``platform``: the JVM drivers run on (runtime/jvm.py: ``java_home``) with set-up's class archive
  (runtime/class_archive.py);
- ``other+archive``: another JDK (``--java-home``) with a class archive built the same way, by set-up's
  training program;
- ``other+aot``: that JDK with an AOT cache (JDK 25+: JEP 483 linked classes, JEP 515 method profiles)
  recorded by the same training program;
- ``other``: that JDK with neither;
- ``platform+options``: the platform's JVM and archive with more driver options (``--driver-option``, e.g. a
  garbage collector), to try a JVM flag on the same restore.

The dataset is bench/state_scale.py's (KEYS keys, 1% of them changed per batch, the snapshot before the last
2 batches) on a private broker, and each restore is its ``measure("spark")``: seconds from the restore's
call to its ``count()``, the session's start apart, then the same restore warm.

    .venv/bin/python bench/restore_jvms.py [--java-home /usr/lib/jvm/temurin-17-jdk-amd64] \\
        [--driver-option=-XX:+UseParallelGC ...] [--keys 10000000] [--rounds 3] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.private_stack import append_section, private_broker
from bench.restore_time import ChangelogSimulator
from runtime import class_archive, jvm
from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.state.changelog import ChangelogTopic
from spark_jobs.state.snapshots import SnapshotStore
from spark_jobs.state.snapshotting import take_snapshot

CHURN_BATCHES, TAIL_BATCHES = 4, 2

# One restore; RESTORE_JVM_OPTIONS (a JSON list) replaces the class archive's driver options when set.
_RESTORE = """
import json, os, sys
from runtime import class_archive
if (options := os.environ.get("RESTORE_JVM_OPTIONS")) is not None:
    class_archive.driver_java_options = lambda settings: json.loads(options)
from bench.state_scale import measure
from runtime.settings import Settings
print(json.dumps(measure("spark", Settings.from_env(json.loads(sys.argv[1])), sys.argv[2], sys.argv[3])))
"""


def _java_version(java_home: str) -> str:
    out = subprocess.run([f"{java_home}/bin/java", "-version"], capture_output=True, text=True, check=True)
    return out.stderr.splitlines()[0]


def _train(java_home: str, path: Path, *, aot_cache: bool, console: Console) -> bool:
    """Set-up's training program on ``java_home``, writing an archive or an AOT cache at ``path``."""
    command = [
        sys.executable,
        "-m",
        "streamstate_cli.class_archive_training",
        str(path),
        *(["--aot-cache"] if aot_cache else []),
    ]
    env = {**os.environ, "JAVA_HOME": java_home}
    proc = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not path.is_file():
        console.print(f"[red]training for {path.name} failed[/red]: {(proc.stdout + proc.stderr)[-1500:]}")
        return False
    return True


def _restore(variant: dict, settings, topic: str, snapshot_path: str) -> dict:
    env = dict(os.environ)
    if variant["java_home"]:
        env["JAVA_HOME"] = variant["java_home"]
    if variant["options"] is not None:
        env["RESTORE_JVM_OPTIONS"] = json.dumps(variant["options"])
    command = [sys.executable, "-c", _RESTORE, json.dumps(settings.to_env()), topic, snapshot_path]
    proc = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{variant['name']} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--java-home", help="another JDK (e.g. /usr/lib/jvm/java-17-openjdk-amd64)")
    parser.add_argument("--driver-option", action="append", default=[], help="a JVM option for platform+options")
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    console = Console()
    platform_java = str(Path(jvm.java_binary(Settings.from_env())).resolve().parents[1])

    with tempfile.TemporaryDirectory(prefix="restore-jvms-") as scratch, private_broker("bench-jvms-") as settings:
        archive, aot = Path(scratch) / "other.jsa", Path(scratch) / "other.aot"
        quiet = list(class_archive._QUIET)
        variants = [{"name": "platform", "java_home": None, "options": None}]
        if args.driver_option:
            options = [*class_archive.driver_java_options(settings), *args.driver_option]
            variants.append({"name": "platform+options", "java_home": None, "options": options})
        if args.java_home and _train(args.java_home, archive, aot_cache=False, console=console):
            options = [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", *quiet]
            variants.append({"name": "other+archive", "java_home": args.java_home, "options": options})
        if args.java_home and _train(args.java_home, aot, aot_cache=True, console=console):
            variants.append({"name": "other+aot", "java_home": args.java_home, "options": [f"-XX:AOTCache={aot}"]})
        if args.java_home:
            variants.append({"name": "other", "java_home": args.java_home, "options": []})

        topic = ChangelogTopic(f"bench-jvms-{args.keys}", "counts", partitions=2)
        topic.ensure(settings.kafka)
        snapshot_path = str(settings.data_dir / "snapshot")
        batches = 3 + CHURN_BATCHES  # ChangelogSimulator inserts over the first third
        simulator = ChangelogSimulator(settings, topic, args.keys, batches, max(1, args.keys // 100), seed=7)
        simulator.write(batches - TAIL_BATCHES)
        take_snapshot(SnapshotStore(snapshot_path, "bench-v1", "counts"), settings.kafka, topic.name)
        simulator.write(TAIL_BATCHES)

        results: dict[str, list[dict]] = {v["name"]: [] for v in variants}
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else variants[::-1]
            for variant in order:
                row = _restore(variant, settings, topic.name, snapshot_path)
                assert row["keys"] == args.keys and row["batch_id"] == batches - 1, row
                console.print(variant["name"], row)
                results[variant["name"]].append(row)

    def column(name: str, key: str) -> str:
        values = [row[key] for row in results[name]]
        return f"{statistics.median(values):.1f} ({' / '.join(f'{v:.1f}' for v in values)})"

    other = f"; other: {_java_version(args.java_home)}" if args.java_home else ""
    options = f"; platform+options: `{' '.join(args.driver_option)}`" if args.driver_option else ""
    command = " ".join(
        [
            ".venv/bin/python bench/restore_jvms.py",
            *([f"--java-home {args.java_home}"] if args.java_home else []),
            *(f"--driver-option={option}" for option in args.driver_option),
            f"--keys {args.keys} --rounds {args.rounds}",
        ]
    )
    lines = [
        f"## A cold Spark restore of {args.keys:,} keys on the JVMs a driver can run on ({dt.date.today().isoformat()})",
        "",
        f"Command: `{command}`",
        (
            f"Machine: {platform.machine()}, 2 cores (shared); bench/state_scale.py's dataset and restore (Spark "
            f"`local[*]`, snapshot + a tail of {TAIL_BATCHES} batches of 1% of the keys), each in a fresh process, "
            f"variants alternating. Platform JVM: {_java_version(platform_java)}{other}{options}. "
            "Seconds: median (each run)."
        ),
        "",
        "| variant | restore, s | warm, s | Spark session start, s | JVM peak RSS, MB |",
        "|---|---|---|---|---|",
    ]
    for name, rows in results.items():
        lines.append(
            f"| {name} | {column(name, 'seconds')} | {column(name, 'warm_seconds')} | "
            f"{column(name, 'session_seconds')} | {statistics.median(r['jvm_peak_rss_mb'] for r in rows):.0f} |"
        )
    if args.no_write:
        console.print("\n".join(lines))
    else:
        append_section([*lines, ""], console)


if __name__ == "__main__":
    main()
