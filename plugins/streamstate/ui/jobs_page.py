"""The "Streaming jobs" page of the Airflow UI: every registered job with its live numbers.

A FastAPI app mounted by the Airflow API server under ``/streamstate`` (see
``plugins/streamstate_plugin.py``):

- ``GET /streamstate/``: the page (HTML, refreshes itself every 10 s);
- ``GET /streamstate/api/jobs``: the same as JSON;
- ``POST /streamstate/api/alerts``: a webhook inbox (the embedded stack's default alert webhook);
  ``GET /streamstate/alerts`` shows the latest alerts received as a page, ``GET /streamstate/api/alerts``
  as JSON;
- ``GET /streamstate/state-audit/``: the state-size report (HTML + PNG charts) of the audit DAG;
- ``GET /streamstate/lookup``: a key looked up through the state query API (``/state-api``), as a page.

Everything shown comes from the files the drivers and supervision publish (status, lease,
supervision record, the alert ledger), so the page costs no Spark and works while a job is down. What a
row holds is :mod:`streamstate.ui.view_model` (typed, also the JSON); how it looks is the Jinja templates
in ``templates/`` (autoescaped); this module only routes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jinja2
from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse
from markupsafe import Markup
from streamstate.alerts import RESOLVED, Alert
from streamstate.ui.view_model import JobRow, job_rows

from runtime.files import exclusive, write_atomically
from runtime.settings import Settings
from spark_jobs.documents import to_json
from spark_jobs.state.fencing import describe_batch

app = FastAPI(title="streamstate: streaming jobs", docs_url=None, redoc_url=None)
INBOX_KEEP = 200


def _settings() -> Settings:
    return Settings.from_env()


def _cell(value) -> str:
    """A number as on-call reads it (thousands separated), a dash for nothing."""
    if value is None or value == {}:
        return Markup('<span class="dim">–</span>')
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _size(n) -> str:
    if not n:
        return _cell(None)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:,.0f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def _snapshot_rows(snapshot) -> str:
    """A snapshot's size: its live rows, or for a layer (whose live rows are not counted) what it wrote."""
    if snapshot.rows is not None:
        return f"{snapshot.rows:,} rows"
    return f"layer {snapshot.layers} ({snapshot.layer_rows:,} rows on a base of {snapshot.base_rows or 0:,})"


_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)
_TEMPLATES.filters.update(
    cell=_cell,
    size=_size,
    batch=lambda batch_id: describe_batch(batch_id) if batch_id is not None else None,
    snapshot_rows=_snapshot_rows,
    utc=lambda at: time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)),
)


def render(template: str, **values) -> str:
    return _TEMPLATES.get_template(template).render(**values)


def render_rows(rows: list[JobRow]) -> str:
    """The jobs page for these rows."""
    return render("jobs.html", rows=rows, refresh=10, chosen="", key="", window_start=None)


@app.get("/api/jobs")
def jobs() -> dict:
    return {"generated_at": time.time(), "jobs": [to_json(row) for row in job_rows(_settings())]}


def _inbox(settings: Settings) -> Path:
    return settings.status_dir / "alerts-inbox.jsonl"


@app.post("/api/alerts")
def receive_alert(alert: dict) -> dict:
    """Keep an alert (the newest :data:`INBOX_KEEP`). A plain function: FastAPI runs it in its thread pool,
    and concurrent posts take turns on the inbox's lock, so none is lost to another's rewrite."""
    path = _inbox(_settings())
    with exclusive(path):
        lines = path.read_text().splitlines()[-(INBOX_KEEP - 1) :] if path.exists() else []
        lines.append(json.dumps({"received_at": time.time(), **alert}))
        write_atomically(path, "\n".join(lines) + "\n")
    return {"ok": True}


@app.get("/api/alerts")
def alerts() -> dict:
    path = _inbox(_settings())
    lines = path.read_text().splitlines() if path.exists() else []
    return {"alerts": [json.loads(line) for line in reversed(lines)]}


