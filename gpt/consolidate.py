"""python -m gpt.consolidate RUN_DIR: a train.fsdp=true run's sharded checkpoint as one ckpt.pt.

The file holds whole tensors (model, and the optimizer keyed by parameter name) and the whole training state,
so it resumes with or without FSDP, with any number of processes, and can be shared as one file. Generate,
export and evaluation need no consolidation: they read the sharded folder directly.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpt import checkpoint
from gpt import sharded_checkpoint as sharded
from gpt.cli import bring_designs, report_user_errors
from gpt.errors import UserError
from gpt.files import sigterm_interrupts


def consolidate(run_dir: Path) -> Path:
    """Write run_dir's committed sharded checkpoint as run_dir/ckpt.pt; resume then continues from it."""
    folder = sharded.committed(run_dir)
    if folder is None:
        raise UserError(f"{run_dir} holds no committed sharded checkpoint "
                        f"({sharded.ROOT}/{sharded.POINTER} is missing)",
                        hint="point at the run directory of a train.fsdp=true run that saved at least once")
    out = run_dir / checkpoint.LATEST
    checkpoint.save(sharded.load_full(folder, optimizer=True), out)
    return out


def main(argv: list[str]) -> None:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m gpt.consolidate RUN_DIR  (writes RUN_DIR/ckpt.pt from RUN_DIR/ckpt.dcp)",
              file=sys.stderr)
        raise SystemExit(2)
    bring_designs()  # the checkpoint's config reads the design registry: GPT_DESIGNS' files first
    with sigterm_interrupts():  # SIGTERM stops like Ctrl-C: no partial ckpt.pt, exit 130
        out = report_user_errors(lambda: consolidate(Path(argv[0])))
    print(f"wrote {out}: it resumes with or without train.fsdp; generate, export and eval read it")


if __name__ == "__main__":
    main(sys.argv[1:])
