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
