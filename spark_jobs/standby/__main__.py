"""``python -m spark_jobs.standby <job> [--version N]``: run a job version's snapshot follower until stopped.

Exit codes: 0 stopped cleanly, 1 failed, 3 another follower of the version is running.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from prometheus_client import start_http_server

from runtime.settings import Settings
from spark_jobs.lease import ALREADY_RUNNING, JobAlreadyRunning
from spark_jobs.registry import get_job
from spark_jobs.standby.follower import SnapshotFollower
from spark_jobs.versions import JobVersions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spark_jobs.standby", description="Follow a job's changelogs into its Delta snapshots.")
    parser.add_argument("job")
    parser.add_argument("--version", type=int, default=None, help="job version (default: the one serving readers)")
    parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0: off)")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop after this long (tests, backfills)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings.from_env()
    spec = get_job(args.job, args.version) if args.version is not None else JobVersions(settings).current_spec(args.job)
    follower = SnapshotFollower(spec, settings)
    signal.signal(signal.SIGTERM, lambda *_: follower.stop_requested.set())
    signal.signal(signal.SIGINT, lambda *_: follower.stop_requested.set())
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=settings.host)
    try:
        follower.run(max_seconds=args.max_seconds)
    except JobAlreadyRunning as err:
        print(f"streamstate: {err}", file=sys.stderr)
        return ALREADY_RUNNING
    except Exception:
        logging.getLogger("streamstate.standby").exception("follower failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
