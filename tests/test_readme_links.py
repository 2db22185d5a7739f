"""README.md and docs/ stand on their own: nothing points outside the repository, and every repository
path they name in backticks or links exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_LEVEL = "dags|plugins|spark_jobs|runtime|tests|bench|jvm|docker|docs|scripts"
#: a path into the repository, as written in backticks or a Markdown link (no placeholders or globs)
REPO_PATH = re.compile(rf"(?:`|\]\()((?:{TOP_LEVEL})/[\w./-]*\w)(?:`|\))")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_documents_name_only_paths_that_exist_in_the_repository(document):
    text = document.read_text()
    assert "../" not in text, f"{document.name} points outside the repository"
    missing = sorted({p for p in REPO_PATH.findall(text) if not (ROOT / p.split("::")[0]).exists()})
    assert missing == [], f"{document.name} names paths the repository does not have: {missing}"
