"""docs/architecture.md describes the code as it is: every module, file, class, member, DAG id, setting and
code name it mentions (in backticks, and in the labels of its diagrams) resolves against the tree. A rename
or a removal that leaves the page behind fails here, with the names it no longer finds.

And it describes all of it: every primitive ``spark_jobs.primitives`` exports, every store kind, every DAG
factory and DAG function of ``dags/`` is named in backticks in its prose, and every module of ``spark_jobs`` has
a docstring and is in the module map the site generates from them (``docs/hooks/module_map.py``). An addition
the page does not describe fails here, with the names it lacks."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "spark_jobs"
PRIMITIVES = PACKAGE / "primitives" / "__init__.py"
#: the module that defines the ``StoreKind`` literal (what a ``StoreSpec`` accepts; changelog topics use it too)
STORE_KIND_MODULES = (PACKAGE / "registry.py",)
DAGS = ROOT / "dags"
MODULE_MAP_HOOK = ROOT / "docs" / "hooks" / "module_map.py"
TOP_LEVEL = (
    "dags",
    "plugins",
    "spark_jobs",
    "runtime",
    "streamstate_cli",
    "jvm",
    "bench",
    "scripts",
    "docker",
    "tests",
)
#: where a dotted name starts: Python packages, and ``streamstate`` (the Java package, and plugins/streamstate)
PACKAGES = {"spark_jobs", "runtime", "dags", "streamstate_cli", "streamstate", "bench", "tests"}
#: names from Kafka Streams, Spark and the tools the page compares the code with: not this repository's
EXTERNAL = {
    "AbstractProcessor",
    "JoinWindows",
    "KafkaStreams",
    "ProcessorContext",
    "ProcessorStateManager",
    "RecordCollector",
    "RocksDB",
    "StateDirectory",
    "StateRestoreListener",
    "StatefulProcessorWithInitialState",
    "StreamingQueryListener",
    "VersionedKeyValueStore",
}
SKIPPED_DIRS = {".venv", ".jvm", ".git", "__pycache__", "node_modules", "target", ".local"}

CAMEL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+")
SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
SETTING = re.compile(r"STREAMSTATE_([A-Z0-9_]+)")
FILE_NAME = re.compile(r"[\w.-]+\.(?:py|java|md|ya?ml|toml|sh|json)")
CALL = re.compile(r"([A-Z]\w*)\(([\w=, ]*)\)")
#: candidate names in a diagram's labels (paths, dotted names and identifiers)
DIAGRAM_TOKEN = re.compile(r"[A-Za-z_][\w]*(?:[./][\w-]+)*(?:\([\w=, ]*\))?/?")


def _source_files() -> list[Path]:
    """The repository's files but its tests (a name only a test has is not the code the page describes)."""
    found = []
    for top in (t for t in TOP_LEVEL if t != "tests"):
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts):
                found.append(path)
    return found + [p for p in ROOT.iterdir() if p.is_file()]


@functools.cache
def _index() -> tuple[set[str], set[str], dict[str, list[tuple[Path, object]]]]:
    """(file names, words in the code, class name -> [(file, Python ClassDef or None for Java)])."""
    names, words, classes = set(), set(), {}
    for path in _source_files():
        names.add(path.name)
        if path.suffix not in (".py", ".java"):
            continue
        text = path.read_text(errors="replace")
        words.update(re.findall(r"\w+", text))
        if path.suffix == ".java":
            for name in re.findall(r"\b(?:class|interface|enum|record)\s+(\w+)", text):
                classes.setdefault(name, []).append((path, None))
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:  # a template or fixture that is not Python: its words still count
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append((path, node))
    return names, words, classes


def _defined(body: list[ast.stmt]) -> set[str]:
    """The names a module or class body defines."""
    found = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update((a.asname or a.name).split(".")[0] for a in node.names)
    return found


def _class_has(name: str, member: str, seen: frozenset = frozenset()) -> bool:
    for path, node in _index()[2].get(name, []):
        if node is None:  # Java: the member is named in the class's file
            if re.search(rf"\b{re.escape(member)}\b", path.read_text()):
                return True
        elif member in _defined(node.body):
            return True
        elif node is not None:
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)} - seen
            if any(_class_has(base, member, seen | {name}) for base in bases):
                return True
    return False


