"""Shared fixtures: a small text corpus, a way to run the real scripts, and the GPT-2 encoding check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def gpt2_encoding_available() -> bool:
    try:
        from gpt.tokenizer import load_gpt2_encoding

        load_gpt2_encoding()
        return True
    except Exception:
        return False


needs_gpt2 = pytest.mark.skipif(
    not gpt2_encoding_available(),
    reason="the GPT-2 encoding (tiktoken r50k_base) is not reachable: set TIKTOKEN_CACHE_DIR to a cache holding it",
)


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    """A folder of small Python-like text files (enough for a tiny model's train and val splits)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(12):
        body = "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(40))
        (folder / f"mod{i:02d}.py").write_text(body)
    return folder


def run_script(
    name: str, *args: str, cwd: Path | None = None, timeout: int = 300, input: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run scripts/<name>.py with args, as a user would, capturing its output; env adds variables."""
    # PYTHONPATH: the scripts import this checkout's gpt package, whatever else is installed.
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    full_env.pop("HYDRA_FULL_ERROR", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / f"{name}.py"), *args],
        cwd=cwd or ROOT,
        env=full_env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
