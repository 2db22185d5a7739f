"""Airflow's UI driven the way on-call uses it: Debian's Chromium (headless) through Debian's
chromedriver and Selenium. Nothing downloads a browser or a driver (``SE_OFFLINE``).

:class:`AirflowUi` knows Airflow 3's pages: a DAG's **Trigger** form (its run parameters are inputs
named ``element_<param>``; a select is a combobox one types into), the run page it lands on, and a
task's log. Screenshots go to ``<logs>/ui-screenshots/``; :meth:`AirflowUi.screenshot_on_failure`
keeps one of every failure.

A page left open keeps working: Airflow's React pages refetch every ``auto_refresh_interval`` (3 s) while a run
is active, and the jobs page reloads itself every 10 s; in a suite run a renderer left on one took a third of a
core for five minutes, and the API server answered it, both taken from the drivers under test. The browser is
parked on ``about:blank`` (:meth:`AirflowUi.park`) once a trigger or a log has been read and after every test
(``tests/plugins/conftest.py``): the two browser modules took 114 CPU-s of Chromium and 106 of Airflow's
processes against 142 and 119 left open (one run each, one after the other, 2026-12-07).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

NOT_FOUND = "Page Not Found"  # Airflow 3's UI answer to an unknown route


@contextlib.contextmanager
def chromium() -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary, driver_binary = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver_binary, "set-up installs Debian's chromium and chromium-driver (scripts/bootstrap.sh)"
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a driver or a browser
    options = Options()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_binary))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class AirflowUi:
    def __init__(self, browser, base_url: str, screenshots: Path) -> None:
        self.browser = browser
        self.base = base_url.rstrip("/")
        self.screenshots = screenshots

    # -- pages -------------------------------------------------------------------------------------

    def open(self, path: str) -> None:
        self.browser.get(self.base + path if path.startswith("/") else path)

    def park(self) -> None:
        """Leave the page for an empty one, which neither polls Airflow nor renders (see the module's docstring)."""
        self.browser.get("about:blank")

    def body(self) -> str:
        """The page's text; "" while a navigation replaces the page under the read."""
        from selenium.common.exceptions import (
            NoSuchElementException,
            StaleElementReferenceException,
            WebDriverException,
        )

        try:
            return self.browser.find_element("tag name", "body").text
        except (NoSuchElementException, StaleElementReferenceException):  # the next page is not there yet
            return ""
        except WebDriverException as err:
            # chromedriver reports a body replaced between its lookup and its read this way, not as stale
            if "does not belong to the document" in str(err):
                return ""
            raise

    def wait_for_text(self, text: str, timeout_s: float = 60, reload_every_s: float | None = None) -> str:
        """Wait until ``text`` is on the page (reloading it every ``reload_every_s``); the page's text."""
        deadline = time.monotonic() + timeout_s
        reloaded = time.monotonic()
        while True:
            body = self.body()
            if text in body:
                return body
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{text!r} not on {self.browser.current_url} after {timeout_s:.0f}s:\n{body[-2000:]}"
                )
            if reload_every_s is not None and time.monotonic() - reloaded > reload_every_s:
                self.browser.refresh()
                reloaded = time.monotonic()
            time.sleep(0.5)

    def links(self) -> dict[str, str]:
        """text -> href of every link of the page."""
        anchors = self.browser.find_elements("tag name", "a")
        return {a.text.strip(): a.get_attribute("href") for a in anchors if a.get_attribute("href")}

    def wait_for_button(self, label: str, timeout_s: float = 30) -> list[str]:
        """Wait until a button whose text holds ``label`` is on the page (React renders a DAG's header
        after its name shows in the breadcrumb); the texts of the page's buttons."""
        from selenium.common.exceptions import StaleElementReferenceException

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                buttons = [b.text for b in self.browser.find_elements("tag name", "button")]
            except StaleElementReferenceException:  # re-rendered under the read
                buttons = []
            if any(label in text for text in buttons) or time.monotonic() > deadline:
                return buttons
            time.sleep(0.5)

    def button(self, label: str, within=None):
        scope = within or self.browser
        return next(b for b in scope.find_elements("tag name", "button") if b.text.strip() == label)

    def save_screenshot(self, name: str) -> Path:
        self.screenshots.mkdir(parents=True, exist_ok=True)
        path = self.screenshots / f"{name}.png"
        self.browser.save_screenshot(str(path))
        return path

    @contextlib.contextmanager
    def screenshot_on_failure(self, name: str) -> Iterator[None]:
        try:
            yield
        except BaseException:
            path = self.save_screenshot(name)
            print(f"screenshot of the failure: {path} (at {self.browser.current_url})")
            raise

    # -- Airflow's trigger form, runs and logs -------------------------------------------------------

    def trigger(self, dag_id: str, **params) -> str:
        """Fill the DAG's Trigger form as a person would (the DAG is unpaused on trigger, the form's
        default) and press Trigger; the run id of the run page it lands on. A value of ``params`` goes
        to its ``element_<name>`` input: a string is typed (into a select's combobox: then chosen), a
        bool sets a switch."""
        from selenium.common.exceptions import ElementClickInterceptedException, StaleElementReferenceException
        from selenium.webdriver.common.keys import Keys
        from selenium.webdriver.support.ui import WebDriverWait

        self.open(f"/dags/{dag_id}")

        def open_form(browser):  # React re-renders the page while it loads: press Trigger until the form is up
            dialogs = browser.find_elements("css selector", "[role=dialog]")
            form = next((d for d in dialogs if d.is_displayed() and "Trigger Dag" in d.text), None)
            if form is None:
                self.button("Trigger").click()
            return form

        retried = (StopIteration, StaleElementReferenceException, ElementClickInterceptedException)
        form = WebDriverWait(self.browser, 60, ignored_exceptions=retried).until(open_form)
        for name, value in params.items():
            field = form.find_element("name", f"element_{name}")
            if isinstance(value, bool):
                if field.is_selected() != value:  # a switch: its input is hidden behind the control
                    self.browser.execute_script("arguments[0].click()", field)
            elif field.get_attribute("type") == "hidden":  # a select: its combobox sits before it
                combo = field.find_element("xpath", "preceding::input[@role='combobox'][1]")
                combo.click()
                combo.send_keys(str(value))
                combo.send_keys(Keys.ENTER)
            else:
                field.clear()
                field.send_keys(str(value))
        for name, value in params.items():
            shown = form.find_element("name", f"element_{name}")
            got = shown.is_selected() if isinstance(value, bool) else shown.get_attribute("value")
            assert got == (value if isinstance(value, bool) else str(value)), (
                f"{dag_id} form: {name} is {got!r}, not {value!r}"
            )
        self.button("Trigger", within=form).click()
        WebDriverWait(self.browser, 30).until(lambda b: "/runs/" in b.current_url)
        run_id = urllib.parse.unquote(self.browser.current_url.split("/runs/", 1)[1].split("/")[0])
        self.park()  # the run page refetches every 3 s while the run is active: the test waits through the API
        return run_id

    def task_log(self, dag_id: str, run_id: str, task_id: str, expect: str, timeout_s: float = 60) -> str:
        """The task's log page, once it shows ``expect``; the page's text."""
        self.open(f"/dags/{dag_id}/runs/{urllib.parse.quote(run_id)}/tasks/{task_id}")
        text = self.wait_for_text(expect, timeout_s, reload_every_s=5)
        self.park()
        return text
