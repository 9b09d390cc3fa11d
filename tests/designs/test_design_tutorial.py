"""docs/designs.md runs as written: its design file is saved in a folder outside the project, and every command of
its bash blocks runs there (on the test corpus, on the CPU, with fewer steps and tokens): the design is listed,
trains, samples, draws its pictures and is ranked in the arena beside GPT-2; without it, its checkpoint says how
to bring it, as the doc shows."""

from __future__ import annotations

import csv
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, run_script

DOC = ROOT / "docs" / "designs.md"
FAST = ["device=cpu", "train.eval_iters=2", "train.max_iters=20", "train.batch_size=8",  # appended: the last wins
        "arena.tokens=2048", "arena.eval_tokens=1024", "arena.decode_tokens=16"]


def commands() -> list[str]:
    """Every command line of the doc's bash blocks, in order."""
    blocks = re.findall(r"^```bash\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_tutorial_runs_as_written(tmp_path, data_args):
    code = re.search(r"^```python file=talking_heads\.py\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M).group(1)
    (tmp_path / "talking_heads.py").write_text(code)
    # as a new user's shell: no design loaded by this test session (tests/designs/test_designs.py loads the same file
    # from another folder, and a loaded design is passed on to child processes through GPT_DESIGNS)
    clean = {"GPT_DESIGNS": ""}
    env = {**os.environ, "PYTHONPATH": str(ROOT), **clean}
    lines = commands()
    assert [shlex.split(line)[1 if line.startswith("GPT_") else 0] for line in lines] == ["python"] * 5
    listed = subprocess.run(["env", *shlex.split(lines[0])[:1], sys.executable, "-m", "gpt.attention", "cpu"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and re.search(r"^talking_heads +model.designs=\[talking_heads\] +- +its own",
                                                listed.stdout, flags=re.M), listed.stdout[-2000:]
    outputs = {}
    for line in lines[1:]:
        script, *args = shlex.split(line)[1:]
        name = script.removeprefix("scripts/").removesuffix(".py")
        extra = [*(a for a in FAST if a.split(".")[0] in (name, "device=cpu")), *data_args] if name in (
            "train", "arena") else ["device=cpu"]
        extra += ["prompt=return"] if name == "visualize_attention" else []  # characters of the test corpus
        result = run_script(name, *args, *extra, cwd=tmp_path, timeout=600, env=clean)
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
        outputs[name] = result.stdout
    assert outputs["generate"].strip()
    assert (tmp_path / "talking_heads.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(tmp_path / "runs" / "arena_talking_heads" / "arena.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["gpt2", "talking_heads"]
    assert all(r["error"] == "" and 0 < float(r["val_bpb"]) < 10 for r in rows.values())
    # 2 layers x two 2 x 2 mixing matrices (model=tiny has 2 heads) beside GPT-2's parameters
    assert int(rows["talking_heads"]["params"]) - int(rows["gpt2"]["params"]) == 2 * 2 * 2 * 2
    # without the design, its checkpoint gives the error the doc shows, in one line and a hint
    refused = run_script("generate", "ckpt=runs/talking_heads", "device=cpu", cwd=tmp_path, env=clean)
    documented = re.search(r"^```text\n(error: .*?)\n(hint: .*?)\n```", DOC.read_text(), flags=re.M)
    error, hint = refused.stderr.strip().splitlines()[-2:]
    assert refused.returncode == 2 and hint == documented.group(2) and "Traceback" not in refused.stderr
    assert error.startswith(documented.group(1).split("(known:")[0])
