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
supervision record, the alert ledger), so the page costs no Spark and works while a job is down.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse
from streamstate.alert_ledger import AlertLedger
from streamstate.alerts import RESOLVED, Alert
from streamstate.supervision import DESIRED_STOPPED, read_record

from runtime.files import exclusive, write_atomically
from runtime.settings import Settings
from spark_jobs.documents import to_json
from spark_jobs.lease import JobLease
from spark_jobs.lifecycle import observe_driver, read_standby_status
from spark_jobs.registry import JobSpec, registered_versions
from spark_jobs.standby.follower import standby_running
from spark_jobs.state.fencing import describe_batch
from spark_jobs.versions import JobVersions

app = FastAPI(title="streamstate: streaming jobs", docs_url=None, redoc_url=None)
INBOX_KEEP = 200


def _settings() -> Settings:
    return Settings.from_env()


def _changelog_tuning(settings: Settings) -> dict:
    """topic -> newest measurement, written by the tune_changelog_compaction DAG; empty before its first run."""
    path = settings.status_dir / "changelog_tuning" / "latest.json"
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        return {}


def _open_alerts(settings: Settings, application_id: str) -> list[dict]:
    """The job version's open alerts of every source (the alert ledger), oldest first."""
    return [
        {
            "source": a.source,
            "condition": a.condition,
            "severity": a.severity,
            "summary": a.summary,
            "since": a.opened_at,
            "dedup_key": a.dedup_key,
        }
        for a in AlertLedger(settings.status_dir).open_alerts(application_id)
    ]


def job_view(spec: JobSpec, settings: Settings) -> dict:
    """One job's row: lifecycle, supervision, the latest progress numbers, snapshots, restore, alerts."""
    driver = observe_driver(settings.status_dir, spec.application_id)
    status, holder, alive = driver.status, driver.holder, driver.alive
    record = read_record(settings.status_dir, spec.application_id)
    progress = status.progress if status else None
    measured = _changelog_tuning(settings)
    standby = read_standby_status(settings.status_dir, spec.application_id)
    standby_alive = standby_running(settings.status_dir, spec.application_id) is not None
    return {
        "job": spec.name,
        "application_id": spec.application_id,
        "version": spec.version,
        "lifecycle_state": driver.state,
        # the one answer on-call reads: "RUNNING at batch 12", or "DOWN since ..., last RUNNING at batch 12"
        "lifecycle_summary": driver.summary(),
        "last_published_state": status.state.value if status else None,
        "supervision": {
            "state": record.last_assessment.get("state"),
            "action": record.last_assessment.get("action"),
            "reason": record.last_assessment.get("reason"),
            "desired": record.desired,
            "stop_reason": record.stop_reason,
            "crash_looping": record.crash_loop_since is not None,
            "last_check_at": record.last_check_at,
            "launches": len(record.launches),
            "launched_by": record.last_launch.by if record.last_launch else None,
        },
        "driver": {"pid": holder.pid, "host": holder.host, "lease_epoch": holder.epoch} if holder else None,
        "input_lag_records": progress.total_lag if progress else None,
        "batch_id": progress.batch_id if progress else None,
        "batch_duration_ms": progress.batch_duration_ms if progress else None,
        "processed_rows_per_second": progress.processed_rows_per_second if progress else None,
        "state_rows": progress.state_rows if progress else None,
        "state_memory_bytes": progress.state_memory_bytes if progress else None,
        "progress_at": progress.progress_at if progress else None,
        "idle_at": status.idle_at if status else None,
        "snapshots": {s: to_json(v) for s, v in status.snapshots.items()} if status else {},
        "standby": {
            "running": standby_alive,
            "state": standby.state.value if standby and standby_alive else "NOT_RUNNING",
            "lag_ms": standby.lag_ms if standby and standby_alive else None,
            "stores": {
                name: {"batch_id": v.batch_id, "rows": v.rows, "lag_ms": v.lag_ms}
                for name, v in (standby.stores if standby else {}).items()
            },
        },
        "stores": [{"store": s.name, "kind": s.kind} for s in spec.stores],
        "restore": {s: to_json(v) for s, v in status.restore.items()} if status else {},
        "error": status.error if status else None,
        "open_alerts": _open_alerts(settings, spec.application_id),
        "changelogs": {m["store"]: m for m in measured.values() if m["application_id"] == spec.application_id},
        "links": {
            "supervise_dag": f"/dags/supervise__{spec.name}",
            # Airflow 3's UI has no trigger URL: a DAG's page opens its form with the Trigger button
            "start_dag": "/dags/start_streaming_job",
            "stop_dag": "/dags/stop_streaming_job",
            "drain_dag": f"/dags/drain__{spec.name}",
            "reprocess_dag": "/dags/reprocess_job",
            "promote_dag": "/dags/promote_job_version",
            "tune_dag": "/dags/tune_changelog_compaction",
            "spark_ui": status.spark_ui if status and alive else None,
        },
    }


