"""docs/interpret.md's experiment runs as written, in quick form (the test corpus, a few steps): the training
commands with train.heads=true log the head scores at each evaluation and train the same numbers as without, and
the analysis command writes its JSON and picture."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from conftest import ROOT, run_script

DOC = ROOT / "docs" / "interpret.md"
FAST = ["device=cpu", "train.max_iters=20", "train.eval_interval=10", "train.eval_iters=2", "train.batch_size=4",
        "train.sample_tokens=0", "train.pictures=false"]  # appended: the last wins


def commands() -> list[list[str]]:
    block = re.search(r"^```bash id=experiment\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_experiment_runs_as_written(tmp_path, data_args):
    lines = commands()
    scripts = [line[:2] for line in lines]
    assert scripts == [["python", "scripts/train.py"]] * 2 + [["python", "scripts/interpret.py"]] * 2
    for line in lines:
        name = line[1].removeprefix("scripts/").removesuffix(".py")
        extra = [*FAST, *data_args] if name == "train" else ["device=cpu", "batch=2"]
        result = run_script(name, *line[2:], *extra, cwd=tmp_path, timeout=600)
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
    for run in ("runs/induction_rope", "runs/induction_rope256"):
        log = (tmp_path / run / "train.log").read_text()
        assert re.search(r"step 10 heads: induction_best [\d.]+, previous_token_best [\d.]+, in_context_loss", log)
        result = json.loads((tmp_path / run / "interpret" / "heads.json").read_text())
        assert set(result["scores"]) == {"previous_token", "duplicate_token", "induction"}
        assert (tmp_path / run / "interpret" / "heads.png").read_bytes()[:4] == b"\x89PNG"
    without = run_script("train", *lines[0][2:], *FAST, *data_args, "train.heads=false", "out_dir=runs/plain",
                         cwd=tmp_path, timeout=600)
    assert without.returncode == 0, without.stderr[-3000:]
    summaries = [json.loads((tmp_path / run / "summary.json").read_text()) for run in ("runs/plain",
                                                                                     "runs/induction_rope")]
    for key in ("final_train_loss", "final_val_loss"):  # the head scores change no training number
        assert summaries[0][key] == summaries[1][key], key