def _dotted_resolves(name: str) -> bool:
    """``spark_jobs.state.snapshots``, ``spark_jobs.state.snapshots.SnapshotStore.write``,
    ``streamstate.jobs.DeadLetters``: the longest prefix that is a module or a Java class, then its members."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        rel = Path(*parts[:i])
        for base in (ROOT, ROOT / "plugins"):
            module = next((p for p in (base / rel.with_suffix(".py"), base / rel / "__init__.py") if p.is_file()), None)
            if module is not None:
                rest = parts[i:]
                if not rest:
                    return True
                if rest[0] not in _defined(ast.parse(module.read_text()).body):
                    return False
                return len(rest) == 1 or _class_has(rest[0], rest[1])
        for java in ROOT.glob(f"jvm/*/src/{rel.as_posix()}.java"):
            return all(re.search(rf"\b{re.escape(m)}\b", java.read_text()) for m in parts[i:])
    return False


def unresolved(names: set[str]) -> list[str]:
    """The names (as written in the page) that do not resolve against the tree."""
    files, words, classes = _index()
    missing = []
    for name in sorted(names):
        name = name.strip().rstrip("/")
        head = name.split(".")[0]
        if setting := SETTING.match(name):
            ok = setting.group(1) in (ROOT / "runtime" / "settings.py").read_text().upper()
        elif "/" in name:
            ok = name.split("/")[0] not in TOP_LEVEL or (ROOT / name).exists()
        elif FILE_NAME.fullmatch(name):
            ok = name in files
        elif call := CALL.fullmatch(name):
            cls, args = call.groups()
            fields = [a.split("=")[0].strip() for a in args.split(",") if "=" in a]
            ok = (cls in classes or cls in EXTERNAL) and all(_class_has(cls, f) for f in fields)
        elif "." in name and head in PACKAGES:
            ok = _dotted_resolves(name)
        elif "." in name and CAMEL.fullmatch(head):
            ok = head in EXTERNAL or all(_class_has(head, m) for m in name.split(".")[1:2])
        elif CAMEL.fullmatch(name):
            ok = name in classes or name in EXTERNAL
        elif SNAKE.fullmatch(name):
            ok = name in words
        else:
            continue  # not a name of this code: a config key, a placeholder, a command, prose
        if not ok:
            missing.append(name)
    return missing


def named_in(text: str) -> set[str]:
    """What a page names: its backtick spans, and the tokens of its Mermaid diagrams' labels."""
    diagrams = re.findall(r"```mermaid\n(.*?)```", text, re.S)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    names = set(re.findall(r"`([^`\n]+)`", prose))
    for diagram in diagrams:  # labels without their HTML (<br/>, &lt;): what is left are words and names
        names.update(DIAGRAM_TOKEN.findall(re.sub(r"<[^>]*>|&\w+;", " ", diagram)))
    return names


def test_every_name_in_the_architecture_page_exists():
    missing = unresolved(named_in(DOC.read_text()))
    assert missing == [], f"docs/architecture.md names what the code no longer has: {missing}"


def test_the_check_finds_a_name_that_is_gone():
    text = (
        "`spark_jobs.state.snapshots` `spark_jobs.state.snapshots.SnapshotStore` `SnapshotStore` `snapshots.py` "
        "`streamstate.jobs.DeadLetters` `JobContext.state_change_sink` `StoreSpec(changelog_configs=x)`\n"
        "```mermaid\nflowchart LR\n  a[spark_jobs/state/restore.py] --> b[KeyedValueProcessor]\n```\n"
        "`spark_jobs.state.snapshotz` `spark_jobs.state.snapshots.SnapshotShop` `SnapshotShop` `snapshotz.py` "
        "`streamstate.jobs.DeadLettuce` `JobContext.state_change_sunk` `StoreSpec(changelog_confs=x)` "
        "`STREAMSTATE_NO_SUCH_SETTING` `no_such_dag`\n"
        "```mermaid\nflowchart LR\n  a[spark_jobs/state/restorez.py] --> b[KeyedValueProcessorz]\n```\n"
    )
    assert unresolved(named_in(text)) == sorted(
        [
            "spark_jobs.state.snapshotz",
            "spark_jobs.state.snapshots.SnapshotShop",
            "SnapshotShop",
            "snapshotz.py",
            "streamstate.jobs.DeadLettuce",
            "JobContext.state_change_sunk",
            "StoreSpec(changelog_confs=x)",
            "STREAMSTATE_NO_SUCH_SETTING",
            "no_such_dag",
            "spark_jobs/state/restorez.py",
            "KeyedValueProcessorz",
        ]
    )