@app.get("/api/jobs")
def jobs() -> dict:
    settings = _settings()
    pointer = JobVersions(settings)
    views = []
    for name, versions in registered_versions().items():
        view = job_view(pointer.current_spec(name), settings)
        # other versions with a live driver: a side-by-side reprocessing, or a retired one still stopping
        view["other_versions_running"] = [
            v
            for v, spec in versions.items()
            if v != view["version"] and JobLease(settings.status_dir, spec.application_id).holder() is not None
        ]
        views.append(view)
    return {"generated_at": time.time(), "jobs": views}


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
    received = _received_alerts(_settings())
    rows = "\n".join(
        f"""<tr><td>{time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))} UTC</td>
<td class="{"dim" if alert.status == RESOLVED else "sev-" + html.escape(alert.severity)}">{html.escape(alert.title)}</td>
<td>{html.escape(alert.summary)}<br><span class="dim">{html.escape(", ".join(f"{k}={v}" for k, v in alert.numbers.items()))}</span></td>
<td>{html.escape(alert.next_step)}</td><td class="dim">{html.escape(alert.dedup_key)}</td></tr>"""
        for at, alert in received
    )
    body = (
        f"""<table><thead><tr><th>Received</th><th>Alert</th><th>What happened</th><th>Next step</th><th>Dedup key</th></tr>
</thead><tbody>{rows}</tbody></table>"""
        if received
        else """<p>No alert received yet. Supervision (<code>supervise__&lt;job&gt;</code>), the state-size audit and
the changelog tuning send alerts here (the <code>streamstate_webhook</code> connection) when a condition
starts to hold, and once more when it clears.</p>"""
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>Received alerts</title><style>{_STYLE}</style></head><body><h2>Received alerts</h2>{body}
<p class="dim">Refreshes every 10 s. <a href="./">Streaming jobs</a> · JSON: <a href="api/alerts">api/alerts</a></p>
</body></html>"""


def _cell(value) -> str:
    if value is None or value == {}:
        return '<span class="dim">–</span>'
    if isinstance(value, float):
        value = f"{value:,.1f}"
    elif isinstance(value, int):
        value = f"{value:,}"
    return html.escape(str(value))


def _bytes(n) -> str:
    if not n:
        return _cell(None)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:,.0f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def _snapshot_rows(snapshot: dict) -> str:
    """A snapshot's size: its live rows, or for a layer (whose live rows are not counted) what it wrote."""
    if snapshot.get("rows") is not None:
        return f"{snapshot['rows']:,} rows"
    return f"layer {snapshot.get('layers', '?')} ({snapshot.get('layer_rows', 0):,} rows on a base of {snapshot.get('base_rows') or 0:,})"


def _row(job: dict) -> str:
    state = job["lifecycle_state"]
    snapshots = "<br>".join(
        f"{html.escape(s)}: batch {describe_batch(v.get('batch_id'))}, {_snapshot_rows(v)}, "
        f"{html.escape(str(v.get('taken_at', '')))}"
        for s, v in job["snapshots"].items()
    )
    standby = job["standby"]
    if standby["running"]:
        snapshots += "".join(
            f"<br>standby {html.escape(s)}: batch {_cell(describe_batch(v['batch_id']))}, {_cell(v['rows'])} rows, "
            f"lag {(v['lag_ms'] or 0) / 1000:.1f} s"
            for s, v in standby["stores"].items()
        )
    elif job["stores"]:
        snapshots += '<br><span class="dim">standby not running</span>'
    restore = "<br>".join(
        f"{html.escape(s)}: {v.get('records_read', v.get('changelog_records_read', 0)):,} records"
        + (f" in {v['seconds']:.1f}s" if v.get("seconds") is not None else " (running)")
        for s, v in job["restore"].items()
    )
    alerts = "<br>".join(
        f'<span class="sev-{html.escape(a["severity"])}" title="{html.escape(a["summary"])}">'
        f"{html.escape(a['condition'])}</span> "
        f'<span class="dim">{html.escape(a["severity"])} · {html.escape(a["source"])} · since {html.escape(a["since"])}</span>'
        for a in job["open_alerts"]
    )
    others = job.get("other_versions_running") or []
    beside = f'<br><span class="dim">also running: {", ".join(f"v{v}" for v in others)}</span>' if others else ""
    links = job["links"]
    spark = f'<a target="_blank" href="{html.escape(links["spark_ui"])}">Spark UI</a>' if links["spark_ui"] else ""
    sup = job["supervision"]
    # a stop request is news before the next check assesses it: show it at once
    why = f"stopped on request: {sup['stop_reason']}" if sup["desired"] == DESIRED_STOPPED else sup["reason"]
    changelogs = "<br>".join(
        f"{html.escape(store)}: {m['records']:,} / {m['live_keys']:,} "
        f'<span class="{"sev-warning" if m["excess_replay_ratio"] > m["target"] else "dim"}">({m["replay_ratio"]:.1f}x)</span>'
        for store, m in job.get("changelogs", {}).items()
    )
    return f"""<tr>
<td><b>{html.escape(job["job"])}</b><br><span class="dim">{html.escape(job["application_id"])}</span>{beside}</td>
<td class="state-{html.escape(state)}">{html.escape(job["lifecycle_summary"])}</td>
<td>{_cell(sup["state"])}<br><span class="dim">{_cell(why)}</span></td>
<td class="num">{_cell(job["input_lag_records"])}</td>
<td class="num">{_cell(job["batch_id"])}</td>
<td class="num">{_cell(job["batch_duration_ms"])}</td>
<td class="num">{_cell(job["state_rows"])}<br>{_bytes(job["state_memory_bytes"])}</td>
<td>{snapshots or _cell(None)}</td>
<td>{restore or _cell(None)}</td>
<td>{changelogs or _cell(None)}</td>
<td>{alerts or '<span class="dim">none</span>'}</td>
<td><a target="_top" href="{links["supervise_dag"]}">supervision</a> · <a target="_top" href="{links["start_dag"]}">start</a>
 · <a target="_top" href="{links["stop_dag"]}">stop</a> · <a target="_top" href="{links["drain_dag"]}">drain</a>
 · <a target="_top" href="{links["reprocess_dag"]}">reprocess</a> · <a target="_top" href="{links["promote_dag"]}">promote</a>
 · <a target="_top" href="{links["tune_dag"]}">changelogs</a> {spark}</td>
</tr>"""


@app.get("/state-audit/{name}")
def state_audit_report(name: str):
    """The audit DAG's report files: ``index.html`` and the charts (only names, no paths)."""
    from spark_jobs.state_audit.report import report_dir

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
    from spark_jobs.state_audit.report import report_dir

    if not (report_dir(_settings()) / "index.html").is_file():
        return HTMLResponse(
            f"""<!doctype html><html><head><meta charset="utf-8"><title>State size audit</title>
<style>{_STYLE}</style></head><body><h2>State size audit</h2>
<p>No report yet. The <b>audit_state_size</b> DAG writes this page on every run (hourly once it is
unpaused). To have one now, open <a target="_top" href="/dags/audit_state_size">its DAG page</a> and
press <b>Trigger</b>; the page is here when the run has finished.</p>
<p><a href="../">Back to the Streaming jobs page</a></p></body></html>""",
            status_code=404,
        )
    return state_audit_report("index.html")


_STYLE = """body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1a202c; }
table { border-collapse: collapse; width: 100%; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #e2e8f0; padding: 0.4rem 0.6rem; text-align: left; vertical-align: top; }
th { background: #f7fafc; } .num { text-align: right; font-variant-numeric: tabular-nums; }
.dim { color: #718096; font-size: 0.8rem; } .state-RUNNING { color: #2f855a; font-weight: 600; }
.state-ERROR, .sev-critical, .sev-error { color: #c53030; font-weight: 600; } .sev-warning { color: #b7791f; }
.state-RESTORING { color: #2b6cb0; font-weight: 600; }"""


def _lookup_form(views: list[dict], chosen: str = "", key: str = "", window_start: int | None = None) -> str:
    options = "".join(
        f'<option value="{html.escape(v["job"])}/{html.escape(s["store"])}"'
        f"{' selected' if chosen == v['job'] + '/' + s['store'] else ''}>{html.escape(v['job'])} / {html.escape(s['store'])}"
        f"{' (windowed)' if s['kind'] == 'windowed' else ''}</option>"
        for v in views
        for s in v["stores"]
    )
    return f"""<form action="lookup" method="get"><b>Look up a key</b>
<select name="target">{options}</select> <input name="key" placeholder="key, e.g. user-17" value="{html.escape(key)}" required>
<input name="window_start" type="number" min="0" placeholder="window start (ms), windowed stores"
 value="{window_start if window_start is not None else ""}"> <button>Look up</button>
<span class="dim">answered live while the job runs, else from its warm standby; API: <a href="/state-api/docs">/state-api/docs</a></span></form>"""


@app.get("/lookup", response_class=HTMLResponse)
def lookup(target: str = "", key: str = "", window_start: str = ""):
    """One key through the state query API's service (in-process), shown as a page. ``window_start``
    is a string: the page's form sends it empty for a store without windows."""
    from streamstate.state_api.app import app as state_api
    from streamstate.state_api.keys import InvalidKey
    from streamstate.state_api.service import UnknownStore

    views = jobs()["jobs"]
    job, _, store = target.partition("/")
    status, body = 200, ""
    window = int(window_start) if window_start.strip().isdigit() else None
    if window_start.strip() and window is None:
        status, body = (
            422,
            f'<p class="sev-error">window start {html.escape(window_start)!r}: a number of milliseconds</p>',
        )
    elif _settings().state_api_token:
        # The page has no way to hold the token; the API itself stays closed to callers without it.
        status, body = 403, "<p>State lookups need the API token here: query <code>/state-api</code> with it.</p>"
    else:
        service = state_api.state.service
        try:
            answer = service.get(*service.resolve(job, store), key, window)
        except (UnknownStore, InvalidKey) as err:
            status, body = 422, f'<p class="sev-error">{html.escape(str(err))}</p>'
        else:
            facts = [
                ("found", "yes" if answer["found"] else "no"),
                ("source", answer["source"]),
                ("fallback reason", answer["fallback_reason"]),
                ("job state", answer["job_state"]),
                ("batch", answer["batch_id"]),
                ("snapshot version", answer["snapshot_version"]),
                ("as of", answer["as_of"]),
                ("staleness (ms)", answer["staleness_ms"]),
            ]
            body = "<table>" + "".join(f"<tr><th>{html.escape(n)}</th><td>{_cell(v)}</td></tr>" for n, v in facts)
            body += f"<tr><th>value</th><td><pre>{html.escape(json.dumps(answer['value'], indent=2))}</pre></td></tr></table>"
    page_html = f"""<!doctype html><html><head><meta charset="utf-8"><title>State lookup</title><style>{_STYLE}</style></head>
<body><h2>State lookup: {html.escape(target)} {html.escape(key)}</h2>{_lookup_form(views, target, key, window)}{body}
<p><a href="./">all jobs</a></p></body></html>"""
    return HTMLResponse(page_html, status_code=status)


@app.get("/", response_class=HTMLResponse)
def page() -> str:
    views = jobs()["jobs"]
    rows = "\n".join(_row(job) for job in views)
    return f"""<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>Streaming jobs</title><style>
{_STYLE}
</style></head><body>
<h2>Streaming jobs</h2>
<table><thead><tr><th>Job</th><th>Lifecycle</th><th>Supervision</th><th>Input lag (records)</th><th>Batch</th>
<th>Batch duration (ms)</th><th>State (rows / memory)</th><th>Last snapshot</th><th>Restore</th><th>Changelog records / live keys</th><th>Open alerts</th><th>Links</th></tr></thead>
<tbody>
{rows}
</tbody></table>
{_lookup_form(views)}
<p class="dim">Refreshes every 10 s. <a href="alerts">Received alerts</a> · <a href="state-audit/">state-size report</a>
 · JSON: <a href="api/jobs">api/jobs</a>, <a href="api/alerts">api/alerts</a></p>
</body></html>"""
