"""The Streaming jobs page as on-call uses it: in Debian's Chromium (headless, through Debian's
chromedriver and Selenium; nothing downloads a browser), against the real Airflow standalone.

Airflow's UI renders, and every link on the Streaming jobs page lands on a working page: a DAG's page
with its Trigger button (never Airflow's "Page Not Found"), the page's JSON, the state API's docs, and
the state-size report, which before the first audit is an HTML page that says what to do. A failure
saves a screenshot in ``<logs>/ui-screenshots/``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

NOT_FOUND = "Page Not Found"  # Airflow 3's UI answer to an unknown route


@pytest.fixture(scope="module")
def browser(settings) -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and chromedriver, "set-up installs Debian's chromium and chromium-driver (scripts/bootstrap.sh)"
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a driver or a browser
    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@contextlib.contextmanager
def screenshot_on_failure(browser, settings, name: str) -> Iterator[None]:
    try:
        yield
    except BaseException:
        folder = settings.logs_dir / "ui-screenshots"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        browser.save_screenshot(str(path))
        print(f"screenshot of the failure: {path} (at {browser.current_url})")
        raise


def _text_appears(browser, text: str, timeout_s: float = 60) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, timeout_s).until(lambda b: text in b.find_element("tag name", "body").text)


def _page_links(browser) -> dict[str, str]:
    """text -> href (as written in the page) of every link of the Streaming jobs page."""
    anchors = browser.find_elements("tag name", "a")
    return {a.text.strip(): a.get_attribute("href") for a in anchors if a.get_attribute("href")}


def test_every_link_of_the_jobs_page_lands_on_a_working_page(settings, airflow, browser):
    base = settings.airflow_url
    with screenshot_on_failure(browser, settings, "airflow-home"):
        browser.get(f"{base}/")
        _text_appears(browser, "Dags")  # Airflow's React UI rendered

    with screenshot_on_failure(browser, settings, "jobs-page"):
        browser.get(f"{base}/streamstate/")
        _text_appears(browser, "purchase_counts")
        links = _page_links(browser)
    dag_links = {text: href for text, href in links.items() if urllib.parse.urlparse(href).path.startswith("/dags/")}
    assert {"supervision", "start", "stop", "drain", "reprocess", "changelogs"} <= set(dag_links), links

    for text, href in sorted(dag_links.items()):
        dag_id = urllib.parse.urlparse(href).path.split("/")[2]
        with screenshot_on_failure(browser, settings, f"link-{text}"):
            browser.get(href)
            _text_appears(browser, dag_id)
            body = browser.find_element("tag name", "body").text
            assert NOT_FOUND not in body, f"{text} -> {href}: Airflow's 404 page"
            buttons = [b.text for b in browser.find_elements("tag name", "button")]
            assert any("Trigger" in b for b in buttons), f"{text} -> {href}: no Trigger button in {buttons}"

    # the page's other links (its JSON, the received alerts, the state API's docs, the report): no error
    for text, href in sorted(links.items()):
        if href in dag_links.values() or text == "Spark UI" or not href.startswith(base):
            continue
        with screenshot_on_failure(browser, settings, f"link-{text.replace('/', '-')}"):
            browser.get(href)
            body = browser.find_element("tag name", "body").text
            assert NOT_FOUND not in body and '"detail"' not in body[:100], f"{text} -> {href}: {body[:300]}"

    with screenshot_on_failure(browser, settings, "state-audit"):
        browser.get(f"{base}/streamstate/state-audit/")
        body = browser.find_element("tag name", "body").text
        assert not body.lstrip().startswith("{"), f"raw JSON instead of a page: {body[:200]}"
        assert "State size audit" in body
        if "No report yet" in body:  # before the first audit: the next step, linked
            link = browser.find_element("link text", "its DAG page").get_attribute("href")
            assert Path(urllib.parse.urlparse(link).path) == Path("/dags/audit_state_size")
