"""README.md, BENCHMARKS.md and the documentation site's pages (docs/) stand on their own: nothing points outside the
repository, every repository path they name in backticks or links exists, and every relative link or image of
README.md and of each page resolves (README's links work on GitHub; the pages' in the site, which ``mkdocs build
--strict`` checks too, and on GitHub)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
TOP_LEVEL = "dags|plugins|spark_jobs|runtime|tests|bench|jvm|docker|docs|scripts"
#: a path into the repository, as written in backticks or a Markdown link (no placeholders or globs)
REPO_PATH = re.compile(rf"(?:`|\]\()((?:{TOP_LEVEL})/[\w./-]*\w)(?:`|\))")
#: a Markdown link or image's target: ``[text](target)`` or ``![alt](target)``, an optional title after it
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _name(document: Path) -> str:
    return document.relative_to(ROOT).as_posix()


def relative_links(text: str) -> list[str]:
    """The relative targets a document links (no URLs, no in-page anchors), without their anchors, outside code."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    targets = (t.split("#")[0] for t in LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t))
    return sorted({t for t in targets if t})


@pytest.mark.parametrize("document", DOCUMENTS, ids=_name)
def test_documents_name_only_paths_that_exist_in_the_repository(document):
    text = document.read_text()
    missing = sorted({p for p in REPO_PATH.findall(text) if not (ROOT / p.split("::")[0]).exists()})
    assert missing == [], f"{_name(document)} names paths the repository does not have: {missing}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=_name)
def test_every_relative_link_resolves_inside_the_repository(document):
    broken, outside = [], []
    for target in relative_links(document.read_text()):
        path = (document.parent / target).resolve()
        if not path.is_relative_to(ROOT):
            outside.append(target)
        elif not path.exists():
            broken.append(target)
    assert outside == [], f"{_name(document)} points outside the repository: {outside}"
    assert broken == [], f"{_name(document)} links what does not exist: {broken}"


def test_the_link_check_finds_a_broken_link():
    text = (
        '[a](docs/nope.md) ![b](img/x.png "t") [ok](https://example.org) [here](#anchor) `[c](d.md)`\n```\n[e](f)\n```'
    )
    assert relative_links(text) == ["docs/nope.md", "img/x.png"]


def test_the_readme_stays_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines: move the detail into a page of docs/"
