"""The time-to-loss benchmark: steps, tokens and seconds to the target from each run's evaluations, medians over
seeds (a run that never reaches the target counts as the slowest), and the whole script on a tiny model."""

from __future__ import annotations

import csv
import math

import pytest

from conftest import run_forked
from gpt.arena.time_to_loss import medians, reached, rows


def result(recipe: str, seed: int, losses: list[float], final: float) -> dict:
    curve = [(80 * i, 1000.0 + 10 * i, loss) for i, loss in enumerate(losses)]
    summary = {"tokens": 4096 * 80 * (len(losses) - 1), "step": 80 * (len(losses) - 1), "final_val_loss": final,
               "tokens_per_sec": 25_000.0 + seed, "wall_s": 300.0, "peak_memory_bytes": 2**28}
    return {"recipe": recipe, "seed": seed, "launched": 995.0, "summary": summary, "curve": curve}


def test_the_first_evaluation_at_or_below_the_target_counts_and_medians_rank_a_miss_last():
    assert reached(result("a", 1, [3.0, 2.0, 1.5, 1.4], 1.4), 1.5) == {"steps": 160, "tokens": 160 * 4096,
                                                                       "seconds": 25.0}
    assert all(math.isnan(v) for v in reached(result("a", 1, [3.0, 2.0], 2.0), 1.5).values())
    results = [result("gpt2", s, [3.0, 2.0, 1.6], 1.6) for s in (1, 2, 3)] + [
        result("modern", 1, [3.0, 1.5, 1.4], 1.4), result("modern", 2, [3.0, 1.7, 1.55], 1.55),
        result("modern", 3, [3.0, 1.9, 1.8], 1.8)]
    table = rows(results, target=1.6)
    gpt2, modern = medians(table, ["gpt2", "modern"])
    assert (gpt2["steps"], gpt2["reached"], gpt2["final_val_loss"]) == (160, 3, 1.6)
    assert (modern["steps"], modern["reached"], modern["final_val_loss"]) == (160, 2, 1.55)  # 80, 160, never


@pytest.mark.slow
def test_the_script_trains_each_recipe_and_continues_an_interrupted_benchmark(tmp_path, data_args):
    out = tmp_path / "ttl"
    args = ["recipes=[gpt2,modern]", "seeds=[1]", "eval_interval=10", f"out_dir={out}",
            "overrides=[" + ",".join(f"'{o}'" for o in ["model=tiny", "device=cpu", "train.max_iters=30",
                                                          "train.batch_size=8", "train.warmup_iters=5",
                                                          "train.eval_iters=2", "train.sample_tokens=0",
                                                          *data_args]) + "]"]
    # the script's main() in forks (its processes: test_hostile_runs); it starts each training as a process
    first = run_forked("time_to_loss", "recipes=[gpt2]", *args[1:], timeout=600)  # stopped after one run ...
    assert first.returncode == 0, first.stderr[-3000:]
    result = run_forked("time_to_loss", *args, timeout=600)  # ... continued: the finished run is read back
    assert result.returncode == 0, result.stderr[-3000:]
    assert "gpt2-seed1: done before" in result.stdout and "modern-seed1: training" in result.stdout
    with open(out / "time_to_loss.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["recipe"], r["seed"]) for r in table] == [("gpt2", "1"), ("modern", "1")]
    assert all(int(r["final_step"]) == 30 and float(r["tokens_per_s"]) > 0 for r in table)
    assert "**Median over 1 seeds**" in (out / "time_to_loss.md").read_text()
    assert (out / "time_to_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_resumed_runs_seconds_to_the_target_count_training_not_the_pause(tmp_path):
    """A run interrupted (Ctrl-C) and resumed: its evaluations from the first process came before this launch, and
    seconds to the target were negative (-11 s measured). They count the training of both processes now."""
    from torch.utils.tensorboard import SummaryWriter

    from gpt.arena.time_to_loss import val_curve

    writer = SummaryWriter(str(tmp_path))  # launched at 998: evaluations at 0 and 10; relaunched at 1498: 10 again, 20
    for step, wall, val in [(0, 1000.0, 3.0), (10, 1004.0, 2.5), (10, 1500.0, 2.5), (20, 1503.0, 2.0)]:
        writer.add_scalar("val/loss", val, step, walltime=wall)
    writer.close()
    launched, curve = val_curve(tmp_path, started=1498.0)
    result = {"launched": launched, "curve": curve, "summary": {"tokens": 2000, "step": 20}}
    assert reached(result, 2.5) == {"steps": 10, "tokens": 1000, "seconds": 6.0}  # 2 s start-up + 4 s
    assert reached(result, 2.0) == {"steps": 20, "tokens": 2000, "seconds": 11.0}  # + 2 s start-up again + 3 s
