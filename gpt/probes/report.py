"""The card in out_dir: probes.md (accuracy per design and metric, mean ± std over seeds, the one-sided Welch p of
each design above the baseline, and the composite), probes.csv (every seed's every metric), probes_summary.csv (the
summary's numbers), the pictures (gpt.probes.plots: accuracy by pairs, retrieval by length) and the same numbers as
TensorBoard scalars (out_dir/tensorboard); with probes.arena, the validity check (gpt.probes.validity). The
statistics are the arena's (gpt.arena.stats); higher accuracy is better, lower bits per byte (the corpus task's
metrics, named in ``lower``), which the composite leaves out."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpt.arena.report import make_out_dir, number, write_csv
from gpt.arena.stats import mean_std, verdict, welch_less
from gpt.bench.report import markdown_table
from gpt.files import atomic_write

COMPOSITE = "composite"
PER_SEED = ["task", "design", "seed", "metric", "score", "lr", "val", "params", "train_s", "spec"]  # score: accuracy
# or, for the corpus task's metrics, bits per byte
SUMMARY = ["metric", "design", "seeds", "mean", "std", "p", "p_below", "verdict"]


def per_seed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (task, design, seed, metric)."""
    return [{**{k: r.get(k) for k in PER_SEED if k not in ("metric", "score")}, "metric": m, "score": a}
            for r in rows for m, a in r["metrics"].items()]


def scores(rows: list[dict[str, Any]], lower: frozenset[str] = frozenset()
           ) -> dict[str, dict[str, dict[int, float]]]:
    """metric -> design -> seed -> score, and the composite: each design's mean over every accuracy (the metrics
    not in ``lower``) for a seed that finished them all (a seed missing one has no composite; no accuracy, none)."""
    table: dict[str, dict[str, dict[int, float]]] = {}
    for r in per_seed(rows):
        table.setdefault(r["metric"], {}).setdefault(r["design"], {})[r["seed"]] = r["score"]
    metrics = [m for m in table if m not in lower]
    if not metrics:
        return table
    designs = list(dict.fromkeys(r["design"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    table[COMPOSITE] = {d: {s: math.fsum(table[m][d][s] for m in metrics) / len(metrics) for s in seeds
                            if all(s in table[m].get(d, {}) for m in metrics)} for d in designs}
    return table


def summarise(rows: list[dict[str, Any]], baseline: str, alpha: float,
              lower: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """One row per (metric, design): mean and sample std over seeds, and the one-sided Welch p of the design's
    score being above the baseline's (p) and below it (p_below), each computed, not one as 1 - the other; the
    verdict reads p for an accuracy, p_below for a metric in ``lower`` (bits per byte: below is better)."""
    out = []
    for metric, by_design in scores(rows, lower).items():
        base = list(by_design.get(baseline, {}).values())
        for design, by_seed in by_design.items():
            values = list(by_seed.values())
            mean, std = mean_std(values)
            p = welch_less(base, values) if design != baseline else math.nan
            below = welch_less(values, base) if design != baseline else math.nan
            out.append({"metric": metric, "design": design, "seeds": len(values), "mean": mean, "std": std, "p": p,
                        "p_below": below, "verdict": "baseline" if design == baseline else
                        verdict(below if metric in lower else p, alpha)})
    return out


def card(groups: list[dict[str, Any]], lower: frozenset[str] = frozenset()) -> str:
    """Designs down, metrics across: mean ± std, then the verdict against the baseline with the one-sided p of its
    direction (worse: the p of being worse; better or n.s.: of being better; a metric in ``lower`` is better
    below)."""
    metrics = list(dict.fromkeys(g["metric"] for g in groups))
    designs = list(dict.fromkeys(g["design"] for g in groups))
    at = {(g["metric"], g["design"]): g for g in groups}

    def cell(g: dict[str, Any] | None) -> str:
        if g is None or not g["seeds"]:
            return "-"
        text = number(g["mean"], ".3f") + (f" ± {g['std']:.3f}" if g["seeds"] > 1 else "")
        if not math.isnan(g["p"]):
            better, worse = (g["p_below"], g["p"]) if g["metric"] in lower else (g["p"], g["p_below"])
            text += f" (worse, p {worse:.2g})" if g["verdict"] == "worse" else f" ({g['verdict']}, p {better:.2g})"
        return text

    return markdown_table(["design", *metrics], [[d, *(cell(at.get((m, d))) for m in metrics)] for d in designs])


def write_tensorboard(out: Path, groups: list[dict[str, Any]], text: str) -> None:
    """The summary as scalars (step 0) and the card as text."""
    from gpt.train.records import summary_writer

    writer = summary_writer(out / "tensorboard")
    for g in groups:
        for key in ("mean", "std", "p", "p_below"):
            if isinstance(g[key], float) and not math.isnan(g[key]):
                writer.add_scalar(f"probes/{g['metric']}/{g['design']}/{key}", g[key], 0)
    writer.add_text("probes/card", text, 0)
    writer.close()


def validity(groups: list[dict[str, Any]], arena: str, out: Path) -> str:
    """The rank correlation of the composite with the arena's bits per byte (gpt.probes.validity), per slice:
    its section of the card, and probes_validity.csv."""
    from gpt.probes import validity as check

    composite = {g["design"]: g["mean"] for g in groups if g["metric"] == COMPOSITE}
    found = check.correlate(composite, check.read_arena(arena))
    write_csv(out / "probes_validity.csv", check.COLUMNS, found, "the probes' validity check")
    return check.section(found, str(check.summary_path(arena)))


def write_reports(out: Path, heading: str, rows: list[dict[str, Any]], baseline: str, alpha: float,
                  log: Callable[[str], None], arena: str | None = None,
                  lower: frozenset[str] | set[str] = frozenset()) -> list[dict[str, Any]]:
    """Every output in ``out`` and the card on the console (with ``arena``, an arena's out_dir or summary: the
    validity section and probes_validity.csv; ``lower``: the metrics better below, bits per byte); returns the
    summary rows."""
    make_out_dir(out)
    lower = frozenset(lower)
    groups = summarise(rows, baseline, alpha, lower) if rows else []
    text = f"{heading}\n\n{card(groups, lower) if groups else 'No run finished.'}\n"
    if arena is not None and groups:
        text += f"\n{validity(groups, arena, out)}\n"
    atomic_write(out / "probes.md", lambda f: f.write(text.encode()), what="the probe card")
    write_csv(out / "probes.csv", PER_SEED, per_seed(rows), "the probes' per-seed table")
    write_csv(out / "probes_summary.csv", SUMMARY, groups, "the probes' summary")
    from gpt.probes.plots import draw

    pictures = draw(out, groups)
    write_tensorboard(out, groups, text)
    log(f"\n{text}\nwritten: {out / 'probes.md'}, probes.csv, probes_summary.csv, "
        + "".join(f"{p}, " for p in pictures) + "tensorboard/")
    return groups
