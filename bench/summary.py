"""Benchmarks that show today: the newest saved result of every benchmark and size, at the top of BENCHMARKS.md.

Reads every ``bench/results/*.json`` (written by the benchmarks as they measure), keeps the newest result per
(kind, workload, size) and renders it as Markdown between two marker comments at the top of BENCHMARKS.md, with a
plot of the throughput ratios (docs/img/benchmarks.png). The dated log below the markers is left as it is.

Kinds, by the file name the script that writes them gives:

* ``compare-<workload>-<events>x<keys>.json`` (bench/compare.py, ``make bench``): per workload and size, each
  peer's median events/s and seconds, platform / plain Spark and platform / Kafka Streams throughput, whether
  the peers' answers were checked equal, and the restore (platform snapshot + tail against Kafka Streams' full
  replay);
* ``latency-<UTC time>[-<commit>].json`` (bench/latency.py): per rate and trigger, p50 / p99 seconds from
  ``produce()`` to the answer, the platform beside its peers in one run; runs of the platform alone (A/B runs
  between commits) apart;
* ``production-shape-<UTC time>.json`` (bench/production_shape.py): per backlog size and rate, the development
  shape's Kafka against the production shape's.

A JSON file of another kind is named in the summary as not summarised. The core is pure (:func:`parse`,
:func:`select_newest`, :func:`render`); :func:`main` does the reading and writing::

    .venv/bin/python bench/summary.py           # rewrite the block in BENCHMARKS.md and the plot (make bench-summary)
    .venv/bin/python bench/summary.py --check   # exit 1 if the block is not what the results render now
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = PROJECT_ROOT / "bench" / "results"
BENCHMARKS = PROJECT_ROOT / "BENCHMARKS.md"
PLOT = PROJECT_ROOT / "docs" / "img" / "benchmarks.png"

START = "<!-- summary:start -->"
END = "<!-- summary:end -->"

#: compare.py's workloads in its order, with the noun of their keys (bench/compare.py WORKLOADS; a test holds the two equal)
KEY_NOUNS = {
    "purchases": "users",
    "pulses": "patients",
    "temperatures": "sensors",
    "sessions": "users",
    "enrichment": "profiles",
    "payments": "orders",
}
PEER_NAMES = {"kafka_streams": "Kafka Streams", "plain_spark": "plain Spark", "platform": "platform"}
#: latency peers in the table's column order
PEERS_LATENCY = ("platform", "plain_spark", "kafka_streams")
KINDS = ("compare", "latency", "production-shape")
DASH = "—"


@dataclasses.dataclass(frozen=True)
class Result:
    """One benchmark's measurement of one size, as saved: ``data`` holds the kind's own figures."""

    kind: str
    workload: str
    #: sortable: compare (events, keys); latency (rate, trigger seconds); production-shape (events, rate)
    size: tuple
    #: ISO date or UTC minute ("2026-11-29", "2026-12-03T08:32Z"): the newest is the largest
    when: str
    #: the short commit measured, or "" when the result does not record it
    commit: str
    command: str
    #: the file's name in bench/results/
    source: str
    data: Mapping = dataclasses.field(hash=False, compare=False)

    @property
    def key(self) -> tuple:
        return (self.kind, self.workload, self.size)


# ----- reading: a file's name and JSON in, its results out ------------------------------------------------------
_STAMP = re.compile(r"-(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})Z(?:-([0-9a-f]{7,40}))?\.json$")


def _stamp(name: str) -> tuple[str, str]:
    """The UTC minute and the commit (if any) of a name like ``latency-20261203T0826Z-37fc707.json``."""
    found = _STAMP.search(name)
    if not found:
        raise ValueError(f"{name}: no <UTC time> in its name")
    year, month, day, hour, minute, commit = found.groups()
    return f"{year}-{month}-{day}T{hour}:{minute}Z", commit or ""


def parse(name: str, data: dict) -> list[Result]:
    """The results of one saved file (``name``: its file name), by the kind its name says; [] for another kind."""
    if name.startswith("compare-"):
        return [_compare(name, data)]
    if name.startswith("latency-"):
        return _latency(name, data)
    if name.startswith("production-shape-"):
        return _production_shape(name, data)
    return []


def _compare(name: str, data: dict) -> Result:
    return Result(
        "compare",
        data["workload"],
        (data["events"], data["keys"]),
        data["date"],
        data.get("commit") or "",
        data["command"],
        name,
        data,
    )


def _latency(name: str, data: dict) -> list[Result]:
    """One result per (rate, trigger) of the run at which the platform was measured: ``beside its peers`` when a
    peer was measured at the same rate in the same run (Kafka Streams has no trigger: it stands beside every
    trigger of its rate), else ``alone``."""
    when, commit = _stamp(name)
    rows = [r for r in data.get("rows", []) if "error" not in r and r.get("sinks")]
    out = []
    for row in rows:
        if row["peer"] != "platform":
            continue
        rate, trigger = row["rate"], row["trigger_s"]
        peers = {"platform": row}
        for other in rows:
            if other["rate"] == rate and other["peer"] == "plain_spark" and other["trigger_s"] == trigger:
                peers["plain_spark"] = other
            if other["rate"] == rate and other["peer"] == "kafka_streams":
                peers["kafka_streams"] = other
        workload = "beside its peers" if len(peers) > 1 else "alone"
        out.append(Result("latency", workload, (rate, trigger), when, commit, data["command"], name, {"peers": peers}))
    return out


def _production_shape(name: str, data: dict) -> list[Result]:
    when, commit = _stamp(name)
    rows = [r for r in data.get("rows", []) if "error" not in r]
    if not rows:
        return []
    rate = re.search(r"--rate[ =](\d+)", data["command"])
    size = (rows[0]["backlog"]["events"], int(rate.group(1)) if rate else rows[0]["latency"]["produced_rate"])
    return [Result("production-shape", "purchase_counts", size, when, commit, data["command"], name, {"rows": rows})]


# ----- selecting --------------------------------------------------------------------------------------------------
def _order(result: Result) -> tuple:
    workloads = [*KEY_NOUNS, "beside its peers", "alone"]  # compare's workloads, then latency's two groups
    workload = (
        (workloads.index(result.workload), "") if result.workload in workloads else (len(workloads), result.workload)
    )
    kind = KINDS.index(result.kind) if result.kind in KINDS else len(KINDS)
    return (kind, result.kind, *workload, tuple(-1 if v is None else v for v in result.size))


def select_newest(results: Iterable[Result]) -> list[Result]:
    """The newest result of every (kind, workload, size) (ties: the later file name), in the summary's order."""
    newest: dict[tuple, Result] = {}
    for result in results:
        held = newest.get(result.key)
        if held is None or (result.when, result.source) > (held.when, held.source):
            newest[result.key] = result
    return sorted(newest.values(), key=_order)


