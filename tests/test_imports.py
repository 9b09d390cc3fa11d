"""Imports run one way: the folders of gpt/ in the order of docs/architecture.md's layer table, no cycle among
modules (seen as Python runs them: a package's __init__ before its modules, importlib and __import__ too), no module
re-entered while it is still importing, and the inference side and the default model load what they need only."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("model", "kernels", "designs", "tokenizers", "inference", "interpret", "weights", "interop", "arena",
           "probes", "bench", "data", "train", "memory", "evaluation", "serve")
INFERENCE = sorted(str(p.relative_to(ROOT)) for folder in ("model", "kernels", "designs", "tokenizers", "inference",
                                                           "interop", "serve")
                   for p in (ROOT / "gpt" / folder).rglob("*.py") if "modeling" not in p.parts)
INFERENCE += ["gpt/weights/load.py", "gpt/weights/export.py", "gpt/weights/checkpoint.py"]
INFERENCE_SCRIPTS = ["scripts/generate.py", "scripts/export.py", "scripts/visualize_attention.py", "scripts/eval.py",
                     "scripts/serve.py", "scripts/chat.py"]
# Imports by a name computed at run time, which the graph cannot follow: each says what it imports and why.
DYNAMIC = {
    "gpt/designs/loading.py": "a user's design file, package or module (designs=[...], GPT_DESIGNS): never gpt's",
    "gpt/schema.py": "the typed config of the command being run, by SCHEMAS' name (in the graph as its edges)",
}

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


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for p in (ROOT / "gpt").rglob("*.py")}


def gpt_imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a gpt module in the file, at module level or inside a function."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "gpt" for a in node.names):
            found.append(node)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gpt":
            found.append(node)
    return found


def dynamic_imports(path: Path) -> tuple[set[str], list[int]]:
    """importlib.import_module / __import__ / importlib.util.spec_from_file_location calls: the gpt modules named
    by a literal, and the lines of those whose argument is computed."""
    named, computed = set(), []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        if func not in ("importlib.import_module", "import_module", "__import__",
                        "importlib.util.spec_from_file_location", "spec_from_file_location") or not node.args:
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if arg.value.split(".")[0] == "gpt":
                named.add(arg.value)
        else:
            computed.append(node.lineno)
    return named, computed


def schema_modules() -> set[str]:
    """The modules gpt.schema imports by name: the dataclass of each command (SCHEMAS' "module:Class" values)."""
    tree = ast.parse((ROOT / "gpt" / "schema.py").read_text())
    table = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "SCHEMAS" for t in node.targets))
    return {value.value.partition(":")[0] for value in table.values if value.value.startswith("gpt.")}


def ancestors(module: str) -> list[str]:
    """The packages Python imports before ``module``, below the root gpt (which every module shares)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def targets_of(name: str, module: str, files: dict[str, Path]) -> set[str]:
    """What importing ``module`` from ``name`` runs: the module and each package above it that ``name`` is not
    itself inside (a module's own packages are already running when it runs)."""
    own = set(ancestors(name)) | ({name} if files[name].name == "__init__.py" else set())
    return {module} | {a for a in ancestors(module) if a not in own}


def import_graph() -> dict[str, set[str]]:
    """gpt module -> the gpt modules importing it runs: ``from gpt import x`` names the submodule x when there is
    one, the packages above a module run first, importlib's and __import__'s literal names count, and gpt.schema
    reaches the configs of SCHEMAS."""
    files = project_modules()
    graph = {}
    for name, path in files.items():
        modules = set()
        for node in gpt_imports(path):
            if isinstance(node, ast.Import):
                modules |= {a.name for a in node.names}
            else:
                modules |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                            for a in node.names}
        modules |= dynamic_imports(path)[0]
        if name == "gpt.schema":
            modules |= schema_modules()
        targets = set()
        for module in modules - {"gpt"}:
            targets |= targets_of(name, module, files) if module in files else {module}
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


def layer_table() -> list[list[str]]:
    """The rows of docs/architecture.md's layer table, top to bottom: each row's entries (folders, files, patterns)."""
    section = (ROOT / "docs" / "architecture.md").read_text().split("## Layers")[1].split("\n## ")[0]
    rows = [line.split("|")[2] for line in section.splitlines() if line.startswith("| ") and "`" in line]
    return [re.findall(r"`([^`]+)`", row) for row in rows]


