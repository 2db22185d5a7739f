"""MkDocs hook: the Kafka Streams code a primitive's page compares the platform with, quoted from the source.

A page writes ``<!-- kafka-streams: purchaseCounts countPurchase -->``; this hook replaces it with those methods
of the benchmarks' Kafka Streams app (``bench/kafka_streams/.../BenchApp.java``), each with its Javadoc, in one
Java code block. The page shows the code that runs, not a copy of it; a method renamed or removed fails the
build (``mkdocs build --strict``) naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "bench" / "kafka_streams" / "src" / "main" / "java" / "streamstate" / "bench" / "BenchApp.java"
DIRECTIVE = re.compile(r"<!-- kafka-streams: ([\w ]+) -->")


def method(name: str, lines: list[str] | None = None) -> str:
    """Method ``name`` of BenchApp (a member of the class: indented two spaces), with the Javadoc above it."""
    lines = APP.read_text().splitlines() if lines is None else lines
    start = next((i for i, line in enumerate(lines) if re.match(rf"  (?:\w+ )*[\w<>, ]+ {name}\(", line)), None)
    if start is None:
        raise ValueError(f"{APP.relative_to(ROOT)} has no method {name}")
    end = next(i for i in range(start, len(lines)) if lines[i] == "  }")
    if lines[start - 1].strip() == "*/" or lines[start - 1].strip().startswith("/**"):
        while not lines[start].strip().startswith("/**"):
            start -= 1
    return "\n".join(line.removeprefix("  ") for line in lines[start : end + 1])


def quote(names: list[str]) -> str:
    lines = APP.read_text().splitlines()
    return "```java\n" + "\n\n".join(method(n, lines) for n in names) + "\n```"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    return DIRECTIVE.sub(lambda m: quote(m.group(1).split()), markdown)