def test_the_page_draws_a_state_change_end_to_end_and_the_airflow_side():
    diagrams = re.findall(r"```mermaid\n(.*?)```", DOC.read_text(), re.S)
    state_change = [d for d in diagrams if all(w in d for w in ("processor", "changelog", "markers", "snapshot"))]
    assert state_change and "restore" in state_change[0], "no diagram of a state change from input to restore"
    assert any("supervise" in d and "LaunchStreamingJobOperator" in d for d in diagrams), "no diagram of Airflow"


# The page describes everything: primitives, store kinds, DAGs, modules.


def described(text: str) -> set[str]:
    """The names the page's prose describes: the words of its backtick spans, outside code blocks and diagrams."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return {word for span in re.findall(r"`([^`\n]+)`", prose) for word in re.findall(r"\w+", span)}


def undescribed(text: str, names: Iterable[str]) -> list[str]:
    """``names`` the page's prose does not name in backticks."""
    return sorted(set(names) - described(text))


def exported_primitives() -> list[str]:
    """``spark_jobs.primitives.__all__``, read from the source (no pyspark import)."""
    tree = ast.parse(PRIMITIVES.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{PRIMITIVES.relative_to(ROOT)} has no __all__")


def store_kinds(module: Path) -> list[str]:
    """The literals of ``StoreKind = Literal[...]`` in ``module``."""
    for node in ast.parse(module.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "StoreKind" for t in node.targets)
            and isinstance(node.value, ast.Subscript)
        ):
            literals = node.value.slice.elts if isinstance(node.value.slice, ast.Tuple) else [node.value.slice]
            return [c.value for c in literals if isinstance(c, ast.Constant)]
    raise AssertionError(f"{module.relative_to(ROOT)} defines no StoreKind = Literal[...]")


def _is_dag_decorator(node: ast.expr) -> bool:
    """``@dag(...)``, ``@dag`` (or ``@sdk.dag(...)``)."""
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Name) and target.id == "dag") or (
        isinstance(target, ast.Attribute) and target.attr == "dag"
    )


def _defines_dag(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        _is_dag_decorator(d) for d in node.decorator_list
    )


def dag_functions(source: str) -> list[str]:
    """A DAG file's module-level functions that define DAGs: decorated with ``dag(...)`` (the DAG's function, named
    as its id), or whose body defines one (a factory, one DAG per job)."""
    found = []
    for node in ast.parse(source).body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if _defines_dag(node) or any(_defines_dag(inner) for inner in ast.walk(node) if inner is not node):
            found.append(node.name)
    return found


