"""docs/architecture.md describes the code as it is: every module, file, class, member, DAG id, setting and
code name it mentions (in backticks, and in the labels of its diagrams) resolves against the tree. A rename
or a removal that leaves the page behind fails here, with the names it no longer finds."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
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
    "RocksDB",
    "StateDirectory",
    "StateRestoreListener",
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
