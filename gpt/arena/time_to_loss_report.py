"""The time-to-loss benchmark's outputs in out_dir: time_to_loss.md (the medians per recipe, then every run),
time_to_loss.csv (one row per run) and time_to_loss.png (validation loss against steps and against seconds)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpt.arena.report import write_csv
from gpt.bench.report import markdown_table
from gpt.files import atomic_write

COLUMNS = ["recipe", "seed", "steps", "tokens", "seconds", "final_val_loss", "final_step", "tokens_per_s", "wall_s",
           "peak_mib"]


def _number(value: float, spec: str) -> str:
    return "not reached" if math.isnan(value) else format(value, spec)


def summary_table(medians: list[dict[str, Any]]) -> str:
    """Per recipe: the medians over seeds, and each figure against the first recipe's."""
    base = medians[0]
    headers = ["recipe", "seeds reaching", "steps to target", "tokens to target", "seconds to target",
               "final val loss", "tokens/s", "wall s", "peak MiB"]
    table = []
    for m in medians:
        versus = "" if m is base or math.isnan(m["steps"]) or math.isnan(base["steps"]) else \
            f" ({m['steps'] / base['steps']:.2f}x)"
        speed = "" if m is base else f" ({m['tokens_per_s'] / base['tokens_per_s']:.1%})"
        loss = "" if m is base else f" ({m['final_val_loss'] - base['final_val_loss']:+.4f})"
        table.append([m["recipe"], f"{m['reached']}/{m['seeds']}", _number(m["steps"], ".0f") + versus,
                      _number(m["tokens"], ",.0f"), _number(m["seconds"], ".0f"), f"{m['final_val_loss']:.4f}{loss}",
                      f"{m['tokens_per_s']:,.0f}{speed}", f"{m['wall_s']:.0f}", f"{m['peak_mib']:,.0f}"])
    return markdown_table(headers, table)


def runs_table(rows: list[dict[str, Any]]) -> str:
    headers = ["recipe", "seed", "steps to target", "seconds to target", "final val loss", "tokens/s", "wall s"]
    return markdown_table(headers, [[r["recipe"], r["seed"], _number(r["steps"], ".0f"), _number(r["seconds"], ".0f"),
                                     f"{r['final_val_loss']:.4f}", f"{r['tokens_per_s']:,.0f}", f"{r['wall_s']:.0f}"]
                                    for r in rows])


def plot(results: list[dict[str, Any]], recipes: list[str], target: float, path: Path) -> None:
    """Validation loss against steps (left) and seconds from launch (right), one colour per recipe, the target
    as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_steps, by_seconds) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    colours = {recipe: f"C{i}" for i, recipe in enumerate(recipes)}
    for r in results:
        steps, walls, losses = zip(*r["curve"]) if r["curve"] else ((), (), ())
        label = r["recipe"] if r["seed"] == results[0]["seed"] else None
        by_steps.plot(steps, losses, color=colours[r["recipe"]], marker="o", ms=2, lw=1, label=label)
        by_seconds.plot([w - r["launched"] for w in walls], losses, color=colours[r["recipe"]], marker="o", ms=2, lw=1)
    for axes in (by_steps, by_seconds):
        axes.axhline(target, color="grey", ls="--", lw=1)
    lows = [loss for r in results for _, _, loss in r["curve"]]
    by_steps.set_ylim(min(lows) - 0.05, min(max(lows), target + 1.0))
    by_steps.set(xlabel="optimizer step", ylabel="validation loss (nats/token)", title=f"to {target:.4f}: steps")
    by_seconds.set(xlabel="seconds from launch", title="wall-clock time")
    by_steps.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), what="the time-to-loss plot")
    plt.close(fig)


def write_report(out: Path, cfg: Any, results: list[dict[str, Any]], rows: list[dict[str, Any]],
                 medians: list[dict[str, Any]], target: float) -> str:
    """time_to_loss.md, .csv and .png in ``out``; returns the markdown."""
    how = "given" if cfg.target is not None else f"the median final val loss of {cfg.recipes[0]}"
    text = (f"target validation loss {target:.4f} ({how}); evaluations every {cfg.eval_interval} steps; "
            f"runs: {' '.join(cfg.overrides) or 'the defaults'}\n\n"
            f"**Median over {len(cfg.seeds)} seeds**\n\n{summary_table(medians)}\n\n**Every run**\n\n"
            f"{runs_table(rows)}\n")
    atomic_write(out / "time_to_loss.md", lambda f: f.write(text.encode()), what="the time-to-loss table")
    write_csv(out / "time_to_loss.csv", COLUMNS, rows, what="the time-to-loss rows")
    plot(results, cfg.recipes, target, out / "time_to_loss.png")
    return text
