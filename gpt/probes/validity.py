"""The battery's validity check (MAD's claim: small synthetic tasks predict how designs rank on real data): the
Spearman rank correlation, across the designs both measured, between each design's probe composite (mean over seeds)
and its held-out bits per byte from an arena run (``probes.arena``: its out_dir or its arena_summary.csv), one per
slice of the arena (e.g. each of its ``arena.sizes``), with a percentile bootstrap interval over designs.

A battery that predicts the arena's ranking gives a correlation near -1: the designs that score higher on the probes
reach lower bits per byte. The arena's summary is a file the user points at: it is read with limits and every field
it contributes is checked, naming the file, line and column.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from gpt.errors import UserError

SUMMARY_FILE = "arena_summary.csv"
MAX_BYTES = 16 << 20  # an arena's summary is a line per group: kilobytes
NEEDED = ("variant", "slice", "seeds", "val_bpb_mean")
RESAMPLES = 10_000
LEVEL = 0.95
MIN_DESIGNS = 3  # fewer and a rank correlation says nothing (two points always rank perfectly)
COLUMNS = ["slice", "designs", "rho", "low", "high", "resamples", "names"]


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1 along the last axis, tied values sharing the mean of their ranks (scipy's rankdata 'average')."""
    x = np.asarray(values, dtype=np.float64)
    less = (x[..., None, :] < x[..., :, None]).sum(-1)
    equal = (x[..., None, :] == x[..., :, None]).sum(-1)
    return less + (equal + 1) / 2.0


def spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho along the last axis: Pearson's correlation of the average ranks; NaN where either side is
    constant (its ranks have no spread, so no order to agree with)."""
    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(-1, keepdims=True), ry - ry.mean(-1, keepdims=True)
    spread = np.sqrt((rx * rx).sum(-1) * (ry * ry).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (rx * ry).sum(-1) / spread
    return np.where(spread > 0, rho, np.nan)


def bootstrap(x: np.ndarray, y: np.ndarray, resamples: int = RESAMPLES, level: float = LEVEL,
              seed: int = 0) -> tuple[float, float, int]:
    """The percentile bootstrap interval of rho at ``level``: designs drawn with replacement (x and y as pairs),
    ``resamples`` times from a fixed seed; a draw whose ranks are constant on a side has no rho and is left out.
    Returns (low, high, draws used)."""
    n = len(x)
    picks = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    rhos = spearman(np.asarray(x)[picks], np.asarray(y)[picks])
    rhos = rhos[~np.isnan(rhos)]
    if not len(rhos):
        return math.nan, math.nan, 0
    low, high = np.quantile(rhos, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high), len(rhos)


def summary_path(where: str) -> Path:
    """probes.arena: an arena's out_dir (its arena_summary.csv) or the file itself."""
    path = Path(where)
    return path / SUMMARY_FILE if path.is_dir() else path


def read_arena(where: str) -> dict[str, dict[str, float]]:
    """slice -> variant -> mean held-out bits per byte, from an arena's summary; groups without a finished seed are
    left out. A missing, oversized or malformed file is one UserError naming it (and the line and column)."""
    path = summary_path(where)
    hint = "probes.arena names an arena's out_dir or its arena_summary.csv (scripts/arena.py writes it)"
    try:
        if path.stat().st_size > MAX_BYTES:
            raise UserError(f"{path} holds more than {MAX_BYTES:,} bytes: not an arena's summary", hint=hint)
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise UserError(f"probes.arena: {path} cannot be read: {err.strerror or err}", hint=hint) from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text: not an arena's summary", hint=hint) from None
    rows = csv.DictReader(io.StringIO(text, newline=""))
    missing = [c for c in NEEDED if c not in (rows.fieldnames or [])]
    if missing:
        raise UserError(f"{path} has no column {missing[0]}: not an arena's summary", hint=hint)
    out: dict[str, dict[str, float]] = {}
    try:
        for row in rows:
            where_ = f"{path}, line {rows.line_num}"
            if None in row or any(row[c] is None for c in NEEDED):
                raise UserError(f"{where_} does not have one value per column", hint=hint)
            seeds, bpb = number(row["seeds"], where_, "seeds"), number(row["val_bpb_mean"], where_, "val_bpb_mean")
            if not math.isfinite(seeds) or seeds != int(seeds) or seeds < 0:
                raise UserError(f"{where_}: seeds must be a count, got {row['seeds']!r}", hint=hint)
            if seeds == 0:
                continue  # a group none of whose runs finished
            if not bpb > 0 or math.isinf(bpb):
                raise UserError(f"{where_}: val_bpb_mean must be a positive number, got {row['val_bpb_mean']!r}",
                                hint=hint)
            by_variant = out.setdefault(row["slice"], {})
            if row["variant"] in by_variant:
                raise UserError(f"{where_}: variant {row['variant']!r} appears twice in slice {row['slice']!r}",
                                hint=hint)
            by_variant[row["variant"]] = bpb
    except csv.Error as err:
        raise UserError(f"{path} is not a CSV file this project wrote: {err}", hint=hint) from None
    if not out:
        raise UserError(f"{path} holds no finished group", hint=hint)
    return out


def number(text: str, where: str, column: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{where}: {column} must be a number, got {text[:40]!r}") from None


def correlate(composite: dict[str, float], arena: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """One row per arena slice: the designs measured on both sides (in the card's order), rho and its interval
    (NaN below MIN_DESIGNS designs or when either side does not vary)."""
    out = []
    for slice_, bpb in arena.items():
        names = [d for d in composite if d in bpb and not math.isnan(composite[d])]
        row: dict[str, Any] = {"slice": slice_ or "base", "designs": len(names), "rho": math.nan, "low": math.nan,
                               "high": math.nan, "resamples": 0, "names": " ".join(names)}
        if len(names) >= MIN_DESIGNS:
            x, y = np.array([composite[d] for d in names]), np.array([bpb[d] for d in names])
            row["rho"] = float(spearman(x, y))
            row["low"], row["high"], row["resamples"] = bootstrap(x, y)
        out.append(row)
    return out


def section(rows: list[dict[str, Any]], where: str) -> str:
    """The card's validity section: a line per arena slice."""
    lines = [f"Validity: Spearman's rho between each design's composite (mean over seeds) and its held-out bits per "
             f"byte in {where}, across the designs both measured; {LEVEL:.0%} percentile bootstrap interval over "
             f"designs ({RESAMPLES:,} draws with replacement). Near -1: the probes rank the designs as the arena does.",
             ""]
    for r in rows:
        if math.isnan(r["rho"]):
            why = f"{r['designs']} designs in both, at least {MIN_DESIGNS} needed" \
                if r["designs"] < MIN_DESIGNS else "one side does not vary"
            lines.append(f"- {r['slice']}: no rho ({why})")
        else:
            lines.append(f"- {r['slice']}: rho {r['rho']:+.3f}, {LEVEL:.0%} interval [{r['low']:+.3f}, "
                         f"{r['high']:+.3f}] over {r['designs']} designs ({r['names']})")
    return "\n".join(lines)
