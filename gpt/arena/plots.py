"""The arena's pictures: arena_loss.png (validation loss against training tokens and seconds, the mean over seeds
with a band of one standard deviation), arena_flops.png (validation bits per byte against training FLOPs, one curve
per variant through its sizes) and arena_attention.png (each variant's last-layer attention on the same text)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpt.arena.stats import mean_std
from gpt.files import atomic_write


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, what: str) -> None:
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight"), what=what)
    pyplot().close(fig)


def seed_band(runs: list[dict[str, Any]], x: str) -> tuple[list[float], list[float], list[float]]:
    """(x, mean, std) of the validation loss over the seeds at each evaluation (runs share their steps)."""
    by_step: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        for i, point in enumerate(run.get("curve") or []):
            by_step.setdefault(i, []).append((point[x], point["val"]))
    xs, means, stds = [], [], []
    for i in sorted(by_step):
        values = by_step[i]
        mean, std = mean_std([v for _, v in values])
        xs.append(math.fsum(p for p, _ in values) / len(values))
        means.append(mean)
        stds.append(0.0 if math.isnan(std) else std)
    return xs, means, stds


def plot_loss(rows: list[dict[str, Any]], path: Path) -> bool:
    """Validation loss against training tokens (left) and seconds (right), one line and band per group."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("curve"):
            groups.setdefault(row["group"], []).append(row)
    plt = pyplot()
    fig, (by_tokens, by_seconds) = plt.subplots(1, 2, figsize=(12.5, 4.4), sharey=True)
    variants = list(dict.fromkeys(runs[0]["variant"] for runs in groups.values()))
    slices = list(dict.fromkeys(runs[0]["slice"] for runs in groups.values()))
    colours, styles = plt.rcParams["axes.prop_cycle"].by_key()["color"], ["-", "--", ":", "-."]
    for group, runs in groups.items():  # colour: the variant; line style: the slice of the grid
        colour = colours[variants.index(runs[0]["variant"]) % len(colours)]
        style = styles[slices.index(runs[0]["slice"]) % len(styles)]
        for ax, x in ((by_tokens, "tokens"), (by_seconds, "seconds")):
            xs, mean, std = seed_band(runs, x)
            ax.plot(xs, mean, style, marker="o", ms=3, color=colour, label=group if ax is by_tokens else None)
            ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=colour, alpha=0.15, linewidth=0)
    by_tokens.set(xlabel="training tokens", ylabel="validation loss (nats/token)", title="loss against tokens")
    by_seconds.set(xlabel="seconds (training and evaluations)", title="loss against wall-clock time")
    if groups:  # every variant failed: no line to name
        fig.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("mean over seeds, band: one standard deviation" if any(len(r) > 1 for r in groups.values())
                 else "", fontsize=9)
    fig.tight_layout()
    save(fig, path, "the arena's loss plot")
    return True


def plot_flops(groups: list[dict[str, Any]], path: Path) -> bool:
    """Mean bits per byte (error bars: std over seeds) against training FLOPs, one curve per variant and slice
    without the size, through its sizes. False (nothing written) without sizes or FLOPs counts."""
    lines: dict[str, list[dict[str, Any]]] = {}
    for g in groups:
        if g["size"] and g["seeds"] and not math.isnan(g["train_flops"]):
            key = g["variant"] + "".join(f"@{p}" for p in g["slice"].split("@") if p and p != g["size"])
            lines.setdefault(key, []).append(g)
    if not lines:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, points in lines.items():
        points.sort(key=lambda g: g["train_flops"])
        ax.errorbar([g["train_flops"] for g in points], [g["val_bpb_mean"] for g in points],
                    yerr=[0.0 if math.isnan(g["val_bpb_std"]) else g["val_bpb_std"] for g in points],
                    marker="o", ms=4, capsize=3, label=name)
    ax.set_xscale("log")
    ax.set(xlabel="training FLOPs (forward and backward, gpt.model.flops)", ylabel="validation bits per byte",
           title="bits per byte against compute, one point per size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, "the arena's FLOPs curves")
    return True


def plot_attention(rows: list[dict[str, Any]], path: Path) -> bool:
    """One panel per group (its first seed; four to a row): the last layer's attention weights, heads averaged, on
    the same tokens; one colour scale (square root, so that small weights show; negative ones as 0). False
    (nothing written) when no run finished."""
    from matplotlib.colors import PowerNorm

    shown = list({row["group"]: row for row in reversed(rows) if row.get("attention")}.values())[::-1]
    if not shown:
        return False
    plt = pyplot()
    columns = min(4, len(shown))
    rows_n = -(-len(shown) // columns)
    fig, axes = plt.subplots(rows_n, columns, figsize=(2.8 * columns + 0.4, 2.9 * rows_n + 0.5), squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.axis("off")
    for ax, row in zip(axes.flat, shown):
        ax.imshow(row["attention"], cmap="viridis", norm=PowerNorm(0.5, vmin=0.0, vmax=1.0))
        ax.set_title(row["group"], fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][0].set_ylabel("query (token of the val text)", fontsize=7)
    axes[0][0].set_xlabel("key", fontsize=7)
    fig.suptitle("last layer's attention, heads averaged, on the first validation tokens (sqrt scale)", fontsize=9)
    fig.tight_layout()
    save(fig, path, "the arena's attention picture")
    return True


def draw(out: Path, rows: list[dict[str, Any]], groups: list[dict[str, Any]]) -> list[str]:
    """Every picture that has something to show; the names of those written."""
    drawn = [("arena_loss.png", plot_loss(rows, out / "arena_loss.png")),
             ("arena_flops.png", plot_flops(groups, out / "arena_flops.png")),
             ("arena_attention.png", plot_attention(rows, out / "arena_attention.png"))]
    return [name for name, written in drawn if written]
