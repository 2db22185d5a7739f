"""``python -m spark_jobs.operations.standby <job> [--version N]``: run a job version's snapshot follower until stopped.

Exit codes: 0 stopped cleanly, 1 failed, 3 another follower of the version is running.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from runtime.settings import Settings
from spark_jobs.driver.lease import ALREADY_RUNNING, JobAlreadyRunning
from spark_jobs.driver.metrics import MetricsServer
from spark_jobs.layout import JobLayout
from spark_jobs.operations.standby.follower import SnapshotFollower
from spark_jobs.registry import get_job
from spark_jobs.versions import JobVersions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark_jobs.operations.standby", description="Follow a job's changelogs into its Delta snapshots."
    )
    parser.add_argument("job")
    parser.add_argument("--version", type=int, default=None, help="job version (default: the one serving readers)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on this port (default: STREAMSTATE_METRICS_PORT; 0: a free port)",
    )
    parser.add_argument("--max-seconds", type=float, default=None, help="stop after this long (tests, backfills)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings.from_env()
    spec = get_job(args.job, args.version) if args.version is not None else JobVersions(settings).current_spec(args.job)
    metrics_server = MetricsServer(settings, JobLayout.of(spec, settings).standby, args.metrics_port)
    follower = SnapshotFollower(spec, settings, metrics_port=metrics_server.port)
    signal.signal(signal.SIGTERM, lambda *_: follower.stop_requested.set())
    signal.signal(signal.SIGINT, lambda *_: follower.stop_requested.set())
    try:
        follower.run(max_seconds=args.max_seconds)
    except JobAlreadyRunning as err:
        print(f"streamstate: {err}", file=sys.stderr)
        return ALREADY_RUNNING
    except Exception:
        logging.getLogger("streamstate.standby").exception("follower failed")
        return 1
    finally:
        metrics_server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
