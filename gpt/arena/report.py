"""The arena's outputs in out_dir: arena.md (the leaderboard: one ranked table per slice of the grid), arena.csv
(one row per run, every seed: every figure), arena_summary.csv (one row per variant: mean, std, p over the seeds),
arena_curves.csv (the loss curves), the pictures of gpt.arena.plots, and the same summary numbers as
TensorBoard scalars (out_dir/tensorboard)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpt.arena.stats import mean_std, verdict, welch_less
from gpt.bench.report import markdown_table
from gpt.errors import UserError
from gpt.files import atomic_write

COLUMNS = ["group", "variant", "slice", "size", "seed", "params", "flops_per_token", "train_flops", "val_loss",
           "val_bpb", "tokens", "tokens_per_s", "peak_mib", "kv_bytes_per_token", "decode_tok_s", "train_s",
           "val_tokens", "steps", "spec", "error"]
SUMMARY = ["group", "variant", "slice", "size", "seeds", "failed", "val_bpb_mean", "val_bpb_std", "val_loss_mean",
           "delta_bpb", "p", "verdict", "params", "flops_per_token", "train_flops", "tokens", "kv_bytes_per_token",
           "tokens_per_s", "peak_mib", "decode_tok_s"]
HEADERS = ["rank", "variant", "params", "FLOPs/token", "val bits/byte", "vs baseline", "p", "", "train tok/s",
           "peak MiB", "KV bytes/token", "decode tok/s"]


def mean_of(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return math.fsum(values) / len(values) if values else math.nan


def summarise(rows: list[dict[str, Any]], baseline: str, alpha: float) -> list[dict[str, Any]]:
    """One row per group (variant in its slice), in the order of the runs: the mean and sample std of bits per byte
    over its finished seeds, the difference from the slice's baseline and the one-sided Welch p of being lower."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    bpb = {g: [r["val_bpb"] for r in rs if "error" not in r] for g, rs in groups.items()}
    base = {rs[0]["slice"]: g for g, rs in groups.items() if rs[0]["variant"] == baseline}
    summary = []
    for group, runs in groups.items():
        ok, first = [r for r in runs if "error" not in r], runs[0]
        mean, std = mean_std(bpb[group])
        reference = base.get(first["slice"])
        p = welch_less(bpb[group], bpb[reference]) if reference and reference != group else math.nan
        delta = mean - mean_std(bpb[reference])[0] if reference and reference != group else math.nan
        summary.append({
            "group": group, "variant": first["variant"], "slice": first["slice"], "size": first["size"],
            "seeds": len(ok), "failed": len(runs) - len(ok), "error": next((r["error"] for r in runs if "error" in r),
                                                                           None),
            "val_bpb_mean": mean, "val_bpb_std": std, "val_loss_mean": mean_of(ok, "val_loss"), "delta_bpb": delta,
            "p": p, "verdict": "baseline" if reference == group else verdict(p, alpha),
            "params": first.get("params", next((r.get("params") for r in ok), None)),
            "flops_per_token": first.get("flops_per_token"), "train_flops": mean_of(ok, "train_flops"),
            **{k: mean_of(ok, k) for k in ("tokens", "kv_bytes_per_token", "tokens_per_s", "decode_tok_s")},
            "peak_mib": max((r["peak_mib"] for r in ok), default=math.nan),
        })
    return summary


def number(value: Any, spec: str, empty: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return empty
    return format(value, spec)


def leaderboard(groups: list[dict[str, Any]]) -> str:
    """The markdown table of one slice, best mean bits per byte first; variants without a finished run last."""
    ranked = sorted(groups, key=lambda g: (g["seeds"] == 0, g["val_bpb_mean"] if g["seeds"] else 0))
    table = []
    for rank, g in enumerate(ranked, 1):
        if not g["seeds"]:
            table.append(["-", g["variant"], "failed: " + str(g["error"]), *[""] * (len(HEADERS) - 3)])
            continue
        bpb = f"{g['val_bpb_mean']:.4f}" + (f" ± {g['val_bpb_std']:.4f}" if g["seeds"] > 1 else "")
        bpb += f" ({g['failed']} {'unfinished' if str(g['error']).startswith('interrupted') else 'failed'})" \
            if g["failed"] else ""
        table.append([rank, g["variant"], number(g["params"] and g["params"] / 1e6, ".3f") + "M",
                      number(g["flops_per_token"], ",.0f"), bpb, number(g["delta_bpb"], "+.4f"),
                      number(g["p"], ".3g"), "" if g["verdict"] in ("n/a", "baseline") else g["verdict"],
                      number(g["tokens_per_s"], ",.0f"), number(g["peak_mib"], ",.0f"),
                      number(g["kv_bytes_per_token"], ",.0f"), number(g["decode_tok_s"], ",.0f")])
    return markdown_table(HEADERS, table)


def leaderboards(groups: list[dict[str, Any]]) -> str:
    """One table per slice of the grid (recipe, overrides, size), each under its name when there are several."""
    slices = list(dict.fromkeys(g["slice"] for g in groups))
    if slices == [""]:
        return leaderboard(groups)
    return "\n\n".join(f"**{s or 'base'}**\n\n" + leaderboard([g for g in groups if g["slice"] == s]) for s in slices)


def write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]], what: str) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, lambda f: f.write(buffer.getvalue().encode()), what=what)


def write_tensorboard(out: Path, groups: list[dict[str, Any]], text: str) -> None:
    """The summary as scalars, one run per group (step 0), and the leaderboard as text."""
    from gpt.train.records import summary_writer

    writer = summary_writer(out / "tensorboard")
    for g in groups:
        for key in ("val_bpb_mean", "val_bpb_std", "p", "delta_bpb", "train_flops", "tokens_per_s", "peak_mib"):
            value = g.get(key)
            if isinstance(value, (int, float)) and not math.isnan(value):
                writer.add_scalar(f"arena/{g['group']}/{key}", value, 0)
    writer.add_text("arena/leaderboard", text, 0)
    writer.close()


def make_out_dir(out: Path) -> None:
    """Create the arena's out_dir, or one UserError (a read-only or full disk) before any variant trains."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"could not create out_dir={out}: {err.strerror or err}") from None


def write_reports(out: Path, heading: str, rows: list[dict[str, Any]], settings: Any,
                  log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every output in ``out``, and the leaderboard on the console; returns the summary rows."""
    from gpt.arena import plots as arena_plots
    from gpt.arena.plan import baseline_spec, variant_name

    make_out_dir(out)
    groups = summarise(rows, variant_name(baseline_spec(settings)), settings.alpha)
    text = f"{heading}\n\n{leaderboards(groups)}\n"
    atomic_write(out / "arena.md", lambda f: f.write(text.encode()), what="the arena's leaderboard")
    write_csv(out / "arena.csv", COLUMNS, rows, "the arena's per-seed table")
    write_csv(out / "arena_summary.csv", SUMMARY, groups, "the arena's summary")
    points = [{"group": r["group"], "seed": r["seed"], **p} for r in rows for p in r.get("curve") or []]
    write_csv(out / "arena_curves.csv", ["group", "seed", "tokens", "seconds", "train", "val"], points,
              "the loss curves")
    written = arena_plots.draw(out, rows, groups)
    write_tensorboard(out, groups, text)
    log(f"\n{text}\nwritten: {out / 'arena.md'}, arena.csv, arena_summary.csv, arena_curves.csv, "
        + ", ".join(written) + ", tensorboard/")
    return groups