# ----- figures ----------------------------------------------------------------------------------------------------
def throughput(result: Result, peer: str) -> float | None:
    """A compare result's median events/s of ``peer`` over its rounds (as bench/compare.py computes it)."""
    runs = result.data["rounds"].get(peer) or []
    return statistics.median(result.size[0] / r["seconds"] for r in runs) if runs else None


def seconds(result: Result, peer: str) -> float | None:
    runs = result.data["rounds"].get(peer) or []
    return statistics.median(r["seconds"] for r in runs) if runs else None


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or not theirs else ours / theirs


def throughput_ratios(result: Result) -> dict[str, float | None]:
    """Platform events/s over each peer's (medians of one invocation): >1 the platform is faster."""
    ours = throughput(result, "platform")
    return {peer: ratio(ours, throughput(result, peer)) for peer in ("plain_spark", "kafka_streams")}


def restore(result: Result, peer: str, name: str) -> float | None:
    """Median seconds of a compare result's restore ``name`` ("full replay", "snapshot + tail") by ``peer``."""
    runs = [r["restores"][name] for r in result.data["rounds"].get(peer) or [] if name in (r.get("restores") or {})]
    return statistics.median(x["seconds"] for x in runs) if runs else None


def answers_equal(result: Result) -> bool | None:
    """True when every round of every peer was checked equal key by key (compare.py records the keys it compared);
    None when the result records no check (measured before 2026-11-26)."""
    rounds = [r for runs in result.data["rounds"].values() for r in runs]
    if rounds and all(r.get("answer_keys") for r in rounds):
        return True
    return None if not any(r.get("answer_keys") for r in rounds) else False


def fmt_ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}x"


def _count(n: int) -> str:
    return f"{n:,}"


def _short(n: int) -> str:
    """1000000 -> 1e6, 20000000 -> 2e7, 500000 -> 5e5; anything else with thousands separators."""
    mantissa, exponent = f"{n:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}" if int(mantissa) * 10 ** int(exponent) == n else f"{n:,}"


