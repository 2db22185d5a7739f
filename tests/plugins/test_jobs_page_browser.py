"""The Streaming jobs page in a real browser (tests/plugins/airflow_ui.py), against the real Airflow
standalone: Airflow's UI renders, Browse -> Streaming jobs opens the page, and every link on the page
lands on a working page: a DAG's page with its Trigger button (never Airflow's "Page Not Found"), the
received alerts, the page's JSON, the state API's docs, and the state-size report, which before the
first audit is an HTML page that says what to do. A failure saves a screenshot in
``<logs>/ui-screenshots/``.
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
