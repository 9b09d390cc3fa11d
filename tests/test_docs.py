"""Docs that cannot drift: every ``gpt.x.y`` name and every project path in README.md and docs/ exists, the layer
table of docs/architecture.md matches the import graph, and the default run's time is quoted once."""

from __future__ import annotations

import importlib
import re
from fnmatch import fnmatch

import pytest

from conftest import ROOT
from test_imports import import_graph, module_name

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAME = re.compile(r"(?<![\w/.-])gpt(?:\.[A-Za-z_]\w*)+")  # gpt.model.design.Design, not runs/gpt.x or a.gpt.b
PATH = re.compile(r"(?<![\w/.-])((?:gpt|scripts|configs|tests|docs)/[\w/.*<>-]*\w)")


def mentioned(pattern: re.Pattern) -> list[tuple[str, str]]:
    return sorted({(doc.relative_to(ROOT).as_posix(), m.group(0 if pattern is NAME else 1))
                   for doc in DOCS for m in pattern.finditer(doc.read_text())})


def resolve(name: str) -> object:
    """The module, or the attribute of the longest importable module prefix, that a dotted name means."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[i:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(name)


@pytest.mark.parametrize("doc, name", mentioned(NAME))
def test_every_dotted_name_resolves(doc, name):
    try:
        resolve(name)
    except (ImportError, AttributeError) as err:
        pytest.fail(f"{doc} names {name}, which does not resolve: {err}")


@pytest.mark.parametrize("doc, path", [(d, p) for d, p in mentioned(PATH) if "<" not in p])
def test_every_project_path_exists(doc, path):
    assert list(ROOT.glob(path)) or (ROOT / path).exists(), f"{doc} names {path}, which does not exist"


def layer_table() -> list[list[str]]:
    """The rows of docs/architecture.md's layer table, top to bottom: each row's module entries."""
    section = (ROOT / "docs" / "architecture.md").read_text().split("## Layers")[1].split("\n## ")[0]
    rows = [line.split("|")[2] for line in section.splitlines() if line.startswith("| ") and "`" in line]
    return [re.findall(r"`([^`]+)`", row) for row in rows]


def row_of(path: str, rows: list[list[str]]) -> int:
    """The row of a module path: the row holding its most specific entry (a file, or the longest folder)."""
    matches = [(len(entry), -i, i) for i, entries in enumerate(rows) for entry in entries
               if path == entry or (entry.endswith("/") and path.startswith(entry)) or fnmatch(path, entry)]
    assert matches, f"{path} is in no row of docs/architecture.md's layer table"
    return max(matches)[2]


def test_the_layer_table_holds_every_module_and_imports_run_down_it():
    rows = layer_table()
    assert rows[0] == ["scripts/"] and len(rows) >= 8
    paths = {module_name(p): p.relative_to(ROOT).as_posix() for p in (ROOT / "gpt").rglob("*.py")}
    row = {name: row_of(path, rows) for name, path in paths.items()}
    upward = sorted(f"{a} ({paths[a]}, row {row[a]}) imports {b} ({paths[b]}, row {row[b]})"
                    for a, targets in import_graph().items() for b in targets if b in row and row[b] < row[a])
    assert upward == [], "imports that run up docs/architecture.md's layer table:\n" + "\n".join(upward)


def test_the_default_run_time_is_quoted_once():
    """One measured figure for `make train`, in README's "The default run"; nothing else restates it."""
    readme = (ROOT / "README.md").read_text()
    times = re.findall(r"\b\d+ min(?: \d+ s)?\b|~\s*\d+ min", readme)
    assert len(times) == 1, f"README quotes the default run's time {len(times)} times: {times}"
    assert times[0] in readme.split("## The default run")[1].split("\n## ")[0]
    for doc in DOCS[1:]:
        for line in doc.read_text().splitlines():
            assert not ("make train" in line and re.search(r"\d+ min", line)), f"{doc.name}: {line}"
