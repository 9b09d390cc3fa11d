"""Docs that cannot drift: every ``gpt.x.y`` name and every project path in README.md and docs/ exists, the layer
table of docs/architecture.md matches the import graph, and the default run's time is quoted once."""

from __future__ import annotations

import importlib
import re

import pytest

from conftest import ROOT
from test_imports import layer_table

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


def test_the_layer_table_starts_at_the_scripts():
    rows = layer_table()
    assert rows[0][0] == "scripts/" and len(rows) >= 8


def layout_block() -> str:
    return (ROOT / "README.md").read_text().split("## Layout")[1].split("```")[1]


def test_readme_layout_names_every_folder_and_module_of_gpt_and_nothing_else():
    """README's layout block against the tree: each folder and top-level module of gpt/ (and the checkout's top
    folders it lists) named once, nothing named that is not there."""
    named, top = [], []
    for line in layout_block().splitlines():
        if line.startswith("  ") and not line.startswith("   "):  # gpt/'s entries: "  name  what;  name  what"
            named += [part.split()[0] for part in line.strip().split(";  ")]
        elif line and not line.startswith(" "):
            top.append(line.split()[0])
    tree = sorted([p.name + "/" for p in (ROOT / "gpt").iterdir() if p.is_dir() and any(p.glob("*.py"))]
                  + [p.name for p in (ROOT / "gpt").glob("*.py") if p.name != "__init__.py"])
    assert sorted(named) == tree
    assert all((ROOT / name).is_dir() for name in top) and "gpt/" in top


def test_the_default_run_time_is_quoted_once():
    """One measured figure for `make train`, in README's "The default run"; nothing else restates it."""
    readme = (ROOT / "README.md").read_text()
    times = re.findall(r"\b\d+ min(?: \d+ s)?\b|~\s*\d+ min", readme)
    assert len(times) == 1, f"README quotes the default run's time {len(times)} times: {times}"
    assert times[0] in readme.split("## The default run")[1].split("\n## ")[0]
    for doc in DOCS[1:]:
        for line in doc.read_text().splitlines():
            assert not ("make train" in line and re.search(r"\d+ min", line)), f"{doc.name}: {line}"
