"""The arena's outputs in out_dir: arena.md (the leaderboard), arena.csv (one row per variant, every figure),
arena_curves.csv (the loss curves), arena_loss.png (validation loss against training tokens and seconds) and
arena_attention.png (each variant's last-layer attention on the same validation text, side by side)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpt.bench.report import markdown_table
from gpt.errors import UserError
from gpt.files import atomic_write

COLUMNS = ["variant", "params", "val_loss", "val_bpb", "tokens", "tokens_per_s", "peak_mib", "kv_bytes_per_token",
           "decode_tok_s", "train_s", "val_tokens", "steps", "spec", "error"]
HEADERS = ["rank", "variant", "params", "val loss", "val bits/byte", "train tok/s", "peak MiB", "KV bytes/token",
           "decode tok/s"]


def leaderboard(rows: list[dict[str, Any]]) -> str:
    """The markdown table, in the rows' order (best bits per byte first); failed variants last, with the reason."""
    table = []
    for rank, row in enumerate(rows, 1):
        if "error" in row:
            table.append(["-", row["variant"], "failed: " + row["error"], *[""] * (len(HEADERS) - 3)])
            continue
        table.append([rank, row["variant"], f"{row['params'] / 1e6:.3f}M", f"{row['val_loss']:.4f}",
                      f"{row['val_bpb']:.4f}", f"{row['tokens_per_s']:,.0f}", f"{row['peak_mib']:,.0f}",
                      f"{row['kv_bytes_per_token']:,.0f}", f"{row['decode_tok_s']:,.0f}"])
    return markdown_table(HEADERS, table)


def write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]], what: str) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, lambda f: f.write(buffer.getvalue().encode()), what=what)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Validation loss against training tokens (left) and seconds (right), one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_tokens, by_seconds) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for row in rows:
        curve = row.get("curve") or []
        if curve:
            by_tokens.plot([p["tokens"] for p in curve], [p["val"] for p in curve], marker="o", ms=3,
                           label=row["variant"])
            by_seconds.plot([p["seconds"] for p in curve], [p["val"] for p in curve], marker="o", ms=3)
    by_tokens.set(xlabel="training tokens", ylabel="validation loss (nats/token)", title="loss against tokens")
    by_seconds.set(xlabel="seconds (training and evaluations)", title="loss against wall-clock time")
    if any(row.get("curve") for row in rows):  # every variant failed: no line to name
        by_tokens.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), what="the arena's loss plot")
    plt.close(fig)


def plot_attention(rows: list[dict[str, Any]], path: Path) -> bool:
    """One panel per variant (four to a row): its last layer's attention weights, heads averaged, on the same
    tokens; one colour scale for all (a square-root scale, so that small weights show; negative ones as 0).
    False (nothing written) when no variant finished."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    shown = [row for row in rows if row.get("attention")]
    if not shown:
        return False
    columns = min(4, len(shown))
    rows_n = -(-len(shown) // columns)
    fig, axes = plt.subplots(rows_n, columns, figsize=(2.8 * columns + 0.4, 2.9 * rows_n + 0.5), squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.axis("off")
    for ax, row in zip(axes.flat, shown):
        ax.imshow(row["attention"], cmap="viridis", norm=PowerNorm(0.5, vmin=0.0, vmax=1.0))
        ax.set_title(row["variant"], fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][0].set_ylabel("query (token of the val text)", fontsize=7)
    axes[0][0].set_xlabel("key", fontsize=7)
    fig.suptitle("last layer's attention, heads averaged, on the first validation tokens (sqrt scale)", fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), what="the arena's attention picture")
    plt.close(fig)
    return True


def make_out_dir(out: Path) -> None:
    """Create the arena's out_dir, or one UserError (a read-only or full disk) before any variant trains."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"could not create out_dir={out}: {err.strerror or err}") from None


def write_reports(out: Path, heading: str, rows: list[dict[str, Any]], log: Callable[[str], None]) -> None:
    """arena.md (heading, then the leaderboard), arena.csv, arena_curves.csv and arena_loss.png in ``out``;
    the leaderboard on the console too."""
    make_out_dir(out)
    text = f"{heading}\n\n{leaderboard(rows)}\n"
    atomic_write(out / "arena.md", lambda f: f.write(text.encode()), what="the arena's leaderboard")
    write_csv(out / "arena.csv", COLUMNS, rows, "the arena's table")
    points = [{"variant": r["variant"], **p} for r in rows for p in r.get("curve") or []]
    write_csv(out / "arena_curves.csv", ["variant", "tokens", "seconds", "train", "val"], points, "the loss curves")
    plot(rows, out / "arena_loss.png")
    drawn = plot_attention(rows, out / "arena_attention.png")
    log(f"\n{text}\nwritten: {out / 'arena.md'}, arena.csv, arena_curves.csv, arena_loss.png"
        + (", arena_attention.png" if drawn else ""))
