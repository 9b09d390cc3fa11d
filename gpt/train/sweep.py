"""Comparing the runs of a Hydra multirun: one table at the end of the sweep (also written to summary.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from gpt.errors import UserError
from gpt.train.records import SUMMARY_FILE
from gpt.validate import Record, read_json

NUMBERS = ("final_train_loss", "final_val_loss", "final_val_ppl", "final_val_bpb", "tokens_per_sec",
           "peak_memory_bytes", "wall_s")  # the summary fields the table shows, each a number or null
COLUMNS = ("run", "overrides", "train loss", "val loss", "val ppl", "val bpb", "tokens/s", "peak memory", "wall time")


def _mib(n: int | None) -> str:
    return "-" if not n else f"{n / 2**20:,.0f} MiB"


def _loss(x: Any) -> str:
    return _number(x, ".4f")


def _number(x: Any, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """The summary.json of every job folder under a sweep directory, in job order."""
    rows = []
    for path in sorted(sweep_dir.glob(f"*/{SUMMARY_FILE}"), key=lambda p: (len(p.parent.name), p.parent.name)):
        try:
            record = Record(read_json(path), str(path))
            for key in NUMBERS:
                record.number(key, None)
            record.list("overrides", [], of=str)
            record.bool("interrupted", False)
        except UserError as err:  # a damaged or foreign summary: the table goes on without it
            print(f"warning: left out of the sweep table: {err}")
            continue
        rows.append({**record.value, "run": path.parent.name})
    return rows


def table(rows: list[dict[str, Any]], common: set[str] | None = None) -> str:
    """A Markdown table of the runs; overrides shared by every run are left out of each row."""
    if common is None:
        sets = [set(r.get("overrides", [])) for r in rows]
        common = set.intersection(*sets) if sets else set()
    lines = [
        [
            r["run"],
            " ".join(o for o in r.get("overrides", []) if o not in common) or "-",
            _loss(r.get("final_train_loss")),
            _loss(r.get("final_val_loss")),
            _number(r.get("final_val_ppl"), ".2f"),
            _loss(r.get("final_val_bpb")),
            f"{r.get('tokens_per_sec') or 0:,.0f}",
            _mib(r.get("peak_memory_bytes")),
            f"{r.get('wall_s') or 0:.1f}s" + (" (interrupted)" if r.get("interrupted") else ""),
        ]
        for r in rows
    ]
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(COLUMNS)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [fmt(COLUMNS), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(out + [fmt(line) for line in lines])


class SweepSummary(Callback):
    """Hydra callback: after a multirun, print and save one table comparing its jobs."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = collect(sweep_dir)
        if not rows:
            print(f"sweep {sweep_dir}: no finished runs to compare")
            return
        text = table(rows)
        memory_note = ""
        if any(not str(r.get("device", "")).startswith("cuda") for r in rows):
            memory_note = ("\npeak memory on CPU is the process's peak resident size; jobs of one sweep share a "
                           "process, so it includes the jobs before.")
        (sweep_dir / "summary.md").write_text(text + "\n" + memory_note.strip() + "\n")
        print(f"\nsweep {sweep_dir} ({len(rows)} runs):\n{text}{memory_note}\n"
              f"side by side in TensorBoard: tensorboard --logdir {sweep_dir}")