def _received_alerts(settings: Settings) -> list[tuple[float, Alert]]:
    """(received at, alert) of the inbox, newest first; a body that is not an alert is skipped."""
    path = _inbox(settings)
    received = []
    for line in reversed(path.read_text().splitlines() if path.exists() else []):
        body = json.loads(line)
        try:
            received.append((body["received_at"], Alert.from_dict(body)))
        except (KeyError, TypeError):
            continue
    return received


@app.get("/alerts", response_class=HTMLResponse)
def alerts_page() -> str:
    """The alerts the inbox received, newest first: what on-call was told, and the next step."""
    return render("alerts.html", received=_received_alerts(_settings()), resolved=RESOLVED, refresh=10)


@app.get("/state-audit/{name}")
def state_audit_report(name: str):
    """The audit DAG's report files: ``index.html`` and the charts (only names, no paths)."""
    from spark_jobs.operations.state_audit.report import report_dir

    folder = report_dir(_settings())
    if name == "" or "/" in name or name.startswith(".") or not (name.endswith(".html") or name.endswith(".png")):
        raise HTTPException(404, "no such report file")
    path = folder / name
    if not path.is_file():
        raise HTTPException(404, "no report yet: the audit_state_size DAG writes it on every run")
    # A file response carries Last-Modified, from which a browser would reuse the page for a while
    # without asking (heuristic freshness): on-call would see the previous audit after a new one.
    return FileResponse(path, headers={"Cache-Control": "no-cache"})


@app.get("/state-audit/", response_class=HTMLResponse)
def state_audit_index():
    from spark_jobs.operations.state_audit.report import report_dir

    if not (report_dir(_settings()) / "index.html").is_file():
        return HTMLResponse(render("audit_missing.html", refresh=None), status_code=404)
    return state_audit_report("index.html")


@app.get("/lookup", response_class=HTMLResponse)
def lookup(target: str = "", key: str = "", window_start: str = ""):
    """One key through the state query API's service (in-process), shown as a page. ``window_start``
    is a string: the page's form sends it empty for a store without windows."""
    from streamstate.state_api.app import app as state_api
    from streamstate.state_api.keys import InvalidKey
    from streamstate.state_api.service import UnknownStore

    job, _, store = target.partition("/")
    status, shown = 200, {"error": None, "notice": None, "answer": None, "facts": [], "answer_value": ""}
    window = int(window_start) if window_start.strip().isdigit() else None
    if window_start.strip() and window is None:
        status, shown["error"] = 422, f"window start {window_start!r}: a number of milliseconds"
    elif _settings().state_api_token:
        # The page has no way to hold the token; the API itself stays closed to callers without it.
        status = 403
        shown["notice"] = "State lookups need the API token here: query <code>/state-api</code> with it."
    else:
        service = state_api.state.service
        try:
            answer = service.get(*service.resolve(job, store), key, window)
        except (UnknownStore, InvalidKey) as err:
            status, shown["error"] = 422, str(err)
        else:
            shown["answer"] = answer
            shown["facts"] = [
                ("found", "yes" if answer["found"] else "no"),
                ("source", answer["source"]),
                ("fallback reason", answer["fallback_reason"]),
                ("job state", answer["job_state"]),
                ("batch", answer["batch_id"]),
                ("snapshot version", answer["snapshot_version"]),
                ("as of", answer["as_of"]),
                ("staleness (ms)", answer["staleness_ms"]),
            ]
            shown["answer_value"] = json.dumps(answer["value"], indent=2)
    rows = job_rows(_settings())
    page_html = render("lookup.html", rows=rows, chosen=target, key=key, window_start=window, refresh=None, **shown)
    return HTMLResponse(page_html, status_code=status)


@app.get("/", response_class=HTMLResponse)
def page() -> str:
    return render_rows(job_rows(_settings()))
