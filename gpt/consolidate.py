"""``python -m gpt.consolidate RUN_DIR``: write a train.fsdp=true run's sharded checkpoint as RUN_DIR/ckpt.pt (the
work is gpt.weights.consolidate's; this is the command, under the name it has always had)."""

from __future__ import annotations

import sys
from pathlib import Path

from gpt.cli import bring_designs, report_user_errors
from gpt.files import sigterm_interrupts
from gpt.weights.consolidate import consolidate


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
