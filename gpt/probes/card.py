"""The card of scripts/probe.py: every cell run (gpt.probes.cells), then the reports (gpt.probes.report)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpt.probes.corpus import open_corpus
from gpt.probes.probe import QUICK_MODEL, ProbeConfig, baseline, effective, plan
from gpt.probes.registry import build


def run(cfg: ProbeConfig, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every cell not finished already (gpt.probes.cells), then the card (gpt.probes.report). A stop signal lets
    the running cells' step finish, records nothing of them, writes the card of what finished and exits 130."""
    from gpt.probes import cells as probe_cells
    from gpt.probes.report import write_reports

    data = open_corpus(cfg.data) if "corpus" in effective(cfg.probes).tasks else None
    cells = plan(cfg, data)
    rows = probe_cells.run_cells(cfg, cells, log, data)
    lower = {m for t in build(effective(cfg.probes).tasks, effective(cfg.probes), data) if t.lower_is_better
             for m in t.metrics()}
    groups = write_reports(Path(cfg.out_dir), header(cfg, data), rows, baseline(cfg), cfg.probes.alpha, log,
                           cfg.probes.arena, lower)
    unfinished = len(cells) - sum("metrics" in r for r in rows)
    if unfinished:
        raise KeyboardInterrupt(f"interrupted: {unfinished} runs unfinished; run the same command again to resume")
    return groups


def header(cfg: ProbeConfig, data=None) -> str:
    """What every run shared: model, training, sweep, seeds, and the tests (the corpus task's: which text)."""
    s = effective(cfg.probes)
    m = {**{k: getattr(cfg.model, k) for k in ("n_layer", "n_head", "n_embd")},
         **(QUICK_MODEL if cfg.probes.quick else {})}
    seeds = f"{s.seeds} seeds ({cfg.seed} to {cfg.seed + s.seeds - 1})" if s.seeds > 1 else f"seed {cfg.seed}"
    corpus, accuracy = "corpus" in s.tasks, any(t != "corpus" for t in s.tasks)
    kept = "accuracy" if not corpus else "bits per byte" if not accuracy else "score (accuracy; corpus: bits per byte)"
    tests = [f"accuracy on the answer positions of {s.examples} test sequences"] if accuracy else []
    if corpus:
        tests.append(f"corpus@kx: held-out bits per byte of {s.examples} windows of "
                     f"{data.dir if data is not None else cfg.data.name} at k times the context (trained at 1x), "
                     "lower is better" + (", not in the composite" if accuracy else ""))
    return (f"Model: {m['n_layer']} layers, {m['n_head']} heads, {m['n_embd']} wide, each design's fields over it; "
            f"context {s.seq_len}" + (f" (passkey scored at {', '.join(f'{k}x' for k in s.passkey_lengths)})"
                                      if "passkey" in s.tasks else "") + f"; {s.steps} "
            f"AdamW steps of {s.batch_size} sequences at each learning rate of {s.learning_rates}, the best by "
            f"validation {kept} kept; {seeds}; {'; '.join(tests)}. "
            f"p: Welch's one-sided t-test of each design's score against {baseline(cfg)}'s over the seeds, in the "
            f"direction of the verdict (n.s.: better); better or worse at alpha = {s.alpha:g}, else n.s.")