def size_label(result: Result) -> str:
    events, keys = result.size
    return f"{_count(events)} x {_count(keys)} {KEY_NOUNS.get(result.workload, 'keys')}"


def _measured(result: Result) -> str:
    """When, and at which commit if the result records it (compare's always do; the others' only in a name)."""
    when = result.when.replace("T", " ")
    return f"{when}, {result.commit}" if result.commit else when


def quoted_figures(markdown_text: str) -> set[str]:
    """Every decimal ratio figure a page quotes ("0.92x", "1.6x", "**0.61x**" as "0.61x"; not "5x" or "v1.2")."""
    return set(re.findall(r"(?<![\w.])\d+\.\d+x\b", markdown_text))


# ----- rendering (pure) -------------------------------------------------------------------------------------------
def render(results: list[Result], unread: Iterable[str] = (), image: str | None = None) -> str:
    """The summary block (markers included) for the selected ``results``; ``image``: the plot's link from the
    page, if any; ``unread``: the JSON files of no known kind."""
    by_kind: dict[str, list[Result]] = {}
    for result in results:
        by_kind.setdefault(result.kind, []).append(result)
    newest = max((r.when[:10] for r in results), default=DASH)
    lines = [
        START,
        "<!-- generated by bench/summary.py from bench/results/*.json (make bench-summary); do not edit by hand -->",
        "",
        f"## Summary: the newest result of each benchmark and size (newest {newest})",
        "",
        "Generated by `bench/summary.py` (`make bench-summary`) from the saved results in `bench/results/`: for each "
        "benchmark, workload and size, its newest result only, with the date and commit it was measured at. Ratios "
        "are of medians measured side by side in one invocation, on one shared 2-core machine: compare ratios, not "
        "seconds across rows. How each was measured, and why a figure moved: the dated log below.",
        "",
    ]
    lines += _render_compare(by_kind.get("compare", []), image)
    lines += _render_latency(by_kind.get("latency", []))
    lines += _render_production_shape(by_kind.get("production-shape", []))
    unread = sorted(unread)
    if unread:
        lines += [f"Not summarised (no reader for their kind in bench/summary.py): {', '.join(unread)}.", ""]
    return "\n".join([*lines, END])


