"""The state-size report: one HTML page listing every store, with a PNG chart per store.

Each chart shows, over the audits: live rows (with the rows budget) and the estimated restore time
(snapshot + tail and full replay, with the restore budget). Written to ``<status_dir>/state_audit/``
on every run (``index.html`` + ``<application_id>.<store>.png``) and served by the jobs page.
"""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path

from runtime.settings import Settings
from spark_jobs.layout import AUDIT_REPORT_DIR, audit_plot_file
from spark_jobs.operations.maintenance import MaintenanceRecord, read_record
from spark_jobs.operations.state_audit.rows import StoreAudit


def report_dir(settings: Settings) -> Path:
    return settings.status_dir / AUDIT_REPORT_DIR


def chart_name(application_id: str, store: str) -> str:
    return audit_plot_file(Path(), application_id, store).name


def render_chart(rows: list[StoreAudit], path: Path) -> None:
    """State rows and restore estimates over time for one store, budgets as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    times = [r.audited_at for r in rows]
    last = rows[-1]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    top.plot(times, [r.state_rows for r in rows], marker="o", label="live rows")
    if last.budget_max_rows:
        top.axhline(last.budget_max_rows, color="tab:red", linestyle="--", label="rows budget")
    top.set_ylabel("rows")
    top.legend(loc="upper left", fontsize=8)
    top.set_title(f"{last.application_id} / {last.store}", fontsize=10)
    bottom.plot(times, [r.restore_snapshot_tail_s for r in rows], marker="o", label="restore: snapshot + tail")
    bottom.plot(times, [r.restore_full_replay_s for r in rows], marker="x", label="restore: full replay")
    if last.budget_max_restore_s:
        bottom.axhline(last.budget_max_restore_s, color="tab:red", linestyle="--", label="restore budget")
    bottom.set_ylabel("seconds (estimated)")
    bottom.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.1f}{unit}"
    if isinstance(value, int):
        return f"{value:,}{unit}"
    return html.escape(str(value))


def maintenance_summary(record: MaintenanceRecord) -> str:
    """One line on Delta table maintenance (snapshot, output and platform tables): what it freed so far."""
    applied = record.last_applied
    if applied is None:
        return "Delta table maintenance has not run yet (DAG maintain_delta_tables): nothing freed."
    return (
        f"Delta table maintenance freed {record.freed.files:,} files, {record.freed.bytes:,} B so far and "
        f"compacted {record.compacted_files:,} small files; its last run ({html.escape(applied.run_at)}) "
        f"freed {applied.vacuumed.files:,} files, {applied.vacuumed.bytes:,} B in {applied.tables:,} tables."
    )


def write_report(settings: Settings, by_store: dict[tuple[str, str], list[StoreAudit]]) -> Path:
    """Charts and the index page for every store's audit rows (oldest first). Returns the page."""
    out = report_dir(settings)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for (app, store), rows in sorted(by_store.items()):
        render_chart(rows, out / chart_name(app, store))
        r = rows[-1]
        flags = []
        if r.unbounded:
            flags.append(f'<b class="bad">unbounded growth</b>: {html.escape(r.unbounded_reason or "")}')
        if r.days_to_budget is not None:
            flags.append(f"budget crossed{'' if r.days_to_budget == 0 else ' in ' + _fmt(r.days_to_budget, ' days')}")
        if r.errors:
            flags.append(f'<span class="bad">{html.escape(r.errors)}</span>')
        ttl_row = ""
        if r.ttl_verdict:
            if r.ttl_verdict == "ttl_not_enforced":
                flags.append(f'<b class="bad">TTL not enforced</b>: {html.escape(r.ttl_reason or "")}')
            ttl_row = (
                f"<tr><th>TTL {_fmt(r.ttl_ms, ' ms')}</th><td>{html.escape(r.ttl_verdict)}: "
                f"{_fmt(r.ttl_keys_overdue)} of {_fmt(r.ttl_keys_checked)} live keys overdue</td>"
                f'<td colspan="2"><small>{html.escape(r.ttl_reason or "")}</small></td></tr>\n'
            )
        lines.append(f"""<section><h3>{html.escape(app)} / {html.escape(store)} <small>({html.escape(r.kind)})</small></h3>
<table>
<tr><th>live rows</th><td>{_fmt(r.state_rows)} ({html.escape(r.state_rows_source or "")})</td>
<th>state bytes / on disk</th><td>{_fmt(r.state_bytes)} / {_fmt(r.state_disk_bytes)}</td></tr>
<tr><th>snapshot</th><td>{_fmt(r.snapshot_rows)} rows, {_fmt(r.snapshot_bytes)} B, {_fmt(r.snapshot_files)} files,
{_fmt(r.snapshot_versions)} versions, {_fmt(r.snapshot_age_s, " s")} old<br>
<small>table on disk {_fmt(r.snapshot_disk_bytes, " B")}; maintenance can vacuum {_fmt(r.snapshot_vacuumable_bytes, " B")},
has freed {_fmt(r.snapshot_freed_bytes, " B")}</small></td>
<th>changelog</th><td>{_fmt(r.changelog_records)} records, {_fmt(r.changelog_live_keys)} live keys,
{_fmt(r.changelog_tombstones)} tombstones <small>({html.escape(r.changelog_source or "")})</small></td></tr>
<tr><th>restore estimate</th><td>{_fmt(r.restore_snapshot_tail_s, " s")} (snapshot + {_fmt(r.tail_records)} tail records),
{_fmt(r.restore_full_replay_s, " s")} full replay</td>
<th>dead letters</th><td>{_fmt(r.dead_letter_records)} (growth {_fmt(r.dead_letter_growth)})</td></tr>
<tr><th>growth per day</th><td>{_fmt(r.rows_per_day, " rows")}, {_fmt(r.bytes_per_day, " B")}</td>
<th>budget</th><td>rows {_fmt(r.budget_max_rows)}, bytes {_fmt(r.budget_max_bytes)},
restore {_fmt(r.budget_max_restore_s, " s")}</td></tr>
{ttl_row}</table>
<p>{"<br>".join(flags) or "no findings"}</p>
<img src="{chart_name(app, store)}" alt="state rows and restore estimate of {html.escape(app)}/{html.escape(store)}">
</section>""")
    generated = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    maintenance = maintenance_summary(read_record(settings))
    page = out / "index.html"
    page.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>State size audit</title><style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; color: #1a202c; }} table {{ border-collapse: collapse; }}
th, td {{ border-bottom: 1px solid #e2e8f0; padding: 0.3rem 0.6rem; text-align: left; font-size: 0.9rem; }}
.bad {{ color: #c53030; }} section {{ margin-bottom: 2rem; }}
</style></head><body><h2>State size audit</h2><p>{len(by_store)} stores, generated {generated}</p>
<p>{maintenance}</p>
{"".join(lines)}
</body></html>""")
    return page
