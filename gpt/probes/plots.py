"""The card's pictures, from its summary: probes_mqar.png (MQAR accuracy by number of key-value pairs),
probes_passkey.png (passkey retrieval by length, in multiples of the training context) and probes_corpus.png (the
corpus's held-out bits per byte by length, Press et al.'s Figure 1), one line per design, the mean over seeds with a
band of one standard deviation. Each is drawn only when its task was scored at two or more points."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from gpt.arena.plots import pyplot, save

ACCURACY = ("accuracy (answer positions)", (0, 1.02))
FAMILIES = {  # file -> (metric name pattern with its x, x-axis label, title, (y-axis label, its limits))
    "probes_mqar.png": (r"mqar@(\d+)", "key-value pairs", "MQAR: accuracy by number of pairs", ACCURACY),
    "probes_passkey.png": (r"passkey@(\d+)x", "length (x the training context)", "Passkey retrieval by length",
                           ACCURACY),
    "probes_corpus.png": (r"corpus@(\d+)x", "length (x the training context)", "The corpus: loss by length",
                          ("held-out bits per byte", None)),
}


def series(groups: list[dict[str, Any]], pattern: str) -> dict[str, list[tuple[int, float, float]]]:
    """design -> [(x, mean, std)] over the metrics matching ``pattern``, x ascending; designs with no seed left out."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for g in groups:
        found = re.fullmatch(pattern, g["metric"])
        if found and g["seeds"]:
            std = 0.0 if math.isnan(g["std"]) else g["std"]
            out.setdefault(g["design"], []).append((int(found.group(1)), g["mean"], std))
    return {d: sorted(points) for d, points in out.items()}


def draw(out: Path, groups: list[dict[str, Any]]) -> list[str]:
    """Each picture whose task has two or more points, in ``out``; returns the names written."""
    written = []
    for name, (pattern, label, title, (ylabel, ylim)) in FAMILIES.items():
        lines = series(groups, pattern)
        if not lines or max(len(points) for points in lines.values()) < 2:
            continue
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for design, points in lines.items():
            xs, means, stds = zip(*points)
            ax.plot(xs, means, marker="o", label=design)
            ax.fill_between(xs, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                            alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({x for points in lines.values() for x, _, _ in points}))
        ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
        ax.set(xlabel=label, ylabel=ylabel, title=title)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, out / name, f"the card's picture {name}")
        written.append(name)
    return written
