"""A train.fsdp=true run's sharded checkpoint as one ckpt.pt (the command: python -m gpt.consolidate RUN_DIR).

The file holds whole tensors (model, and the optimizer keyed by parameter name) and the whole training state,
so it resumes with or without FSDP, with any number of processes, and can be shared as one file. Generate,
export and evaluation need no consolidation: they read the sharded folder directly.
"""

from __future__ import annotations

from pathlib import Path

from gpt.errors import UserError
from gpt.weights import checkpoint, sharded


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