def spark_jobs_modules(package: Path = PACKAGE) -> dict[str, str]:
    """Every module of ``package`` (relative path -> its docstring): every ``.py`` file, a package's ``__init__.py``
    only when it has a docstring (``__main__.py`` counts)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        docstring = (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
        if path.name != "__init__.py" or docstring:
            found[path.relative_to(package.parent).as_posix()] = docstring
    return found


def without_docstring(modules: dict[str, str]) -> list[str]:
    return sorted(path for path, docstring in modules.items() if not docstring)


def missing_from_map(rendered: str, modules: Iterable[str]) -> list[str]:
    """The modules the rendered map has no row for."""
    return sorted(path for path in modules if f"| `{path}` |" not in rendered)


@functools.cache
def module_map_hook():
    """docs/hooks/module_map.py, imported as MkDocs imports it."""
    spec = importlib.util.spec_from_file_location("docs_hook_module_map", MODULE_MAP_HOOK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_primitive_is_described():
    missing = undescribed(DOC.read_text(), exported_primitives())
    assert missing == [], f"docs/architecture.md does not describe these primitives (spark_jobs.primitives): {missing}"


def test_every_store_kind_is_described():
    kinds = {kind for module in STORE_KIND_MODULES for kind in store_kinds(module)}
    missing = undescribed(DOC.read_text(), kinds)
    assert missing == [], f"docs/architecture.md does not describe these store kinds (StoreKind): {missing}"


def test_every_dag_factory_and_dag_is_described():
    found = {}
    for path in sorted(DAGS.glob("*.py")):
        names = dag_functions(path.read_text())
        assert names or "dag(" not in path.read_text(), f"no DAG function found in {path.relative_to(ROOT)}"
        found.update(dict.fromkeys(names, path.relative_to(ROOT).as_posix()))
    missing = [f"{name} ({found[name]})" for name in undescribed(DOC.read_text(), found)]
    assert missing == [], f"docs/architecture.md does not describe these DAG factories and DAGs: {missing}"


def test_every_spark_jobs_module_has_a_docstring_and_is_in_the_module_map():
    modules = spark_jobs_modules()
    undocumented = without_docstring(modules)
    assert undocumented == [], (
        f"give these modules a docstring (the module map shows its first sentence): {undocumented}"
    )
    missing = missing_from_map(module_map_hook().render(), modules)
    assert missing == [], f"the module map of docs/architecture.md lacks these modules: {missing}"


def test_the_page_holds_the_module_map_and_the_site_builds_it():
    hook = module_map_hook()
    text = DOC.read_text()
    assert f"{hook.MARKER}\n{hook.NOTE}\n" in text, "docs/architecture.md lost the module map's marker and its note"
    hooks = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["hooks"]
    assert "docs/hooks/module_map.py" in hooks, "mkdocs.yml does not register docs/hooks/module_map.py"
    built = hook.on_page_markdown(text, None, None, None)
    assert hook.MARKER not in built and hook.NOTE not in built, "the site's page keeps the marker or the note"
    assert "| `spark_jobs/state/changelog.py` | Changelog topics: every state change" in built


def test_the_checks_see_what_is_missing(tmp_path):
    page = '`TopN` and `StoreSpec(kind="key_value")`\n```mermaid\nflowchart LR\n  a[TableJoin]\n```\n```python\nwindowed\n```\n'
    assert undescribed(page, ["TopN", "key_value", "TableJoin", "windowed"]) == ["TableJoin", "windowed"]

    source = (
        "from airflow.sdk import dag\n"
        "def factory(job):\n    @dag(dag_id=job)\n    def inner(): ...\n    inner()\n"
        "@dag(dag_id='one')\ndef one(): ...\n"
        "@dag\ndef two(): ...\n"
        "def helper(): ...\n"
    )
    assert dag_functions(source) == ["factory", "one", "two"]

    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")  # a package without a docstring: not a module of the map
    (package / "a.py").write_text('"""Module a. More."""\n')
    (package / "b.py").write_text("x = 1\n")
    (package / "sub" / "__init__.py").write_text('"""The sub package."""\n')
    (package / "sub" / "__main__.py").write_text('"""Run it: ``python -m pkg.sub``."""\n')
    modules = spark_jobs_modules(package)
    assert sorted(modules) == ["pkg/a.py", "pkg/b.py", "pkg/sub/__init__.py", "pkg/sub/__main__.py"]
    assert without_docstring(modules) == ["pkg/b.py"]
    rendered = module_map_hook().render(module_map_hook().modules(package))
    assert missing_from_map(rendered, modules) == []
    assert "| `pkg/a.py` | Module a. |" in rendered and "### `pkg/sub/`" in rendered
    without_a = "\n".join(line for line in rendered.splitlines() if "pkg/a.py" not in line)
    assert missing_from_map(without_a, modules) == ["pkg/a.py"]


def test_the_module_map_shows_first_sentences():
    first = module_map_hook().first_sentence
    assert (
        first("Is a checkpoint usable? Checked before a start. More.")
        == "Is a checkpoint usable? Checked before a start."
    )
    assert first("Top rows, e.g. the ten largest. More.") == "Top rows, e.g. the ten largest."
    assert first("Reads ``a.b. c`` whole.\n\nNext paragraph.") == "Reads ``a.b. c`` whole."
    assert first("Rules, one by one:\n\n* a rule.") == "Rules, one by one."
