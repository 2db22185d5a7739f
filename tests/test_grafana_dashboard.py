"""The Grafana dashboard (docker/grafana/streamstate-dashboard.json) charts only metrics the code exports,
and every metric the code exports has a panel, so a renamed metric breaks this test, not a dashboard.

Pure: the exported names come from ``prometheus_client.REGISTRY`` after importing the modules that
define the metrics (no Spark session, no broker); the dead-letter collector reads Kafka when it is
collected, so here it reads a stub instead."""

from __future__ import annotations

import inspect
import json
import re

import pytest
from prometheus_client import REGISTRY
from prometheus_client.registry import Collector

import spark_jobs.driver.metrics
import spark_jobs.operations.standby.follower
import spark_jobs.state.restore
from runtime.settings import PROJECT_ROOT

DASHBOARD = PROJECT_ROOT / "docker" / "grafana" / "streamstate-dashboard.json"
METRIC_MODULES = (spark_jobs.driver.metrics, spark_jobs.operations.standby.follower, spark_jobs.state.restore)
#: a metric name in PromQL (metric names may hold colons, recording rules' do)
METRIC_NAME = re.compile(r"\bstreamstate_[A-Za-z0-9_:]*")

#: exported metrics deliberately left off the dashboard: family name -> why. Keep it empty if at all possible.
NOT_CHARTED: dict[str, str] = {}

#: the sample names a family of each type exposes, as suffixes of the family name (prometheus_client names
#: a Counter ``X``'s family ``X`` and its samples ``X_total`` and ``X_created``). A labelled metric nobody
#: has set yet has a family but no samples, which is why the names are derived from the type.
SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}
#: samples that describe a series rather than measure anything: no panel needs to chart them
BOOKKEEPING_SUFFIXES = ("_created",)


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict) -> list[dict]:
    """Every panel, including those nested in collapsed rows."""
    panels = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def _queries(dashboard: dict) -> list[str]:
    """Every PromQL expression: the panels' targets and the template variables' queries."""
    queries = [target["expr"] for panel in _panels(dashboard) for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def _custom_collectors() -> dict[str, type]:
    """The Collector classes the metric modules define themselves (not Gauges and Counters)."""
    return {
        f"{module.__name__}.{name}": cls
        for module in METRIC_MODULES
        for name, cls in inspect.getmembers(module, inspect.isclass)
        if Collector in cls.__mro__ and cls is not Collector and cls.__module__ == module.__name__
    }


@pytest.fixture
def exported(monkeypatch) -> dict[str, set[str]]:
    """family name -> the sample names it exports, for every ``streamstate_`` metric of the code."""

    def offsets(kafka, topic, timeout_s=30.0):  # the dead-letter topic's watermarks, without a broker
        return {0: (0, 3)}

    # also covers a DeadLetterCollector another test left registered: collecting it must not reach Kafka
    monkeypatch.setattr(spark_jobs.driver.metrics, "partition_offsets", offsets)
    # DriverMetrics registers the dead-letter collector only while a driver runs: collect one directly
    dead_letters = spark_jobs.driver.metrics.DeadLetterCollector(
        "dashboard-test-v1", "dashboard-test-v1-dead-letter", ""
    )
    families = [*REGISTRY.collect(), *dead_letters.collect()]
    names: dict[str, set[str]] = {}
    for family in families:
        if not family.name.startswith("streamstate_"):
            continue
        assert family.type in SAMPLE_SUFFIXES, f"{family.name}: add the sample names of a {family.type}"
        samples = {family.name + suffix for suffix in SAMPLE_SUFFIXES[family.type]}
        names.setdefault(family.name, set()).update(samples | {sample.name for sample in family.samples})
    return names


def test_the_metric_modules_define_no_collector_this_test_does_not_collect():
    # a new custom collector needs its own stub above, like the dead-letter one, or its metrics go unchecked
    assert set(_custom_collectors()) == {"spark_jobs.driver.metrics.DeadLetterCollector"}


def test_the_dashboard_parses_and_every_panel_says_what_on_call_reads_from_it():
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 39
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["application_id"]["multi"] and variables["application_id"]["includeAll"]
    panels = _panels(dashboard)
    assert panels
    assert len({panel["id"] for panel in panels}) == len(panels), "panel ids repeat"
    for panel in panels:
        if panel["type"] == "row":
            continue
        title = panel.get("title", "")
        assert title.strip(), f"panel {panel['id']} has no title"
        assert panel.get("description", "").strip(), f"panel {title!r} has no description"
        targets = panel.get("targets", [])
        assert targets, f"panel {title!r} has no target"
        for target in targets:
            assert target.get("expr", "").strip(), f"panel {title!r} has a target without an expression"
            assert "$application_id" in target["expr"], f"panel {title!r} ignores the application_id variable"


def test_every_metric_the_dashboard_queries_is_one_the_code_exports(exported):
    known = set().union(*exported.values())
    for query in _queries(_dashboard()):
        unknown = set(METRIC_NAME.findall(query)) - known
        assert not unknown, f"{query!r} names metrics the code does not export: {sorted(unknown)}"


def test_every_metric_the_code_exports_has_a_panel(exported):
    charted = {
        name
        for panel in _panels(_dashboard())
        for target in panel.get("targets", [])
        for name in METRIC_NAME.findall(target["expr"])
    }
    assert not set(NOT_CHARTED) - set(exported), f"NOT_CHARTED names no exported metric: {set(NOT_CHARTED)}"
    assert not set(NOT_CHARTED) & {family for family, samples in exported.items() if samples & charted}
    missing = sorted(
        family
        for family, samples in exported.items()
        if family not in NOT_CHARTED and not {s for s in samples if not s.endswith(BOOKKEEPING_SUFFIXES)} & charted
    )
    assert not missing, f"exported metrics without a panel (chart them, or list them in NOT_CHARTED): {missing}"
