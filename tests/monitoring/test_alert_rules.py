"""The alert rules that ship with the platform (monitoring/alerts.yml): the copy in the repository is what the code
renders, Prometheus' own tool accepts them, their unit tests pass (monitoring/alerts.test.yml), and they name only
metrics the platform exports. Fast: promtool evaluates the rules over series written in the test file; the live
Prometheus that scrapes running jobs and makes each alert fire is tests/production/test_monitoring.py."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from runtime.prometheus import ALERT_RULES_FILE, ALERT_TESTS_FILE, alert_rules, render_alert_rules
from runtime.settings import Settings
from tests.test_grafana_dashboard import METRIC_NAME, exported  # noqa: F401 - a fixture

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool: `make setup` installs Debian's prometheus")


def test_the_shipped_rules_are_what_the_code_renders():
    assert ALERT_RULES_FILE.read_text() == render_alert_rules(Settings()), (
        "monitoring/alerts.yml is stale: `python -m streamstate_cli monitoring --rules-only` rewrites it"
    )


@needs_promtool
def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    check = subprocess.run([PROMTOOL, "check", "rules", str(ALERT_RULES_FILE)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run(
        [PROMTOOL, "test", "rules", ALERT_TESTS_FILE.name], capture_output=True, text=True, cwd=ALERT_TESTS_FILE.parent
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr


def test_every_rule_has_a_unit_test_and_names_only_exported_metrics(exported):  # noqa: F811 - the fixture
    rules = alert_rules(Settings())["groups"][0]["rules"]
    tested = set(re.findall(r"alertname: (\w+)", ALERT_TESTS_FILE.read_text()))
    assert {r["alert"] for r in rules} == tested
    known = set().union(*exported.values())
    named = {name for r in rules for name in METRIC_NAME.findall(r["expr"])}
    assert named and named <= known, f"not exported: {sorted(named - known)}"
