"""MkDocs hook: BENCHMARKS.md, where the benchmarks write their results, as the site's page ``benchmarks/results.md``.

The file stays at the repository's root (``bench/compare.py`` and the other benchmarks rewrite their sections of
it); the site shows it as it is, with the charts it links (``bench/results/*.png``), so the page is never a stale
copy.
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
    text = SOURCE.read_text()
    files.append(File.generated(config, PAGE, content=text))
    for image in sorted(set(IMAGE.findall(text))):  # linked from the page as bench/results/...: beside it
        files.append(File.generated(config, f"benchmarks/{image}", abs_src_path=str(ROOT / image)))
    return files
