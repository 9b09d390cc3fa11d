"""docs/interpret.md's experiment runs as written, in quick form (the test corpus, a few steps): the training
commands with train.heads=true log the head scores at each evaluation and train the same numbers as without, and
the analysis command writes its JSON and picture. Each command runs in a fork of the test (conftest.run_forked):
what it checks is what the commands write, and tests/test_e2e.py runs the scripts as processes."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from conftest import ROOT, run_forked

DOC = ROOT / "docs" / "interpret.md"
FAST = ["device=cpu", "train.max_iters=20", "train.eval_interval=10", "train.eval_iters=2", "train.batch_size=4",
        "train.sample_tokens=0", "train.pictures=false"]  # appended: the last wins


def commands() -> list[list[str]]:
    block = re.search(r"^```bash id=experiment\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_experiment_runs_as_written(tmp_path, data_args):
    lines = commands()
    if lines[0][:2] == ["python", "scripts/train_tokenizer.py"]:  # the tokenizer the model is trained with first
        tokenizer, lines = lines[0], lines[1:]
        result = run_forked("train_tokenizer", *tokenizer[2:], *data_args, "evaluate=false", cwd=tmp_path,
                            timeout=600)
        assert result.returncode == 0, f"{tokenizer}\n{result.stderr[-3000:]}"
    scripts = [line[:2] for line in lines]
    assert scripts[0] == ["python", "scripts/train.py"] and scripts[1:] and all(
        script == ["python", "scripts/interpret.py"] for script in scripts[1:])
    for line in lines:
        name = line[1].removeprefix("scripts/").removesuffix(".py")
        extra = [*FAST, *data_args] if name == "train" else ["device=cpu", "batch=2", "prompt=def_f0_1"]  # the
        # test corpus's characters
        result = run_forked(name, *line[2:], *extra, cwd=tmp_path, timeout=600)
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
    run = tmp_path / option(lines[0], "out_dir")
    log = (run / "train.log").read_text()
    assert re.search(r"step 10 heads: induction_best [\d.]+, previous_token_best [\d.]+, in_context_loss", log)
    analyses = {option(line, "analysis"): tmp_path / option(line, "out") for line in lines[1:]}
    result = json.loads((analyses["heads"] / "heads.json").read_text())
    assert set(result["scores"]) == {"previous_token", "duplicate_token", "induction"}
    assert (analyses["heads"] / "heads.png").read_bytes()[:4] == b"\x89PNG"
    assert (analyses["ablation"] / "ablation.json").is_file()
    without = run_forked("train", *lines[0][2:], *FAST, *data_args, "train.heads=false", "out_dir=runs/plain",
                         cwd=tmp_path, timeout=600)
    assert without.returncode == 0, without.stderr[-3000:]
    summaries = [json.loads((path / "summary.json").read_text()) for path in (tmp_path / "runs/plain", run)]
    for key in ("final_train_loss", "final_val_loss"):  # the head scores change no training number
        assert summaries[0][key] == summaries[1][key], key


def option(line: list[str], key: str) -> str:
    """The value a command line gives ``key=``."""
    return next(arg.split("=", 1)[1] for arg in line if arg.startswith(key + "="))