def row_of(path: str, rows: list[list[str]]) -> int:
    """The row of a module path: the row holding its most specific entry (a file, or the longest folder)."""
    matches = [(len(entry), -i, i) for i, entries in enumerate(rows) for entry in entries
               if path == entry or (entry.endswith("/") and path.startswith(entry)) or fnmatch(path, entry)]
    assert matches, f"{path} is in no row of docs/architecture.md's layer table"
    return max(matches)[2]


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


def test_no_import_cycles_in_gpt():
    graph = import_graph()
    cycles = sorted(name for name in graph if name in reachable(graph, name))
    assert cycles == [], f"modules that import themselves through others: {cycles}"
    model_needs = reachable(graph, "gpt.model")
    assert not {m for m in model_needs if m.split(".")[1] not in ("model", "kernels", "errors")}, model_needs
    assert "gpt.model" in reachable(graph, "gpt.inference.decoding")  # decoding uses the model, not the reverse


def test_the_graph_sees_what_python_runs_first_and_importlib():
    """The graph's rules, on the project's own cases: a design's import of gpt.model.design runs gpt.model's
    __init__ first; gpt.schema reaches the training config through SCHEMAS; a computed importlib name is declared."""
    graph = import_graph()
    assert {"gpt.model", "gpt.model.design"} <= graph["gpt.designs.diff"]
    assert "gpt.train.config" in graph["gpt.schema"]
    undeclared = {}
    for path in project_modules().values():
        rel = path.relative_to(ROOT).as_posix()
        lines = dynamic_imports(path)[1]
        if lines and rel not in DYNAMIC:
            undeclared[rel] = lines
    assert undeclared == {}, f"imports by a computed name the graph cannot follow (declare in DYNAMIC): {undeclared}"


# In a fresh interpreter, import each module named in argv[1] from nothing (every gpt module forgotten first), with
# an import hook that records any import reaching a module (or a package above it) whose own body is still running
# and that does not contain the importer: Python then hands over a half-made module, a loop at run time.
RUNTIME_LOOPS = """
import builtins, importlib, json, sys
loops = []
real = builtins.__import__

def running(name):
    module = sys.modules.get(name)
    return module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False)

def check(importer, name, fromlist):
    parts = name.split(".")
    names = [".".join(parts[:i]) for i in range(2, len(parts) + 1)]
    names += [f"{name}.{f}" for f in fromlist or () if f != "*"]
    for target in names:
        if running(target) and importer != target and not importer.startswith(target + "."):
            loops.append([importer, target])

def hooked(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and name.startswith("gpt."):
        check((globals or {}).get("__name__", ""), name, fromlist)
    return real(name, globals, locals, fromlist, level)

builtins.__import__ = hooked
for start in json.loads(sys.argv[1]):
    for name in [n for n in sys.modules if n == "gpt" or n.startswith("gpt.")]:
        del sys.modules[name]
    importlib.import_module(start)
print(json.dumps(loops))
"""


