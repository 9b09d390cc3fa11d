"""The code meets the ruff configuration in pyproject.toml (line length 120, pyflakes, import order, bugbear...)."""

import subprocess

import pytest

from conftest import ROOT


def ruff_binary() -> str | None:
    """The ruff executable of the ruff package (the dev extra installs it), or None without it."""
    try:
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        return None
    return str(find_ruff_bin())


def test_ruff_finds_nothing():
    ruff = ruff_binary()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]' brings it)")
    # A fraction of a second: fast enough for `make test-fast`, so not marked slow.
    result = subprocess.run([ruff, "check", "--no-cache", "gpt", "scripts", "tests"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_function_in_the_library_is_longer_than_a_screen():
    """Functions under gpt/ fit on a screen (70 lines, docstring included): longer ones get split into named parts."""
    import ast

    long = []
    for path in sorted((ROOT / "gpt").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 70:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
    assert long == []
