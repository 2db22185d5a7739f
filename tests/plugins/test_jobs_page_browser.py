"""The Streaming jobs page in a real browser (tests/plugins/airflow_ui.py), against the real Airflow
standalone: Airflow's UI renders, Browse -> Streaming jobs opens the page, and every link on the page
lands on a working page: a DAG's page with its Trigger button (never Airflow's "Page Not Found"), the
received alerts, the page's JSON, the state API's docs, and the state-size report, which before the
first audit is an HTML page that says what to do; and a job's open alerts of all four sources (the alert
ledger) are listed in its row. A failure saves a screenshot in ``<logs>/ui-screenshots/``.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest

from tests.plugins.airflow_ui import NOT_FOUND

pytestmark = pytest.mark.integration


def test_every_link_of_the_jobs_page_lands_on_a_working_page(settings, ui):
    from selenium.webdriver.support.ui import WebDriverWait

    with ui.screenshot_on_failure("browse-menu"):  # the way on-call gets there: Browse -> Streaming jobs
        ui.open("/")
        ui.wait_for_text("Dags")  # Airflow's React UI rendered
        ui.button("Browse").click()
        ui.browser.find_element("xpath", "//*[@role='menuitem'][normalize-space()='Streaming jobs']").click()
        WebDriverWait(ui.browser, 30).until(lambda b: "/plugin/streaming-jobs" in b.current_url)
        frame = WebDriverWait(ui.browser, 30).until(lambda b: b.find_element("tag name", "iframe"))
        ui.browser.switch_to.frame(frame)
        ui.wait_for_text("purchase_counts")  # the jobs page, inside Airflow's frame
        ui.browser.switch_to.default_content()

    with ui.screenshot_on_failure("jobs-page"):
        ui.open("/streamstate/")
        ui.wait_for_text("purchase_counts")
        links = ui.links()
    dag_links = {text: href for text, href in links.items() if urllib.parse.urlparse(href).path.startswith("/dags/")}
    assert {"supervision", "start", "stop", "drain", "reprocess", "promote", "changelogs"} <= set(dag_links), links

    for text, href in sorted(dag_links.items()):
        dag_id = urllib.parse.urlparse(href).path.split("/")[2]
        with ui.screenshot_on_failure(f"link-{text}"):
            ui.open(href)
            body = ui.wait_for_text(dag_id)
            assert NOT_FOUND not in body, f"{text} -> {href}: Airflow's 404 page"
            buttons = ui.wait_for_button("Trigger")
            assert any("Trigger" in b for b in buttons), f"{text} -> {href}: no Trigger button in {buttons}"

    # the page's other links (received alerts, its JSON, the state API's docs, the report): no error
    for text, href in sorted(links.items()):
        if href in dag_links.values() or text == "Spark UI" or not href.startswith(ui.base):
            continue
        with ui.screenshot_on_failure(f"link-{text.replace('/', '-')}"):
            ui.open(href)
            body = ui.body()
            assert NOT_FOUND not in body and '"detail"' not in body[:100], f"{text} -> {href}: {body[:300]}"

    with ui.screenshot_on_failure("state-audit"):
        ui.open("/streamstate/state-audit/")
        body = ui.body()
        assert not body.lstrip().startswith("{"), f"raw JSON instead of a page: {body[:200]}"
        assert "State size audit" in body
        if "No report yet" in body:  # before the first audit: the next step, linked
            link = ui.browser.find_element("link text", "its DAG page").get_attribute("href")
            assert Path(urllib.parse.urlparse(link).path) == Path("/dags/audit_state_size")


#: one open alert of each source: (source, condition, severity)
SEEDED = (
    ("supervision", "no_progress", "critical"),
    ("standby", "standby_down", "error"),
    ("changelog_tuning", "changelog_replay_counts", "warning"),
    ("state_audit", "state_budget_counts", "error"),
)


def test_the_jobs_page_lists_the_open_alerts_of_every_source(settings, ui, monkeypatch):
    """Alerts opened through the ledger (as the four checks open them; delivery is a stand-in here) are
    all in the job's row, each with its source, severity and since when; resolved, they are gone."""
    from streamstate.alert_ledger import AlertLedger
    from streamstate.supervision import Condition

    from spark_jobs.versions import JobVersions

    monkeypatch.setattr("streamstate.notifiers.routing.send", lambda alert, context: {"webhook": "sent"})
    spec = JobVersions(settings).current_spec("purchase_counts")
    ledger = AlertLedger(settings.status_dir)

    def seed(holding: bool) -> None:
        for source, name, severity in SEEDED:
            ledger.reconcile_and_send(
                {},
                job=spec.name,
                application_id=spec.application_id,
                source=source,
                conditions=[Condition(name, severity, f"{name} (seeded by the test)", {}, "")] if holding else [],
                scope=None if source in ("supervision", "standby") else {name},
            )

    seed(holding=True)
    try:
        assert len(ledger.open_alerts(spec.application_id)) == len(SEEDED)
        with ui.screenshot_on_failure("open-alerts"):
            ui.open("/streamstate/")
            ui.wait_for_text("state_budget_counts", reload_every_s=5)
            row = f"//tr[td[1]/b[normalize-space()='{spec.name}']]"
            cell = ui.browser.find_element("xpath", f"{row}/td[count(//th[.='Open alerts']/preceding-sibling::th)+1]")
            lines = cell.text.splitlines()
            for source, name, severity in SEEDED:
                (line,) = [line for line in lines if line.startswith(f"{name} ")]
                assert f"{severity} · {source} · since " in line, lines
                shown = cell.find_element("xpath", f".//span[normalize-space()='{name}']")
                assert shown.get_attribute("class") == f"sev-{severity}"
                assert shown.get_attribute("title") == f"{name} (seeded by the test)"
    finally:
        seed(holding=False)
    assert ledger.open_alerts(spec.application_id) == []
    ui.open("/streamstate/")
    ui.wait_for_text(spec.name)
    assert "state_budget_counts" not in ui.body()