def _render_compare(results: list[Result], image: str | None) -> list[str]:
    if not results:
        return []
    lines = [
        "### Throughput: the platform against Kafka Streams and plain Spark (`bench/compare.py`, `make bench`)",
        "",
        "Each peer processes the same pre-loaded input from a cold start: median events/s over the rounds, with "
        "the median seconds from start to all input processed. A throughput ratio above 1.00x: the platform was "
        "faster. *Answers equal*: every round counted only once the peers' outputs were equal key by key "
        "(bench/answers.py). *Restore*: the platform's snapshot + changelog tail against Kafka Streams' full "
        "changelog replay, median seconds (below 1.00x: the platform restored faster). Every size in full: the "
        'log\'s "Platform vs Kafka Streams vs plain Spark" section.',
        "",
        "| workload | events x keys | measured | rounds | Kafka Streams | plain Spark | platform "
        "| platform / plain Spark | platform / Kafka Streams | answers equal | restore: platform / Kafka Streams |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        rounds = max((len(runs) for runs in result.data["rounds"].values()), default=0)
        peers = []
        for peer in ("kafka_streams", "plain_spark", "platform"):
            rate, took = throughput(result, peer), seconds(result, peer)
            peers.append(DASH if rate is None else f"{rate:,.0f}/s ({took:,.1f} s)")
        ratios = throughput_ratios(result)
        equal = {True: "yes", False: "partly", None: "not checked"}[answers_equal(result)]
        ours, theirs = restore(result, "platform", "snapshot + tail"), restore(result, "kafka_streams", "full replay")
        restored = DASH if ours is None or not theirs else f"{ours:.2f} / {theirs:.2f} s = {fmt_ratio(ours / theirs)}"
        lines.append(
            f"| {result.workload} | {size_label(result)} | {_measured(result)} | {rounds} | {' | '.join(peers)} | "
            f"**{fmt_ratio(ratios['plain_spark'])}** | **{fmt_ratio(ratios['kafka_streams'])}** | {equal} | "
            f"{restored} |"
        )
    lines.append("")
    if image:
        lines += [f"![platform throughput / each peer's, newest result per workload and size]({image})", ""]
    lines += ["Commands:", ""]
    lines += [f"- {r.workload}, {size_label(r)} (`bench/results/{r.source}`): `{r.command}`" for r in results]
    return [*lines, ""]


def _p(sink: Mapping | None) -> str:
    if not sink or not sink.get("events"):
        return DASH
    unanswered = f", {sink['unanswered']:,} unanswered" if sink.get("unanswered") else ""
    return f"{sink['p50']:.2f} / {sink['p99']:.2f}{unanswered}"


def _latency_ratio(ours: Mapping | None, theirs: Mapping | None) -> str:
    if not ours or not theirs or not ours.get("events") or not theirs.get("events"):
        return DASH
    return f"{fmt_ratio(ratio(ours['p50'], theirs['p50']))} / {fmt_ratio(ratio(ours['p99'], theirs['p99']))}"


def _trigger(trigger: float | None) -> str:
    return DASH if trigger is None else f"{trigger:g} s"


def _render_latency(results: list[Result]) -> list[str]:
    if not results:
        return []
    lines = [
        "### End-to-end latency, produce to answer (`bench/latency.py`)",
        "",
        "purchase_counts at a steady rate: seconds from `produce()` to the first read of an answer counting the "
        "event, p50 / p99. Delta: the output table polled every 50 ms (plain Spark's sink too); Kafka: the output "
        "topic read committed (Kafka Streams', exactly-once, commit every 100 ms). The ratio compares the platform "
        "with the peer of the same sink measured in the same run; below 1.00x the platform answered sooner.",
        "",
        "| rate | trigger | sink | platform | plain Spark | Kafka Streams | platform / peer, p50 / p99 | measured |",
        "|---|---|---|---|---|---|---|---|",
    ]
    beside = [r for r in results if r.workload == "beside its peers"]
    for result in beside:
        (rate, trigger), peers = result.size, result.data["peers"]
        ours, plain, kafka_streams = (peers.get(p, {}).get("sinks", {}) for p in PEERS_LATENCY)
        run = _measured(result)
        lines.append(
            f"| {rate:,}/s | {_trigger(trigger)} | Delta | {_p(ours.get('delta'))} | {_p(plain.get('delta'))} | "
            f"{DASH} | {_latency_ratio(ours.get('delta'), plain.get('delta'))} | {run} |"
        )
        lines.append(
            f"| {rate:,}/s | {_trigger(trigger)} | Kafka | {_p(ours.get('kafka'))} | {DASH} | "
            f"{_p(kafka_streams.get('kafka'))} | {_latency_ratio(ours.get('kafka'), kafka_streams.get('kafka'))} | "
            f"{run} |"
        )
    lines.append("")
    alone = [r for r in results if r.workload == "alone"]
    if alone:
        lines += [
            "The platform alone (runs with no peer beside it, e.g. A/B runs between two commits), newest per rate "
            "and trigger, p50 / p99 seconds:",
            "",
        ]
        for result in alone:
            (rate, trigger), sinks = result.size, result.data["peers"]["platform"]["sinks"]
            lines.append(
                f"- {rate:,}/s, trigger {_trigger(trigger)}: Delta {_p(sinks.get('delta'))}, Kafka "
                f"{_p(sinks.get('kafka'))} ({_measured(result)}, `bench/results/{result.source}`)"
            )
        lines.append("")
    commands = sorted({(r.source, r.command) for r in results})
    lines += ["Commands:", ""] + [f"- `bench/results/{source}`: `{command}`" for source, command in commands]
    return [*lines, ""]


def _render_production_shape(results: list[Result]) -> list[str]:
    if not results:
        return []
    lines = [
        "### The production shape's Kafka against the development shape's (`bench/production_shape.py`)",
        "",
        "purchase_counts on three KRaft brokers with three copies of every topic against one broker, shapes "
        "alternated round by round; medians over the rounds. Backlog: events/s over the micro-batches of a "
        "pre-loaded input; latency: p50 / p99 seconds to the answer at a steady rate, 1 s trigger.",
        "",
        "| backlog, rate | measure | development | production | production / development | rounds | measured |",
        "|---|---|---|---|---|---|---|",
    ]
    measures = {
        "backlog events/s": lambda r: r["backlog"]["events_per_s"],
        "Delta p50 s": lambda r: r["latency"]["delta"]["p50"],
        "Delta p99 s": lambda r: r["latency"]["delta"]["p99"],
        "output topic p50 s": lambda r: r["latency"]["kafka"]["p50"],
        "output topic p99 s": lambda r: r["latency"]["kafka"]["p99"],
    }
    for result in results:
        (events, rate), rows = result.size, result.data["rows"]
        rounds = max((sum(1 for r in rows if r["shape"] == shape) for shape in ("development", "production")))
        for name, pick in measures.items():
            dev, prod = (_shape_median(rows, shape, pick) for shape in ("development", "production"))
            fmt = "{:,.0f}" if "events/s" in name else "{:.2f}"
            lines.append(
                f"| {events:,} events, {rate:,}/s | {name} | {DASH if dev is None else fmt.format(dev)} | "
                f"{DASH if prod is None else fmt.format(prod)} | {fmt_ratio(ratio(prod, dev))} | {rounds} | "
                f"{_measured(result)} |"
            )
    lines += ["", "Commands:", ""]
    lines += [f"- `bench/results/{r.source}`: `{r.command}`" for r in results]
    return [*lines, ""]


def _shape_median(rows: list[dict], shape: str, pick) -> float | None:
    values = []
    for row in rows:
        if row["shape"] == shape:
            try:
                values.append(pick(row))
            except (KeyError, TypeError):
                continue
    return statistics.median(values) if values else None


def replace_block(text: str, block: str) -> str:
    """``text`` with its summary block (START to END, markers included) replaced by ``block``."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {START} ... {END} block")
    return text[:start] + block + text[end + len(END) :]


def current_block(text: str) -> str | None:
    start, end = text.find(START), text.find(END)
    return text[start : end + len(END)] if 0 <= start <= end else None


# ----- the plot ---------------------------------------------------------------------------------------------------
def plot_ratios(results: list[Result], path: Path) -> None:
    """Grouped bars: platform events/s over plain Spark's and over Kafka Streams', per compare workload and size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compared = [r for r in results if r.kind == "compare"]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.9 * len(compared)), 4.6))
    width = 0.38
    for i, (peer, colour) in enumerate((("plain_spark", "#4c72b0"), ("kafka_streams", "#dd8452"))):
        xs, ys = [], []
        for x, result in enumerate(compared):
            value = throughput_ratios(result)[peer]
            if value is not None:
                xs.append(x + (i - 0.5) * width), ys.append(value)
        bars = ax.bar(xs, ys, width, label=f"platform / {PEER_NAMES[peer]}", color=colour)
        ax.bar_label(bars, labels=[f"{y:.2f}" for y in ys], fontsize=6, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(
        range(len(compared)),
        [f"{r.workload}\n{_short(r.size[0])} x {_short(r.size[1])}\n{r.when[5:]}" for r in compared],
        fontsize=7,
    )
    ax.set_ylabel("throughput ratio (median events/s)")
    newest = max((r.when for r in compared), default="")
    ax.set_title(f"Platform throughput against its peers: newest result per workload and size (to {newest})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


# ----- I/O --------------------------------------------------------------------------------------------------------
def load(directory: Path = RESULTS_DIR) -> tuple[list[Result], list[str]]:
    """Every result saved in ``directory``, and the names of the JSON files of no known kind."""
    results, unread = [], []
    for path in sorted(directory.glob("*.json")):
        found = parse(path.name, json.loads(path.read_text()))
        results += found
        if not found:
            unread.append(path.name)
    return results, unread


def build(directory: Path, page: Path, plot: Path | None) -> str:
    """The block for ``page`` from the results in ``directory`` (the plot linked relative to the page)."""
    results, unread = load(directory)
    image = Path(os.path.relpath(plot, page.resolve().parent)).as_posix() if plot else None
    return render(select_newest(results), unread, image)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's block is stale; write nothing")
    parser.add_argument("--page", type=Path, default=BENCHMARKS, help="the Markdown page holding the markers")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--plot", type=Path, default=PLOT, help="the ratio plot (PNG) the block links to")
    args = parser.parse_args(argv)
    text = args.page.read_text()
    block = build(args.results, args.page, args.plot.resolve())
    if args.check:
        stale = current_block(text) != block
        if stale or not args.plot.exists():
            what = "its summary block is stale" if stale else f"{args.plot} is missing"
            print(f"{args.page}: {what}: run `make bench-summary`", file=sys.stderr)
            return 1
        print(f"{args.page}: summary up to date")
        return 0
    args.page.write_text(replace_block(text, block))
    results, _ = load(args.results)
    plot_ratios(select_newest(results), args.plot)
    print(f"{args.page}: summary rewritten; plot {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
