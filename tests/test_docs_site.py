"""The documentation site (mkdocs.yml, docs/) without building it: the generated configuration reference names every
setting, every page is in the navigation and every navigation entry is a page, each Kafka Streams method a page
quotes exists, the benchmarks' results page is BENCHMARKS.md, and README's job is the job the site's example runs
(tests/spark_jobs/test_readme_job.py).
``mkdocs build --strict`` (``make lint``) checks the rest: links, anchors of pages, the API reference."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

from runtime.settings import CompactionPolicy, Settings

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _hook(name: str):
    """A module of docs/hooks, imported as MkDocs imports it."""
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", DOCS / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def _job_block(text: str, after: str) -> str:
    """The first Python code block after the text ``after``."""
    assert after in text, f"{after!r} is gone"
    found = re.search(r"```python\n(.*?)```", text[text.index(after) :], re.DOTALL)
    assert found, f"no Python block after {after!r}"
    return found.group(1)


def test_the_configuration_page_names_every_setting_with_its_meaning():
    hook = _hook("settings_reference")
    page = (DOCS / "configuration.md").read_text()
    assert hook.MARKER in page, "docs/configuration.md lost the generated reference's marker"
    generated = hook.on_page_markdown(page, None, None, None)
    for field in dataclasses.fields(Settings):
        if field.name != "compaction":
            assert f"`STREAMSTATE_{field.name.upper()}`" in generated, field.name
    for field in dataclasses.fields(CompactionPolicy):
        assert f"`STREAMSTATE_COMPACTION_{field.name.upper()}`" in generated, field.name
    undocumented = [f.variable for f in hook.settings_fields() + hook.compaction_fields() if not f.meaning]
    assert undocumented == [], f"give these fields a #: comment in runtime/settings.py: {undocumented}"
    row = next(line for line in generated.splitlines() if "`STREAMSTATE_MAX_OFFSETS_PER_TRIGGER`" in line)
    assert "`200000`" in row and "maxOffsetsPerTrigger" in row


def test_every_page_is_in_the_navigation_and_every_entry_is_a_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "hooks" not in p.parts}
    assert sorted(on_disk - set(nav)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(nav) - on_disk) == [], "nav entries without a page"
    assert config["theme"]["font"] is False, "Material would fetch Google Fonts when a page is read"


def test_every_quoted_kafka_streams_method_exists():
    hook = _hook("kafka_streams_twin")
    quoted = [
        (page.relative_to(DOCS).as_posix(), name)
        for page in DOCS.rglob("*.md")
        for names in hook.DIRECTIVE.findall(page.read_text())
        for name in names.split()
    ]
    assert len(quoted) >= 10
    for page, name in quoted:
        assert f" {name}(" in hook.method(name), (page, name)
    with pytest.raises(ValueError, match="no method noSuchTopology"):
        hook.method("noSuchTopology")


def test_the_versioned_page_shows_the_reference_jobs_declaration():
    from tests.helpers import readme_declaration

    declaration = readme_declaration("VOTES = VersionedLatest(")
    assert declaration in (ROOT / "spark_jobs" / "reference" / "jobs" / "vote_counts.py").read_text()


def test_the_results_page_is_benchmarks_md():
    hook = _hook("benchmarks_page")
    page = type("Page", (), {"file": type("File", (), {"src_uri": hook.PAGE})()})()
    shown = hook.on_page_markdown("(the stub)", page, None, None)
    # the same text, its links into docs/ made relative to the page's folder (docs/benchmarks/)
    assert shown == (ROOT / "BENCHMARKS.md").read_text().replace("](docs/", "](../")
    assert "](../img/benchmarks.png)" in shown
    assert (DOCS / hook.PAGE).is_file() and hook.IMAGE.findall((ROOT / "BENCHMARKS.md").read_text())


def test_the_readme_job_is_the_job_the_site_runs():
    """README.md shows the keyed-aggregate page's job (which test_readme_job.py runs on the broker) in fewer lines:
    both blocks, run as modules, define the same schema, declaration, rules and job spec."""
    readme = _job_block((ROOT / "README.md").read_text(), "## A whole job")
    page = _job_block((DOCS / "writing-jobs" / "keyed-aggregate.md").read_text(), "<!-- readme-job -->\n")
    short, whole = {}, {}
    exec(compile(readme, "README.md", "exec"), short)  # noqa: S102 - the documentation's own code
    exec(compile(page, "keyed-aggregate.md", "exec"), whole)  # noqa: S102
    assert short["SCHEMA"] == whole["SCHEMA"]
    assert short["JOBS"] == whole["JOBS"]
    events = dataclasses.replace(short["STOCK"].events, rules=None)
    assert events == dataclasses.replace(whole["STOCK"].events, rules=None)
    assert dataclasses.replace(short["STOCK"], events=None) == dataclasses.replace(whole["STOCK"], events=None)
    one, two = short["rules"].__code__, whole["rules"].__code__
    assert (one.co_code, one.co_consts, one.co_names) == (two.co_code, two.co_consts, two.co_names)
