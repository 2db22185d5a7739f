"""Restore one store of a job the way a driver without a checkpoint does, in its own process.

``--mode full``: replay the whole changelog (what Kafka Streams does after its state directory is lost);
``--mode snapshot``: the latest Delta snapshot + the changelog tail after it (the platform's restore).
Settings come from the ``STREAMSTATE_*`` environment (bench/compare.py sets them). Prints one JSON line
with the restore's own clock and what it read. Spark is not started: the restore itself uses none (in a
driver it runs beside Spark's JVM, whose memory is the driver's, not the restore's).

    .venv/bin/python bench/platform_restore_probe.py <job> <store> --mode full|snapshot [--version N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from runtime.settings import Settings  # noqa: E402
from spark_jobs.driver.context import JobContext  # noqa: E402
from spark_jobs.registry import get_job  # noqa: E402
from spark_jobs.state.restore import SilentRestoreListener, restore_from_snapshot  # noqa: E402


def _load_libraries() -> None:
    """Import what a restore uses before the clock starts: a driver has long loaded its libraries when it
    restores, as Kafka Streams has loaded RocksDB when its restore listener fires. (Measured cold, the
    deltalake + pyarrow import alone added 1-4 s to snapshot + tail on this machine.)"""
    import deltalake  # noqa: F401
    import pyarrow  # noqa: F401


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("job")
    parser.add_argument("store")
    parser.add_argument("--mode", choices=("full", "snapshot"), required=True)
    parser.add_argument("--version", type=int, help="the job's version (default: the newest registered)")
    args = parser.parse_args()

    _load_libraries()
    settings = Settings.from_env()
    spec = get_job(args.job, args.version)
    context = JobContext(None, spec, settings)  # a restore needs no Spark: delta-rs + the Kafka consumer
    restored = restore_from_snapshot(
        context.stores.handle(args.store).snapshots,
        settings.kafka,
        context.stores.handle(args.store).changelog.name,
        SilentRestoreListener(),
        use_snapshot=args.mode == "snapshot",
    )
    print(
        json.dumps(
            {
                "seconds": restored.seconds,
                "keys": len(restored.state),
                "batch_id": restored.batch_id,
                "changelog_records_read": restored.changelog_records_read,
                "snapshot_rows": restored.snapshot_rows,
                "snapshot_seconds": restored.snapshot_seconds,
            }
        )
    )


if __name__ == "__main__":
    main()