def test_no_module_is_reentered_while_it_imports():
    """The runtime side of no cycles: starting from the package, each of its folders, and every module of the
    layers that others build on (model, kernels, designs), nothing imports a module that is still running."""
    files = project_modules()
    starts = ["gpt", *sorted(f"gpt.{f}" for f in FOLDERS)]
    starts += sorted(name for name in files if name.split(".")[1:2] in (["model"], ["kernels"], ["designs"])
                     and not name.endswith("__main__") and ".modeling" not in name)
    result = subprocess.run([sys.executable, "-c", RUNTIME_LOOPS, json.dumps(starts)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []


DEFAULT_MODEL = """
import sys, torch
from gpt.model import GPT, GPTConfig
model = GPT(GPTConfig())
idx = torch.randint(0, model.config.vocab_size, (1, 16))
logits, loss = model(idx, idx)
loss.backward()
assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
print(" ".join(sorted(n for n in sys.modules if n.startswith("gpt."))))
"""


def test_the_default_model_trains_a_step_on_the_model_alone():
    """GPT-2's default model, one forward and backward, in a fresh process: nothing of the folders above the model
    (weights, formats, tokenizers, inference, data, training, serving, the arena) is imported."""
    result = subprocess.run([sys.executable, "-c", DEFAULT_MODEL], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    above = ("arena", "probes", "weights", "interop", "tokenizers", "inference", "data", "train", "serve", "bench",
             "evaluation", "memory", "interpret")
    assert [m for m in loaded if m.split(".")[1] in above] == []
    assert "gpt.designs.rope" in loaded  # the built-in designs are registered all the same


def folder_of(module: str) -> str:
    """A module's place in the layers: its folder under gpt/ (gpt.weights.load -> weights), or its own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gpt"


def test_folders_import_downward():
    """Folder by folder: every module of a folder sits in the folder's row of docs/architecture.md's layer table
    (a folder's __main__, a command like a script, sits with them at the top), and no import runs to a higher row."""
    rows = layer_table()
    files = project_modules()
    paths = {name: path.relative_to(ROOT).as_posix() for name, path in files.items()}
    row = {name: row_of(path, rows) for name, path in paths.items()}
    for folder in FOLDERS:
        inside = {row[n] for n in files if folder_of(n) == folder and not n.endswith(".__main__")}
        assert len(inside) == 1, f"gpt/{folder}/ is split across rows {sorted(inside)}: a folder is one layer"
    upward = sorted(f"{a} (row {row[a]}) imports {b} (row {row[b]})"
                    for a, targets in import_graph().items() for b in targets if b in row and row[b] < row[a])
    assert upward == [], "imports that run up docs/architecture.md's layer table:\n" + "\n".join(upward)


def test_top_level_has_few_modules_and_no_folder_dominates():
    """gpt/ keeps at most 8 modules beside its folders, and no folder holds more than 15% of the package's lines."""
    top = sorted(p.name for p in (ROOT / "gpt").glob("*.py"))
    assert len(top) <= 8, top
    lines = {p: len(p.read_text().splitlines()) for p in (ROOT / "gpt").rglob("*.py")}
    total = sum(lines.values())
    shares = {folder: sum(n for p, n in lines.items() if p.relative_to(ROOT / "gpt").parts[0] == folder) / total
              for folder in FOLDERS}
    assert max(shares.values()) <= 0.15, shares


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


# package -> packages it must never reach, directly or through others: beyond the layer order, what must stay apart
# even where the order would allow it (the planner, the data and the evaluation never load the training package)
NEVER = {
    "gpt.errors": {"*"},
    "gpt.validate": {"*"},
    "gpt.files": {"*"},
    "gpt.data": {"gpt.train", "gpt.evaluation", "gpt.bench", "gpt.memory", "gpt.weights", "gpt.cli", "gpt.schema"},
    "gpt.memory": {"gpt.train", "gpt.bench", "gpt.evaluation", "gpt.data", "gpt.cli", "gpt.schema"},
    "gpt.evaluation": {"gpt.train", "gpt.bench", "gpt.arena", "gpt.cli", "gpt.schema"},
    "gpt.weights": {"gpt.train", "gpt.inference", "gpt.cli", "gpt.schema"},
    "gpt.inference": {"gpt.train", "gpt.bench", "gpt.arena", "gpt.cli", "gpt.schema"},
    "gpt.train": {"gpt.bench", "gpt.arena", "gpt.cli", "gpt.schema"},
}
LEAVES_MAY_USE = {"gpt.errors"}  # what the leaves ("*") may import


def package(module: str) -> str:
    """The package a gpt module belongs to at the level the layers are drawn: gpt.train.state -> gpt.train."""
    return ".".join(module.split(".")[:2])


def test_packages_import_one_way():
    """Not only no cycles: each package stays below the ones that use it (the memory planner, the data and the
    evaluation never load the training package; nothing loads a command's door; the leaves load only errors)."""
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


USERS_NAMES = """
import gpt.attention.masks, gpt.kernels.masks
from gpt import GPT, GPTConfig, attention, kernels
from gpt.attention.masks import combine, expand_kv
from gpt.designs import Design, reference, register
from gpt.model import GPT as ModelGPT, MLP, Block, CausalSelfAttention, Context, GPTConfig as ModelConfig
assert attention.register is kernels.register and gpt.attention.masks is gpt.kernels.masks
assert (ModelGPT, ModelConfig) == (GPT, GPTConfig)
config = GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11, designs=["rope", "qk_norm"])
assert [d.name for d in gpt.designs.active(config)] == ["qk_norm", "rope"]  # registered with no import of gpt.designs
"""


def test_the_names_users_type_still_import():
    """What users' code and design files import keeps working after the relayout (gpt.attention is gpt.kernels, the
    model's names come from gpt.model), and a config read with nothing but gpt.model imported knows the designs."""
    result = subprocess.run([sys.executable, "-c", USERS_NAMES], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    for command in (["-m", "gpt.attention", "cpu"], ["-m", "gpt.consolidate"]):
        done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert "Traceback" not in done.stderr and done.returncode in (0, 2), done.stderr
