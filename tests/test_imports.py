"""Imports run one way: no cycles inside gpt/, and the inference side (model, attention, sampling, decoding,
generation, export, visualisation, serving) loads without the training package."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INFERENCE = [
    "gpt/model/gpt.py", "gpt/model/kv_cache.py", "gpt/inference/sampling.py", "gpt/inference/decoding.py", "gpt/inference/generate.py",
    "gpt/weights/load.py", "gpt/weights/export.py", "gpt/interop/hf.py", "gpt/weights/checkpoint.py", "gpt/tokenizers/tokenizer.py", "gpt/inference/visualize.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "gpt" / "attention").glob("*.py")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "gpt" / "serve").glob("*.py")),
]
INFERENCE_SCRIPTS = ["scripts/generate.py", "scripts/export.py", "scripts/visualize_attention.py", "scripts/eval.py",
                     "scripts/serve.py"]

# In a fresh interpreter, for each file: forget every gpt module, run the file's gpt imports (those inside
# functions too), and report which gpt.train modules came along.
IMPORT_EACH = """
import json, sys
results = {}
for path, statements in json.loads(sys.argv[1]).items():
    for name in [n for n in sys.modules if n == "gpt" or n.startswith("gpt.")]:
        del sys.modules[name]
    for statement in statements:
        exec(statement, {})
    results[path] = sorted(n for n in sys.modules if n == "gpt.train" or n.startswith("gpt.train."))
print(json.dumps(results))
"""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def gpt_imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a gpt module in the file, at module level or inside a function."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "gpt" for a in node.names):
            found.append(node)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gpt":
            found.append(node)
    return found


@pytest.fixture(scope="module")
def training_modules_pulled_in() -> dict[str, list[str]]:
    """For each inference file, the gpt.train modules that importing it (and its lazy imports) loads."""
    plan = {}
    for rel in INFERENCE + INFERENCE_SCRIPTS:
        path = ROOT / rel
        own = [] if rel.startswith("scripts/") else [f"import {module_name(path)}"]
        plan[rel] = own + [ast.unparse(node) for node in gpt_imports(path)]
    result = subprocess.run([sys.executable, "-c", IMPORT_EACH, json.dumps(plan)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_the_inference_library_imports_nothing_from_gpt_train(training_modules_pulled_in):
    pulled = {path: mods for path, mods in training_modules_pulled_in.items() if path in INFERENCE and mods}
    assert pulled == {}


def test_the_inference_scripts_import_nothing_from_gpt_train(training_modules_pulled_in):
    pulled = {path: mods for path, mods in training_modules_pulled_in.items() if path in INFERENCE_SCRIPTS and mods}
    assert pulled == {}


def import_graph() -> dict[str, set[str]]:
    """gpt module -> the gpt modules it imports (``from gpt import x`` names the submodule x when there is one)."""
    files = {module_name(p): p for p in (ROOT / "gpt").rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in gpt_imports(path):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            else:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                            for a in node.names}
        graph[name] = targets - {name}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_no_import_cycles_in_gpt():
    graph = import_graph()
    cycles = sorted(name for name in graph if name in reachable(graph, name))
    assert cycles == [], f"modules that import themselves through others: {cycles}"
    model_needs = reachable(graph, "gpt.model")
    assert {"gpt.inference.sampling", "gpt.inference.decoding", "gpt.inference.generate"}.isdisjoint(model_needs)
    assert "gpt.model" in reachable(graph, "gpt.inference.decoding")  # the decoding side uses the model, not the reverse


def test_only_the_hydra_glue_imports_omegaconf():
    """Configs are typed at the door (gpt.schema.typed): below it, code sees dataclasses, never a DictConfig.
    (gpt/train/sweep.py is a Hydra callback, so it imports hydra, but it reads no config through omegaconf.)"""
    importers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "gpt").rglob("*.py")
                       if any(isinstance(n, (ast.Import, ast.ImportFrom))
                              and any(m.split(".")[0] == "omegaconf"
                                      for m in ([a.name for a in n.names] if isinstance(n, ast.Import)
                                                else [n.module or ""]))
                              for n in ast.walk(ast.parse(p.read_text()))))
    assert importers == ["gpt/schema.py"]


def package(module: str) -> str:
    """The package a gpt module belongs to at the level the layers are drawn: gpt.train.state -> gpt.train."""
    parts = module.split(".")
    return ".".join(parts[:2])


# package -> packages it must never reach, directly or through others: imports run one way (docs/architecture.md)
SCRIPT_BODIES = {"gpt.inference.generate", "gpt.weights.export", "gpt.weights.consolidate", "gpt.cli", "gpt.schema"}
NEVER = {
    "gpt.errors": {"*"},
    "gpt.validate": {"*"},
    "gpt.files": {"*"},
    "gpt.data": {"gpt.train", "gpt.evaluation", "gpt.bench", "gpt.memory", "gpt.model", *SCRIPT_BODIES},
    "gpt.memory": {"gpt.train", "gpt.bench", "gpt.evaluation", "gpt.data", *SCRIPT_BODIES},
    "gpt.evaluation": {"gpt.train", "gpt.bench", *SCRIPT_BODIES},
    "gpt.weights.checkpoint": {"gpt.train", "gpt.weights.load", "gpt.interop.hf", *SCRIPT_BODIES},
    "gpt.weights.load": {"gpt.train", "gpt.evaluation", "gpt.bench", *SCRIPT_BODIES},
    "gpt.inference.visualize": {"gpt.train", "gpt.bench", *SCRIPT_BODIES},
    "gpt.train": {"gpt.bench", *SCRIPT_BODIES},
}
LEAVES_MAY_USE = {"gpt.errors"}  # what the leaves ("*") may import


def test_packages_import_one_way():
    """Not only no cycles: each package stays below the ones that use it (the memory planner, the data and the
    evaluation never load the training package; nothing loads a script's body; the leaves load only errors)."""
    graph = import_graph()
    wrong = {}
    for name in graph:
        never = NEVER.get(package(name), set())
        if not never or name.endswith(".__main__"):  # python -m gpt.memory is an entry point, like a script
            continue
        reached = {package(m) for m in reachable(graph, name)} - {package(name)}
        bad = reached - LEAVES_MAY_USE if "*" in never else reached & never
        if bad:
            wrong[name] = sorted(bad)
    assert wrong == {}, f"modules that reach a package above them: {wrong}"


def test_writers_take_atomic_write_from_gpt_files():
    """One atomic writer: imported from gpt.files itself, never through a module that happens to import it."""
    elsewhere = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "gpt").rglob("*.py")
                       for node in ast.walk(ast.parse(p.read_text()))
                       if isinstance(node, ast.ImportFrom) and node.module != "gpt.files"
                       and any(a.name in ("atomic_write", "atomic_write_all", "load_archive") for a in node.names))
    assert elsewhere == []
