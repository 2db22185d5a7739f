"""Prometheus for the platform: what it scrapes, the alert rules that ship with the platform, and a local server.

**Discovery.** Every driver, spare and standby that serves ``/metrics`` lists itself in
``<status_dir>/metrics-targets/<name>.json`` while it serves (:attr:`Settings.metrics_targets_dir`,
spark_jobs/driver/metrics.py); :func:`scrape_config` points Prometheus' file-based discovery at that directory, so a
process is scraped from its start and dropped when it stops. A process killed with kill -9 leaves its file: its
``up`` is 0 until a restart of the same name replaces it, which is what :data:`RULES`' ``StreamstateProcessDown``
watches. Scraped labels are kept as the platform wrote them (``honor_labels``): ``application_id`` and ``role``.

**Alert rules.** One set for every job (:func:`alert_rules`), each rule comparing a job's metric with the job's own
limit exported beside it (``streamstate_*_budget_*``: its supervision policy and its stores' budgets), so a job's
thresholds live in its declaration, not in Prometheus. How long a condition must hold is :class:`AlertWindows`:
``monitoring/alerts.yml`` is the rules with the production windows (``python -m streamstate_cli monitoring``
writes a deployment's), ``monitoring/alerts.test.yml`` their ``promtool test rules`` unit tests; the monitoring tests
run the same rules with windows of seconds against a live Prometheus and make each fire but the standby's
(tests/production/test_monitoring.py says why).

**The server.** :class:`LocalPrometheus` runs Debian's ``prometheus`` (set-up installs it) as a local service of
the production shape, its data in ``<data_dir>/prometheus``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from runtime.process import LocalService, ServiceError
from runtime.settings import PROJECT_ROOT, Settings

#: the shipped rules (production windows) and their promtool unit tests
ALERT_RULES_FILE = PROJECT_ROOT / "monitoring" / "alerts.yml"
ALERT_TESTS_FILE = PROJECT_ROOT / "monitoring" / "alerts.test.yml"
#: the scrape job every platform process is in
SCRAPE_JOB = "streamstate"


@dataclasses.dataclass(frozen=True)
class AlertWindows:
    """How long each condition must hold before its alert fires (Prometheus durations). The defaults are for
    production: long enough that a restart supervision handles by itself (a driver back within a minute, a first
    batch catching up) pages no one."""

    #: a process listed for discovery that does not answer (killed, hung, its host gone)
    down_for: str = "5m"
    #: the range the input lag's trend is taken over, and how long it must grow above the job's budget
    lag_window: str = "10m"
    lag_for: str = "15m"
    #: a running job with input waiting and no new micro-batch over the window
    stalled_window: str = "10m"
    stalled_for: str = "5m"
    #: a restore past the job's restore budget
    restore_for: str = "1m"
    #: live state rows above the job's budget
    budget_for: str = "30m"
    #: a standby's snapshot further behind than the deployment's bound (``standby_max_lag_s``)
    standby_for: str = "5m"


def alert_rules(settings: Settings, windows: AlertWindows = AlertWindows()) -> dict:
    """The platform's alert rules as a Prometheus rule file's document."""
    w, by_job = windows, "on (application_id)"

    def rule(name: str, expr: str, hold: str, severity: str, summary: str, description: str) -> dict:
        return {
            "alert": name,
            "expr": expr,
            "for": hold,
            "labels": {"severity": severity},
            "annotations": {"summary": summary, "description": description},
        }

    lag = "sum by (application_id) (streamstate_input_lag_records)"
    rules = [
        rule(
            "StreamstateProcessDown",
            f'up{{job="{SCRAPE_JOB}"}} == 0',
            w.down_for,
            "page",
            "{{ $labels.role }} of {{ $labels.application_id }} does not answer at {{ $labels.instance }}",
            "A driver, spare or standby that listed itself for discovery stopped answering: killed, hung, or its host "
            "is gone. Supervision restarts a driver by itself; this fires when it has not come back. Look at the "
            "supervise DAG's last runs and the process's log.",
        ),
        rule(
            "StreamstateInputLagGrowing",
            f"{lag} > {by_job} max by (application_id) (streamstate_input_lag_budget_records)\n"
            f"and {by_job} sum by (application_id) (deriv(streamstate_input_lag_records[{w.lag_window}])) > 0",
            w.lag_for,
            "page",
            "{{ $labels.application_id }} falls behind its input: {{ $value }} records and growing",
            "The input lag is above the job's budget (its supervision policy's max_input_lag_records) and still "
            "growing: the job does not keep up. Look at the batch duration, state size and input rate panels.",
        ),
        rule(
            "StreamstateNoProgress",
            'max by (application_id) (streamstate_job_state{state="RUNNING"}) == 1\n'
            f"and {by_job} {lag} > 0\n"
            f"and {by_job} max by (application_id) (changes(streamstate_batch_id[{w.stalled_window}])) == 0",
            w.stalled_for,
            "page",
            "{{ $labels.application_id }} runs but has committed no micro-batch for " + w.stalled_window,
            "The driver is RUNNING, its input has records waiting, and no micro-batch has finished over the window: "
            "a hung batch (a stuck task, a broker it cannot write to). Its Spark UI shows the batch's stage.",
        ),
        rule(
            "StreamstateRestoreRunningLong",
            "time() - max by (application_id, store) (streamstate_restore_started_timestamp_seconds)\n"
            f"> {by_job} group_left max by (application_id) (streamstate_restore_budget_seconds)",
            w.restore_for,
            "page",
            "{{ $labels.application_id }} has been restoring {{ $labels.store }} for {{ $value | humanizeDuration }}",
            "A restore is past the job's restore budget: the job processes nothing until it ends. A long changelog "
            "tail (compaction behind, snapshots not taken) is the usual cause: see the state-size audit.",
        ),
        rule(
            "StreamstateStateOverBudget",
            "max by (application_id) (streamstate_state_rows)\n"
            f"> {by_job} max by (application_id) (streamstate_state_budget_rows)",
            w.budget_for,
            "ticket",
            "{{ $labels.application_id }} holds {{ $value }} state rows, above its stores' budget",
            "The live state is larger than the job's stores declare (StateBudget.max_rows): keys that never expire, "
            "or a budget to raise. The state-size audit DAG shows which store grows and its trend.",
        ),
        rule(
            "StreamstateStandbyBehind",
            f"max by (application_id, store) (streamstate_standby_lag_ms) > {int(settings.standby_max_lag_s * 1000)}",
            w.standby_for,
            "ticket",
            "the standby of {{ $labels.application_id }} is {{ $value }} ms behind on {{ $labels.store }}",
            "The warm standby's snapshot is further behind the changelog than the deployment's bound "
            "(STREAMSTATE_STANDBY_MAX_LAG_S): a restore from it would replay more. Its log says why it lags.",
        ),
    ]
    return {"groups": [{"name": "streamstate", "rules": rules}]}


def render_alert_rules(settings: Settings, windows: AlertWindows = AlertWindows()) -> str:
    header = (
        "# The platform's Prometheus alert rules (runtime/prometheus.py: alert_rules), with the production windows.\n"
        "# Written by `python -m streamstate_cli monitoring`; tests/monitoring keeps this copy equal to the code.\n"
    )
    return header + yaml.dump(alert_rules(settings, windows), Dumper=_RulesDumper, sort_keys=False, width=120)


class _RulesDumper(yaml.SafeDumper):
    """Multi-line PromQL as YAML block text (``|``), as people write rule files."""


_RulesDumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def scrape_config(settings: Settings, rule_files: list[Path], interval_s: float = 15.0) -> dict:
    """A ``prometheus.yml`` scraping every platform process listed under ``settings.metrics_targets_dir``."""
    every = f"{interval_s:g}s"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": SCRAPE_JOB,
                "honor_labels": True,
                "file_sd_configs": [
                    {"files": [str(settings.metrics_targets_dir / "*.json")], "refresh_interval": every}
                ],
            }
        ],
    }


class LocalPrometheus:
    """Debian's Prometheus on ``port``, scraping this deployment's platform processes with ``rules``."""

    def __init__(self, settings: Settings, port: int, rules: str, interval_s: float = 15.0) -> None:
        self.settings, self.port, self.interval_s = settings, port, interval_s
        self.home = settings.data_dir / "prometheus"
        self.rules_file = self.home / "alerts.yml"
        self.config_file = self.home / "prometheus.yml"
        self.rules = rules
        self.service = LocalService("prometheus", self.home, self.home / "prometheus.log")

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> int:
        binary = shutil.which("prometheus")
        if binary is None:
            raise ServiceError("prometheus is not installed: run `make setup` (Debian's prometheus package)")
        self.home.mkdir(parents=True, exist_ok=True)
        self.rules_file.write_text(self.rules)
        config = scrape_config(self.settings, [self.rules_file], self.interval_s)
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        return self.service.start(
            [
                binary,
                f"--config.file={self.config_file}",
                f"--storage.tsdb.path={self.home / 'data'}",
                f"--web.listen-address={self.settings.host}:{self.port}",
                "--web.enable-lifecycle",
            ],
            env={},
            ports={"Prometheus": (self.settings.host, self.port)},
            ready=self._ready,
            timeout_s=timeout_s,
        )

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> bool:
        return self.service.stop()

    # ----- its HTTP API ------------------------------------------------------------------------------
    def _get(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise ServiceError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict]:
        """An instant query's result: a list of ``{"metric": labels, "value": [time, text]}``."""
        return self._get("/api/v1/query", query=promql)["result"]

    def query_range(self, promql: str, start: float, end: float, step_s: float = 1.0) -> list[dict]:
        """A range query's series between two Unix times: ``{"metric": labels, "values": [[time, text], ...]}``."""
        return self._get("/api/v1/query_range", query=promql, start=start, end=end, step=step_s)["result"]

    def targets(self) -> list[dict]:
        return self._get("/api/v1/targets")["activeTargets"]

    def alerts(self) -> list[dict]:
        """The alerts pending or firing now: ``{"labels": ..., "state": "pending" | "firing", ...}``."""
        return self._get("/api/v1/alerts")["alerts"]

    def firing(self, alert: str) -> list[dict]:
        return [a for a in self.alerts() if a["labels"]["alertname"] == alert and a["state"] == "firing"]

    def wait_scraped(self, promql: str, timeout_s: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while not (result := self.query(promql)):
            if time.monotonic() > deadline:
                raise ServiceError(f"Prometheus has no {promql} after {timeout_s:.0f} s: {self.targets()}")
            time.sleep(self.interval_s)
        return result
