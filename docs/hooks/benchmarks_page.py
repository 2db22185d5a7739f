"""MkDocs hook: BENCHMARKS.md, where the benchmarks write their results, as the site's page ``benchmarks/results.md``.

The file stays at the repository's root (``bench/compare.py`` and the other benchmarks rewrite their sections of
it); ``docs/benchmarks/results.md`` points to it (for a reader of the repository) and the site shows it there as it
is, with the charts it links (``bench/results/*.png``), so the page is never a stale copy.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "BENCHMARKS.md"
PAGE = "benchmarks/results.md"
IMAGE = re.compile(r"!\[[^\]]*\]\((bench/results/[^)\s]+)\)")


def on_files(files, config):
    for image in sorted(set(IMAGE.findall(SOURCE.read_text()))):  # linked from the page as bench/results/...
        files.append(File.generated(config, f"benchmarks/{image}", abs_src_path=str(ROOT / image)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    if page.file.src_uri != PAGE:
        return markdown
    # links into docs/ from the repository's root (the summary's plot) are relative to this page's folder here
    return SOURCE.read_text().replace("](docs/", "](../")
