"""``streamstate``: manage the embedded stack and run the main job.

    streamstate setup-jvm         resolve the JVM jars from jvm/ (Maven; idempotent)
    streamstate up [kafka|airflow] start the local broker and/or Airflow standalone
    streamstate down [...]        stop them and every job driver and standby (data is kept; `--wipe`
                                  deletes it)
    streamstate status            what runs, where, and its health (add --json for machines)
    streamstate logs kafka|airflow [-n N]
    streamstate demo              the main job: stack up, the job launched and supervised by Airflow,
                                  events flowing, summary (the job keeps running until `down`)

Settings come from STREAMSTATE_* variables (see runtime/settings.py and docs/configuration.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from runtime import class_archive, jvm
from runtime.airflow_standalone import LocalAirflow
from runtime.kafka_broker import LocalKafkaBroker
from runtime.process import ServiceError
from runtime.settings import Settings, SettingsError
from streamstate_cli import class_archive_training
from streamstate_cli.job_processes import stop_job_processes

SERVICES = ("kafka", "airflow")
console = Console(highlight=False, width=None if Console().is_terminal else 140)


def _services(settings: Settings, names: list[str]) -> dict[str, LocalKafkaBroker | LocalAirflow]:
    chosen = names or list(SERVICES)
    return {name: (LocalKafkaBroker(settings) if name == "kafka" else LocalAirflow(settings)) for name in chosen}


def cmd_setup_jvm(settings: Settings, args: argparse.Namespace) -> int:
    resolved = jvm.resolve(settings, force=args.force, log=console.print)
    for name, jars in resolved.items():
        console.print(f"{name}: {len(jars)} jars in {settings.jvm_dir / name}")
    if archive := class_archive.build(settings, class_archive_training.COMMAND, force=args.force, log=console.print):
        console.print(f"class archive for Spark drivers: {archive}")
    return 0


def cmd_up(settings: Settings, args: argparse.Namespace) -> int:
    jvm.resolve(settings, log=console.print)
    for name, service in _services(settings, args.services).items():
        with console.status(f"starting {name}…"):
            pid = service.start()
        console.print(f"[green]✓[/green] {name} running (pid {pid})")
    return cmd_status(settings, argparse.Namespace(json=False))


def cmd_down(settings: Settings, args: argparse.Namespace) -> int:
    for name, service in reversed(list(_services(settings, args.services).items())):
        stopped = service.stop()
        console.print(f"{name}: {'stopped' if stopped else 'was not running'}")
        if name == "airflow" and not args.services:  # nothing restarts them now; Kafka still runs
            for job in stop_job_processes(settings):
                console.print(f"{job}: stopped")
    if not args.services:  # `make down`: the production shape too (`make production`), when it was started here
        from streamstate_cli.production import ProductionStack

        production = ProductionStack.from_env()
        if production.settings.data_dir.exists():
            for name in production.stop():
                console.print(f"production shape: {name} stopped")
    if args.wipe:
        if args.services and set(args.services) != set(SERVICES):
            console.print("[red]--wipe deletes all local data; use it without naming services[/red]")
            return 2
        shutil.rmtree(settings.data_dir, ignore_errors=True)
        console.print(f"deleted {settings.data_dir}")
    return 0


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    described = {name: service.describe() for name, service in _services(settings, []).items()}
    if args.json:
        print(json.dumps(described, indent=2))
        return 0
    table = Table(title="streamstate local stack")
    for column in ("service", "state", "pid", "where", "log"):
        table.add_column(column)
    for name, info in described.items():
        where = info.get("bootstrap_servers") or info.get("url")
        state = "[green]running[/green]" if info["running"] else "[dim]stopped[/dim]"
        if name == "airflow" and info["running"]:
            state += " " + ", ".join(f"{k}={v}" for k, v in info["health"].items())
        table.add_row(name, state, str(info["pid"] or "-"), str(where), str(info["log"]))
    console.print(table)
    return 0


def cmd_logs(settings: Settings, args: argparse.Namespace) -> int:
    service = _services(settings, [args.service])[args.service]
    print(service.service.tail(args.lines))
    return 0


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from streamstate_cli.demo import run_demo

    return run_demo(
        settings, events=args.events, users=args.users, with_airflow=not args.no_airflow, seconds=args.seconds
    )


def cmd_state_api(settings: Settings, args: argparse.Namespace) -> int:
    """The state query API on its own (in Airflow it is the plugin app under /state-api)."""
    import uvicorn

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins"))  # as in every Airflow process
    from streamstate.state_api.app import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=args.port or settings.state_api_port, log_level="info")
    return 0


def cmd_new_job(settings: Settings, args: argparse.Namespace) -> int:
    """Write a job module and its test (spark_jobs/scaffold.py) to edit."""
    from spark_jobs.registry import JobSpecError
    from spark_jobs.scaffold import new_job

    try:
        written = new_job(args.name, Path(args.dir))
    except (JobSpecError, FileExistsError) as err:
        console.print(f"[red]error:[/red] {err}")
        return 2
    for path in written:
        console.print(f"wrote {path}")
    console.print(f"run its test: PYTHONPATH={args.dir} python -m pytest {Path(args.dir) / f'test_{args.name}.py'}")
    return 0


def cmd_production(settings: Settings, args: argparse.Namespace) -> int:
    """The production shape on this machine, and the main job on it through Airflow (streamstate_cli/production.py)."""
    from streamstate_cli import production

    return production.run(events=args.events, users=args.users, seconds=args.seconds)


def cmd_monitoring(settings: Settings, args: argparse.Namespace) -> int:
    """Write this deployment's Prometheus configuration: a scrape configuration reading every platform process's
    target file (file-based discovery) and the platform's alert rules (runtime/prometheus.py)."""
    import yaml

    from runtime.prometheus import render_alert_rules, scrape_config

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rules = out / "alerts.yml"
    rules.write_text(render_alert_rules(settings))
    console.print(f"wrote {rules}")
    if not args.rules_only:
        config = out / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(settings, [rules.resolve()]), sort_keys=False))
        console.print(f"wrote {config} (scrapes {settings.metrics_targets_dir}/*.json)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamstate", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("setup-jvm", help="resolve JVM jars with Maven (idempotent)")
    p.add_argument("--force", action="store_true", help="resolve again even if up to date")
    p.set_defaults(func=cmd_setup_jvm)

    for name, func, text in (("up", cmd_up, "start"), ("down", cmd_down, "stop")):
        p = sub.add_parser(name, help=f"{text} local services (default: all)")
        p.add_argument("services", nargs="*", metavar="SERVICE", help=f"any of {', '.join(SERVICES)}")
        if name == "down":
            p.add_argument(
                "--wipe", action="store_true", help="also delete all local data (topics, tables, Airflow DB)"
            )
        p.set_defaults(func=func)

    p = sub.add_parser("status", help="show what runs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("logs", help="print the last lines of a service's log")
    p.add_argument("service", choices=SERVICES)
    p.add_argument("-n", "--lines", type=int, default=50)
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("demo", help="run the main job end to end on the embedded stack")
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--users", type=int, default=2_000)
    p.add_argument("--seconds", type=float, default=30.0, help="produce the events over this long")
    p.add_argument(
        "--no-airflow",
        action="store_true",
        help="no Airflow: the job drains the events with spark-submit --available-now and stops",
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("new-job", help="write a job module (a declaration) and its test, to edit")
    p.add_argument("name", help="the job's name (lower-case letters, digits and _)")
    p.add_argument("--dir", default=".", help="where to write NAME.py and test_NAME.py (default: here)")
    p.set_defaults(func=cmd_new_job)

    p = sub.add_parser(
        "production", help="start the production shape here (3 brokers, a Spark cluster, Airflow on PostgreSQL, ...)"
    )
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--users", type=int, default=2_000)
    p.add_argument("--seconds", type=float, default=30.0, help="produce the events over this long")
    p.set_defaults(func=cmd_production)

    p = sub.add_parser("monitoring", help="write this deployment's Prometheus scrape configuration and alert rules")
    p.add_argument("--out", default="monitoring", help="the directory to write them in (default: monitoring)")
    p.add_argument("--rules-only", action="store_true", help="only alerts.yml (the repository's copy)")
    p.set_defaults(func=cmd_monitoring)

    p = sub.add_parser("state-api", help="serve the state query API (OpenAPI at /docs)")
    p.add_argument("--port", type=int, default=None, help="default: STREAMSTATE_STATE_API_PORT")
    p.set_defaults(func=cmd_state_api)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "services", None):
        unknown = set(args.services) - set(SERVICES)
        if unknown:
            console.print(f"[red]unknown service(s) {sorted(unknown)}; choose from {list(SERVICES)}[/red]")
            return 2
    try:
        settings = Settings.from_env()
        return args.func(settings, args)
    except (SettingsError, ServiceError, jvm.JvmDependencyError) as err:
        console.print(f"[red]error:[/red] {err}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
